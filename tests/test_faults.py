"""sim.faults without a simulator: the fault plan's syntax and limits, and which words of
a round are targets (read, and written by nothing in the round)."""

from __future__ import annotations

import pytest

from compiler.chip import TileLoad
from compiler.hazards import round_writes
from golden.vector_model import VectorOpcode as VOP
from sim.faults import FaultInjector, FaultPlan, round_targets
from spec.isa import DmaTarget, Opcode, VecDst, encode, tile_bit


@pytest.mark.parametrize(("text", "single", "double"), [
    ("0.01", 0.01, 0.0), ("1e-3,double=1e-4", 1e-3, 1e-4), (" 0 , double = 0.5 ", 0.0, 0.5),
])
def test_rates_parse(text, single, double):
    plan = FaultPlan.parse(text, seed=7)
    assert (plan.single, plan.double, plan.seed) == (single, double, 7)


@pytest.mark.parametrize(("text", "message"), [
    ("", "expected RATE"), ("0.1,triple=0.1", "expected RATE"), ("x", "must be numbers"),
    ("1.5", "single-bit fault rate must be a number in 0..1"),
    ("0.1,double=-1", "double-bit fault rate"), ("0.7,double=0.7", "add up to more than 1"),
])
def test_bad_rates_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        FaultPlan.parse(text)


def _load(*instructions) -> TileLoad:
    return TileLoad([*instructions, encode(Opcode.HALT)], {}, [])


def test_targets_are_read_and_never_written_in_the_round():
    """Tile 0 copies words 10..13 to tile 1's 20..23 and to its own 30..33; tile 1 sends
    40..41 to tile 0's 12..13. Targets: what a tile reads minus what anything writes
    into it, its own copies and arriving words alike."""
    send = dict(remote_signal=0, remote_semaphore=0)
    loads = {
        0: _load(encode(Opcode.DMA, src=10, dst=20, length=4, tiles=tile_bit(1, 0), **send),
                 encode(Opcode.DMA, src=10, dst=30, length=4, tiles=tile_bit(0, 0), **send),
                 encode(Opcode.DMA, src=31, dst=50, length=2, tiles=tile_bit(1, 0), **send)),
        1: _load(encode(Opcode.DMA, src=40, dst=12, length=2, tiles=tile_bit(0, 0), **send),
                 encode(Opcode.DMA, src=20, dst=60, length=1, tiles=tile_bit(0, 0), **send)),
    }
    targets = round_targets(loads, 2, 8)
    # Tile 0 reads 10..13 and 31..32; 12..13 arrive from tile 1, 30..33 are its copy.
    assert targets[0] == [10, 11]
    # Tile 1 reads 40..41 and 20; 20..23 arrive from tile 0.
    assert targets[1] == [40, 41]


def test_round_writes_are_every_destination_a_round_writes():
    """compiler.hazards.round_writes, which the targets and the host's held words read:
    a VEC's scratchpad rows (strided), a memory LOAD's words on its own tile, a tile
    DMA's on every tile of its mask; no word for a GEMM (the accumulator), a memory
    STORE or a VEC into entries. An IDMA, or a VEC with fields from registers, needs
    the operations dispatched."""
    vec = dict(op=int(VOP.ADD), rows=2, beats=3, a=0, b=0)
    loads = {
        0: _load(encode(Opcode.VEC, dst=100, dst_kind=VecDst.SPAD, dst_stride=8, **vec),
                 encode(Opcode.VEC, dst=5, dst_kind=VecDst.TILE, **vec),
                 encode(Opcode.GEMM, a=0, b=0, c=0, m=8, k=8, p=8),
                 encode(Opcode.DMA, target=DmaTarget.LOAD, channel=0, mem_addr=9, dst=300,
                        length=2),
                 encode(Opcode.DMA, target=DmaTarget.STORE, channel=0, src=0, length=4),
                 encode(Opcode.DMA, src=0, dst=400, length=2,
                        tiles=tile_bit(0, 0) | tile_bit(1, 1))),
        1: _load(encode(Opcode.DMA, src=0, dst=500, length=1, tiles=tile_bit(0, 0))),
    }
    writes = round_writes(loads, 2, 8)
    assert writes == {0: {100, 101, 102, 108, 109, 110, 300, 301, 400, 401, 500},
                      1: set(), 3: {400, 401}}
    idma = _load(encode(Opcode.IDMA, src=0, dst=0, table=0, count=1, row=1))
    with pytest.raises(ValueError, match="IDMA's rows come from its index table"):
        round_writes({0: idma}, 2, 8)
    dynamic = _load(encode(Opcode.WITH), encode(Opcode.VEC, dst=0, dst_kind=VecDst.SPAD, **vec))
    with pytest.raises(ValueError, match="fields from registers"):
        round_writes({0: dynamic}, 2, 8)


def test_faults_are_drawn_per_target_word_with_distinct_bits():
    loads = {0: _load(encode(Opcode.DMA, src=0, dst=2000, length=1000, tiles=tile_bit(0, 0),
                             remote_signal=0, remote_semaphore=0))}
    chosen = FaultInjector(FaultPlan(0.2, 0.1, seed=3), 2, 8).choose(loads)
    singles = [c for c in chosen if len(c[2]) == 1]
    doubles = [c for c in chosen if len(c[2]) == 2]
    assert 150 < len(singles) < 250 and 60 < len(doubles) < 140
    assert all(0 <= a < 1000 for _, a, _ in chosen)
    assert len({a for _, a, _ in chosen}) == len(chosen)
    assert all(b[0] != b[1] and max(b) < 72 for _, _, b in doubles)
    again = FaultInjector(FaultPlan(0.2, 0.1, seed=3), 2, 8).choose(loads)
    assert again == chosen


class _Counters:
    """A driver whose tiles' ECC counters read ``after`` (corrected, uncorrectable)."""

    def __init__(self, after):
        self.after = after

    def ecc_counters(self):
        return self.after


def _injected(faults):
    from sim.faults import _Fault

    injector = FaultInjector(FaultPlan(0.1, 0.1), 2, 8)
    injector.pending = [_Fault(0, tile, address, bits, 100, 0)
                        for tile, address, bits in faults]
    injector.log += injector.pending
    injector._before = {0: (5, 0), 1: (7, 0)}
    return injector


def test_counters_that_do_not_account_for_the_faults_stop_the_run():
    """Two single faults on tile 0 but one corrected read: the run stops with the
    reason, and the round's faults count as neither corrected nor detected."""
    injector = _injected([(0, 10, (3,)), (0, 11, (70,))])
    reason = injector.check_round(_Counters({0: (6, 0), 1: (7, 0)}), 4)
    assert reason.startswith("round 4: the ECC counters do not account for the faults: "
                             "tile 0 holds 2 single-bit faults")
    summary = injector.summary()
    assert summary["stopped"] == reason
    assert (summary["single_injected"], summary["single_survived"]) == (2, 0)
    assert summary["tiles"]["0"]["corrected"] == 0


def test_a_double_read_back_stops_the_run_as_detected():
    injector = _injected([(1, 10, (3, 9)), (0, 12, (5,))])
    reason = injector.check_round(_Counters({0: (6, 0), 1: (7, 2)}), 2)
    assert reason == ("uncorrectable ECC error in round 2: tile 1 (1 double-bit fault, 2 "
                      "uncorrectable reads); the run stops before using the round's outputs")
    summary = injector.summary()
    assert (summary["double_injected"], summary["double_detected"]) == (1, 1)
    # An uncorrectable read with no double there is an accounting failure, not a detection.
    injector = _injected([(0, 12, (5,))])
    assert "flagged 1 uncorrectable reads with no double-bit fault" in injector.check_round(
        _Counters({0: (6, 1), 1: (7, 0)}), 0)
