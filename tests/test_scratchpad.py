"""KV scratchpad on Verilator (SIM=icarus to switch): random multi-port traffic with ECC
fault injection, random idle/backpressure, paging errors; one build per design point."""

from __future__ import annotations

import pytest

from tb.scratchpad_tb import run_scratchpad

CONFIGS = ["quad", "narrow"]


@pytest.mark.parametrize("config", CONFIGS)
def test_random_traffic(config, seed):
    """Every port at once; phases without and with random idle and backpressure."""
    result = run_scratchpad(config, "random_traffic", seed=seed + 1, count=400,
                            phases=[[0.0, 0.0], [0.3, 0.5], [0.1, 0.0]])
    assert result["corrected"] > 0 and result["uncorrectable"] > 0, result


@pytest.mark.parametrize("config", CONFIGS)
def test_kv_errors_lose_nothing(config, seed):
    run_scratchpad(config, "kv_errors_lose_nothing", seed=seed + 3)


@pytest.mark.parametrize("config", CONFIGS)
def test_kv_ecc_faults(config, seed):
    run_scratchpad(config, "kv_ecc_faults", seed=seed + 4, count=300)


def test_reset_clears_kv_state(seed):
    run_scratchpad("quad", "reset_clears_kv_state", seed=seed + 5, count=200)


def test_full_rate_without_bank_conflicts():
    result = run_scratchpad("quad", "full_rate_no_conflicts", seed=6, count=512)
    assert result["requests_per_cycle"] >= 2.85, result
