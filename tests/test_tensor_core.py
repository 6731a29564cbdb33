"""Tensor core on Verilator (SIM=icarus to switch): random GEMMs bit-exact against golden.

N = 2, 4 and 8 here; N = 16, the largest size (its build alone takes ~100 s of the
suite's 15 minutes), runs bit-exact against golden in `make bench` (bench/tensor_core.py,
GEMMs of 8N x K x 8N for K up to 64N) and in `make synth`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sim.gemm_run import MODULE, gemm_cases, simulate_gemm, simulate_gemm_cases, tensor_core_build
from sim.runner import run

SIZES = [2, 4, 8]


@pytest.mark.parametrize("n", SIZES)
def test_gemm(n, seed):
    """Every case of ``gemm_cases`` (ragged shapes, K < N, K = 1, long K, extremes, with
    and without stalls, a result stream that almost never drains) with two seeds, in
    one simulation per size."""
    cases = gemm_cases(seed)
    assert simulate_gemm_cases(n, cases)["cases"] == len(cases)


@pytest.mark.parametrize("n", SIZES)
def test_back_to_back_tiles_full_rate(n, seed):
    """K = 8N tiles back to back with no stalls keep the array busy >= 95% of the time."""
    result = simulate_gemm(n, 4 * n, 8 * n, 4 * n, seed=seed + 3)
    assert result["utilisation"] >= 0.95, result


@pytest.mark.parametrize("n", [4, 8])
def test_reset_mid_stream(n):
    params = {"n": n, "m": 4 * n, "k": 2 * n, "p": 4 * n, "seed": 5}
    run(tensor_core_build(n), MODULE, testcase="reset_mid_stream", seed=5, params=params)


@pytest.mark.parametrize("n", [2, 8])
def test_operand_stream_ending_early_sets_error(n):
    params = {"n": n, "k": 12, "seed": 7}
    run(tensor_core_build(n), MODULE, testcase="operand_stream_ends_early", seed=7,
        params=params)


@pytest.mark.nightly  # a traced Verilator build: ~60 s (test_regress records VCD quickly)
def test_waves_are_recorded_on_request():
    result = simulate_gemm(2, 3, 4, 3, seed=1, waves=True)
    assert result["waves_file"] and Path(result["waves_file"]).stat().st_size > 0


@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="Icarus Verilog, the optional second simulator, is not installed")
def test_icarus_agrees_with_golden():
    simulate_gemm(2, 5, 7, 3, seed=1, stall=0.3, simulator="icarus")


def test_two_runs_in_one_simulation():
    run(tensor_core_build(4), MODULE, testcase="two_runs_in_one_simulation", seed=9,
        params={"n": 4, "seed": 9})
