"""``serrano sim --profile``: the tiles' pcs sampled during the rounds, summed by what held
each sequencer (sim.profile)."""

from __future__ import annotations

import pytest

from compiler.chip import layer_rounds
from sim.chip_run import chip_config, simulate_layer
from sim.profile import describe, holder, profile
from spec.isa import Opcode, encode

TINY = chip_config("tiny", k=2)


def test_holders_name_the_engine_or_the_arrivals_a_wait_is_on():
    assert holder(encode(Opcode.WAIT, semaphore=0, count=1)) == "wait GEMM"
    assert holder(encode(Opcode.WAIT, semaphore=1, count=2)) == "wait VEC"
    assert holder(encode(Opcode.WAIT, semaphore=2, count=1)) == "wait DMA"
    assert holder(encode(Opcode.WAIT, semaphore=5, count=3)) == "wait arrivals"
    assert holder(encode(Opcode.HALT)) == "at HALT"
    assert describe(encode(Opcode.WAIT, semaphore=0, count=1)) == "WAIT semaphore=0 count=1"
    assert describe(encode(Opcode.SET, rd=3, value=7)) == "SET rd=3 value=7"


class _Load:
    def __init__(self, words):
        self.words = words

    def image(self):
        return dict(enumerate(self.words))


class _Round:
    def __init__(self, loads):
        self.loads = loads


def test_profile_sums_samples_by_phase_and_holder():
    gemm, arrivals = encode(Opcode.WAIT, semaphore=0, count=1), encode(Opcode.WAIT,
                                                                      semaphore=4, count=2)
    rounds = [_Round({0: _Load([gemm, arrivals]), 1: _Load([arrivals])})] * 2
    records = [{"phase": "decode", "pc_samples": {"0": [[0, 3], [1, 1]], "1": [[0, 5]]}},
               {"phase": "decode-moe", "pc_samples": {"0": [[1, 2]]}}]
    out = profile(rounds, records, 16)
    assert out["decode"]["tile_cycles"] == 9 * 16
    assert out["decode"]["holders"] == {"wait arrivals": 6 * 16, "wait GEMM": 3 * 16}
    assert out["decode"]["hot"][0] == {"round": 0, "tile": 1, "pc": 0, "cycles": 80,
                                       "instruction": "WAIT semaphore=4 count=2"}
    assert out["decode-moe"]["holders"] == {"wait arrivals": 32}


@pytest.mark.parametrize("period", [1, 16])
def test_a_sampled_run_accounts_for_every_tile_cycle(period):
    """On the RTL: each tile's samples, a pc every ``period`` cycles while it runs, add up
    to its cycles within a sample (or the two cycles a tile at HALT shows as running
    after its counters stopped), and the run's cycles are those of an unsampled run —
    sampling every cycle included, where a poll comes before the tiles show the go."""
    args = {"batch": 1, "prefill": 4, "context": 0, "steps": 1, "moe": "off"}
    rounds = layer_rounds(TINY, "tiny", 1, **args)
    sampled = simulate_layer(TINY, "tiny", 1, rounds=rounds, profile=period, **args)
    plain = simulate_layer(TINY, "tiny", 1, rounds=rounds, **args)
    assert [r["cycles"] for r in sampled["rounds"]] == [r["cycles"] for r in plain["rounds"]]
    for record in sampled["rounds"]:
        for tile, samples in record["pc_samples"].items():
            cycles = record["tiles"][tile]["cycles"]
            assert abs(sum(n for _, n in samples) * period - cycles) <= max(period, 2), (
                tile, cycles)
    phases = profile(rounds, sampled["rounds"], period)
    assert set(phases) == {"prefill", "decode"}
    assert all(p["tile_cycles"] > 0 and p["hot"] for p in phases.values())
