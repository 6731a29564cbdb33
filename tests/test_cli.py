"""The `serrano` command line: the report, and bad options refused before simulation."""

from __future__ import annotations

import json

import pytest

from rtl.tensor_core import TensorCore
from tb.cli import main
from tb.gemm_run import simulate_gemm
from tb.harness import StreamHarness


def test_sim_reports_pass_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["sim", "--array", "2", "--m", "3", "--k", "5", "--p", "4", "--stall", "0.25",
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
def test_sim_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", *option])
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
