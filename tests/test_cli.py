"""The `serrano` command line: the report, and bad options refused before simulation."""

from __future__ import annotations

import json

import pytest

from rtl.tensor_core import TensorCore
from tb.cli import main
from tb.gemm_run import simulate_gemm
from tb.harness import StreamHarness


def test_sim_runs_attention_on_a_tile_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["sim", "--workload", "tiny", "--layer", "0", "--prefill", "6", "--context",
                 "9", "--steps", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PASS: all" in text and "bit-exact with golden.attention" in text
    assert "prefill @6" in text and "decode @10" in text and "decode @11" in text
    assert "bound" in text and "phases: GEMM" in text
    figures = json.loads(out.read_text())
    assert figures["passed"] is True
    assert [p["context"] for p in figures["phases"]] == [6, 10, 11]
    assert figures["metrics"]["attention__decode__bound_ratio"] > 1.0


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--workload", "llama"], "unknown workload 'llama'"),
        (["--prefill", "-1"], "non-negative"),
        (["--stall", "2"], "probability"),
    ],
)
def test_sim_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_sim_refuses_a_layer_the_workload_lacks(capsys):
    assert main(["sim", "--workload", "tiny", "--layer", "2"]) == 2
    assert "layers 0..1" in capsys.readouterr().err


def test_gemm_reports_pass_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["gemm", "--array", "2", "--m", "3", "--k", "5", "--p", "4", "--stall", "0.25",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PASS: all 12 outputs bit-exact" in text
    assert "utilisation" in text and "cycles/s" in text
    figures = json.loads(out.read_text())
    assert figures["passed"] is True and figures["macs"] == 3 * 5 * 4


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--array", "40"], "array size must be 2..32"),
        (["--array", "1"], "array size must be 2..32"),
        (["--m", "0"], "positive integer"),
        (["--idle", "1.0"], "probability"),
        (["--sim", "modelsim"], "invalid choice"),
    ],
)
def test_gemm_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["gemm", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["synthesize"])
    assert "invalid choice" in capsys.readouterr().err


def test_gemm_shapes_are_checked_before_simulation():
    with pytest.raises(ValueError, match="positive integer"):
        simulate_gemm(4, 0, 3, 3)
    with pytest.raises(ValueError, match="cannot hold"):
        simulate_gemm(4, 64, 64, 64, depth=16)


def test_harness_needs_a_depth_for_every_stream():
    with pytest.raises(ValueError, match="missing \\['c'\\]"):
        StreamHarness(TensorCore(2), {"a": 8, "b": 8})
    with pytest.raises(ValueError, match="positive integer"):
        StreamHarness(TensorCore(2), {"a": 8, "b": 0, "c": 8})
