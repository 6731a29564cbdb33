"""The tile on Verilator: attention prefill and decode steps, bit-exact with golden."""

from __future__ import annotations

import pytest

from tb.tile_run import simulate_attention, tile_config

#: tiny: head_dim 12 (two words per token), 4-token pages (smaller than N = 8).
TINY = tile_config("tiny")


@pytest.mark.parametrize("layer", [0, 1])  # sliding window 5, then full causal
def test_tiny_prefill_then_decode(layer):
    result = simulate_attention(TINY, "tiny", layer, prefill=11, steps=3, seed=layer + 1)
    phases = [(p["phase"], p["context"]) for p in result["phases"]]
    assert phases == [("prefill", 11), ("decode", 12), ("decode", 13), ("decode", 14)]
