"""The tile on Verilator: attention prefill and decode steps, bit-exact with golden."""

from __future__ import annotations

import pytest

from sim.tile_run import simulate_attention, simulate_case, tile_config

#: tiny: head_dim 12 (two words per token), 4-token pages (smaller than N = 8).
TINY = tile_config("tiny")
#: Prompt lengths by seed (make test: 11): with 4-token pages they end inside a page, on
#: a page's last token and on a new page's first token.
PREFILLS = (11, 8, 9, 6, 13)


@pytest.mark.parametrize("layer", [0, 1])  # sliding window 5, then full causal
def test_tiny_prefill_then_decode(layer, seed):
    prefill = PREFILLS[seed % len(PREFILLS)]
    result = simulate_attention(TINY, "tiny", layer, prefill=prefill, steps=3,
                                seed=layer + 1 + seed)
    phases = [(p["phase"], p["context"]) for p in result["phases"]]
    assert phases == [("prefill", prefill)] + [("decode", prefill + s) for s in (1, 2, 3)]
    # Its WAITs are for the tile's own engines: hardly a cycle with none of them busy
    # (an engine's busy flag drops a cycle before its semaphore rises, now and then).
    assert all(p["counters"]["wait"] <= 4 for p in result["phases"]), result["phases"]


def test_faults_are_corrected_or_reported():
    """One-bit ECC errors corrected (output exact), two-bit errors flagged, a bad
    instruction halts with BAD_ADDRESS, a full KV sequence refuses the append."""
    result = simulate_case(TINY, "tile_faults")
    assert result["passed"] and result["corrected"] > 0


def test_the_sequencer_checks_hold_on_the_rtl_tile():
    """Every bad instruction of sim.sequencer_cases stops the tile's program at its pc
    with its error; regions that just fit run; semaphore and program-counter overflows
    are errors."""
    assert simulate_case(TINY, "tile_programs")["passed"]


def test_network_words_arrive_and_signal():
    """net_in words are written and their signal releases a WAIT; a local DMA with a
    remote signal raises the tile's own semaphore; a DMA raises no semaphore it was
    not asked to, and each word it sends to tiles is bound for tiles; a STORE sends
    its words to their memory channel, a LOAD its read request, whose reply lands."""
    assert simulate_case(TINY, "tile_network")["passed"]


def test_gpt_oss_prefill_then_decode_at_1030_tokens():
    """GQA 8:1, head dim 32 (four words per token), 16-token pages: a 24-token prefill,
    then the cache filled to 1030 tokens (65 pages per KV row, the last one partly
    used) and a decode step that appends token 1031 into it."""
    result = simulate_attention(tile_config("gpt-oss"), "gpt-oss", 1, prefill=24,
                                context=1030, steps=1, idle=0.2, stall=0.2)
    phases = [(p["phase"], p["context"]) for p in result["phases"]]
    assert phases == [("prefill", 24), ("decode", 1031)]


def test_gpt_oss_compact_programs_at_600_tokens():
    """Programs with loops over their key blocks (page addresses LOADed from the page
    table, the loops' registers and branches) on the RTL tile, with backpressure: decode
    steps at 601 tokens of the sliding-window layer (window 128: 9 key blocks) and of the
    full layer (38 key blocks)."""
    config = tile_config("gpt-oss")
    for layer in (0, 1):
        result = simulate_attention(config, "gpt-oss", layer, context=600, steps=1, idle=0.2,
                                    stall=0.2, loops=True)
        assert all(p["summary"]["loops"] > 0 for p in result["phases"]), layer


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 0}, "n must be a power of two in \\[2, 32\\], not 0"),
    ({"n": 3}, "n must be a power of two"),
    ({"mesh": (2,)}, "mesh must be \\(columns, rows\\)"),
    ({"mesh": (2, 2), "position": (2, 0)}, "tile position \\(2, 0\\) is outside the 2 x 2"),
    ({"mesh": (2, 2), "position": (1.5, 0)}, "is outside the 2 x 2 mesh"),
    ({"sim_gating": "yes"}, "sim_gating must be True or False"),
    ({"fault_injection": 1}, "fault_injection must be True or False"),
])
def test_impossible_tiles_are_refused(kwargs, message):
    from rtl.tile import Tile

    with pytest.raises(ValueError, match=message):
        Tile(**kwargs)
