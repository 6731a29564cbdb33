"""Workload files and the python -m golden CLI."""

import json

import numpy as np
import pytest

from golden.__main__ import main
from golden.expected import compute_expected
from golden.io import compare, load_expected, load_workload, save_workload
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
