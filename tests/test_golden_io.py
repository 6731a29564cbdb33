"""Workload files and the python -m golden CLI."""

import json

import numpy as np
import pytest

from golden.__main__ import main
from golden.expected import compute_expected
from golden.io import (
    compare,
    load_expected,
    load_workload,
    save_expected,
    save_outputs,
    save_workload,
)
from golden.workloads import WORKLOADS, generate


def test_generate_is_deterministic():
    a, b = generate("tiny"), generate("tiny")
    for name in a.tensors:
        np.testing.assert_array_equal(a.tensors[name], b.tensors[name])
    assert not np.array_equal(generate("tiny", seed=1).tensors["moe.x"], a.tensors["moe.x"])
    assert set(WORKLOADS) == {"tiny", "gpt-oss", "deepseek-r1", "kimi-k2"}


def test_save_load_roundtrip_and_expected(tmp_path):
    wl = generate("tiny")
    save_workload(wl, tmp_path)
    back = load_workload(tmp_path)
    assert back.config == wl.config
    for name, array in wl.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], array)
        assert back.tensors[name].dtype == array.dtype
    want = compute_expected(wl)
    got = compute_expected(back)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_loader_rejects_tampered_files(tmp_path):
    save_workload(generate("tiny"), tmp_path)
    np.save(tmp_path / "moe.x.npy", np.zeros((2, 2), np.int8))
    with pytest.raises(ValueError, match="tensor moe.x"):
        load_workload(tmp_path)
    with pytest.raises(ValueError, match="no manifest.json"):
        load_workload(tmp_path / "nowhere")


def test_cli_expected_and_compare(tmp_path, capsys):
    wl_dir = tmp_path / "wl"
    assert main(["generate", "tiny", str(wl_dir), "--contexts", "1,9"]) == 0
    capsys.readouterr()
    assert main(["expected", str(wl_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["attn0.decode.cosine"] >= 0.999
    expected = load_expected(wl_dir)
    assert expected["attn0.decode.out"].shape[0] == 2
    # a dump identical to the expected outputs passes, one flipped element fails
    dump = tmp_path / "dump"
    dump.mkdir()
    for name, array in expected.items():
        np.save(dump / f"{name}.npy", array)
    assert main(["compare", str(wl_dir), str(dump)]) == 0
    bad = expected["moe.out"].copy()
    bad[0, 0] ^= 1
    np.save(dump / "moe.out.npy", bad)
    assert compare(expected, dump)["moe.out"] == 1
    assert main(["compare", str(wl_dir), str(dump)]) == 1


def test_cli_help_and_list(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "generate" in capsys.readouterr().out
    assert main(["list"]) == 0
    assert "kimi-k2" in capsys.readouterr().out


def _damage(root, how):
    """Break a saved workload in one way."""
    if how == "manifest-truncated":
        text = (root / "manifest.json").read_text()
        (root / "manifest.json").write_text(text[:len(text) // 2])
    elif how == "manifest-not-object":
        (root / "manifest.json").write_text("[1, 2]")
    elif how == "manifest-without-tensors":
        manifest = json.loads((root / "manifest.json").read_text())
        del manifest["tensors"]
        (root / "manifest.json").write_text(json.dumps(manifest))
    elif how == "scale-missing":
        manifest = json.loads((root / "manifest.json").read_text())
        del manifest["scales"]["attn1"]["out"]
        (root / "manifest.json").write_text(json.dumps(manifest))
    elif how == "zero-byte-npy":
        (root / "moe.x.npy").write_bytes(b"")
    elif how == "pickled-npy":
        np.save(root / "moe.x.npy", np.array([None], dtype=object), allow_pickle=True)
    elif how == "wrong-shape":
        np.save(root / "moe.x.npy", np.zeros((2, 2), np.int8))
    elif how == "nan-input":
        sinks = np.load(root / "attn0.sinks.npy")
        sinks[1] = np.nan
        np.save(root / "attn0.sinks.npy", sinks)
    elif how == "no-directory":
        import shutil

        shutil.rmtree(root)


@pytest.mark.parametrize("how", ["manifest-truncated", "manifest-not-object",
                                 "manifest-without-tensors", "scale-missing", "zero-byte-npy",
                                 "pickled-npy", "wrong-shape", "nan-input", "no-directory"])
def test_cli_refuses_a_bad_workload_in_one_line(tmp_path, capsys, how):
    """Every damaged input is one line on stderr naming what is wrong, exit 2, and the
    directory is left as it was."""
    root = tmp_path / "wl"
    save_workload(generate("tiny"), root)
    _damage(root, how)
    before = (root / "manifest.json").read_text() if root.exists() else None
    assert main(["expected", str(root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m golden expected: ") and "\n" not in err, err
    assert "Traceback" not in err
    after = (root / "manifest.json").read_text() if root.exists() else None
    assert after == before


def test_cli_refuses_bad_options_and_outputs(tmp_path, capsys):
    assert main(["generate", "tiny", str(tmp_path / "a"), "--seed", "-1"]) == 2
    assert "seed must be >= 0" in capsys.readouterr().err
    root = tmp_path / "wl"
    assert main(["generate", "tiny", str(root)]) == 0
    assert main(["compare", str(root), str(tmp_path)]) == 2  # nothing computed yet
    assert "run `expected` first" in capsys.readouterr().err
    assert main(["expected", str(root)]) == 0
    dump = tmp_path / "dump"
    expected = load_expected(root)
    save_outputs(dump, {name: (a.astype(np.int32) if name == "moe.out" else a)
                        for name, a in expected.items()})
    assert main(["compare", str(root), str(dump)]) == 2  # the right values, the wrong dtype
    assert "int32" in capsys.readouterr().err
    assert main(["compare", str(root), str(tmp_path / "nowhere")]) == 2


def test_expected_on_a_dump_keeps_its_golden_outputs(tmp_path):
    """A dump's manifest lists the golden outputs of the chip's jobs; computing the
    workload's own expected outputs adds to it and drops nothing."""
    root = tmp_path / "seq0"
    save_workload(generate("tiny"), root)
    job = np.arange(6, dtype=np.int8).reshape(2, 3)
    save_expected(root, {"r00.prefill.ctx5.kvhead0.out": job})
    assert main(["expected", str(root)]) == 0
    expected = load_expected(root)
    np.testing.assert_array_equal(expected["r00.prefill.ctx5.kvhead0.out"], job)
    assert "attn0.prefill.out" in expected
    assert not (root / "manifest.json.partial").exists()


def test_readme_golden_commands_run(tmp_path, capsys, monkeypatch):
    """Each `python -m golden` line of the README runs as written (paths under build/
    moved into a temporary folder; the dump group a sim would write is made from the
    workload's own expected outputs)."""
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    lines = re.findall(r"^\.venv/bin/python -m golden (.+?)(?:\s+#.*)?$", readme, re.M)
    assert [line.split()[0] for line in lines] == ["list", "generate", "expected", "compare"]
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line)
        if argv[0] == "compare":  # what `serrano sim --dump build/dump` leaves for it
            group = Path(argv[1])
            assert main(["generate", "tiny", str(group)]) == 0
            assert main(["expected", str(group)]) == 0
            save_outputs(Path(argv[2]), load_expected(group))
        assert main(argv) == 0, line
    capsys.readouterr()
