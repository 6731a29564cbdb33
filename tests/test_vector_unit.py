"""Vector unit on Verilator (SIM=icarus to switch): op programs bit-exact against golden.

The random programs include TOPK/TOPK_INDEX beats (ties, masks, several beats per row);
the routing programs run MoE top-k (k up to the bound) then gating against golden.
"""

from __future__ import annotations

import pytest

from sim.vector_unit_run import (
    full_rate_span,
    program_cases,
    simulate_program,
    simulate_programs,
)

SIZES = [4, 8]


@pytest.mark.parametrize("n", SIZES)
def test_programs(n, seed):
    """Every case of ``program_cases`` (random ops, attention rows with and without
    sinks, gating, routing; with and without stalls) with two seeds, in one simulation
    per N (a reset before each); the attention rows without stalls at full rate."""
    cases = program_cases(seed)
    assert simulate_programs(n, cases)["cases"] == len(cases)


@pytest.mark.parametrize("n", SIZES)
def test_full_rate_without_stalls(n):
    """Attention rows stream at one op per cycle apart from the per-row RECIP interlock."""
    result = simulate_program(n, "attention", seed=3, count=400)
    assert result["span_cycles"] <= full_rate_span(result["beats"]), result


def test_reset_mid_program():
    simulate_program(4, "random", seed=5, count=600, testcase="reset_mid_program")
