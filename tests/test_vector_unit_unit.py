"""Vector unit in the Amaranth simulator at small N, and its parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden.moe import topk
from rtl.vector_unit import VectorOpcode as OP
from rtl.vector_unit import VectorResult, VectorUnit
from sim.runner import run_amaranth
from spec.numerics import NUMERICS
from tb.vector_unit_tb import beat, build_program, check, expected_results, pack, topk_waits, unpack


def simulate(n, slots, program, *, stall_every=0, idle_every=0, max_top_k=None):
    """Drive ``program`` through VectorUnit(n, slots); return (data, totals, cycles, unit)."""
    dut = VectorUnit(n, slots, max_top_k)
    words = pack(program, n, slots)
    received = []
    cycles = [0]
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def source(ctx):
        for index, word in enumerate(words):
            if idle_every and index % idle_every == 0:
                ctx.set(dut.ops.valid, 0)
                await ctx.tick()
            ctx.set(dut.ops.payload.as_value(), word)
            ctx.set(dut.ops.valid, 1)
            await ctx.tick().until(dut.ops.ready)
        ctx.set(dut.ops.valid, 0)

    async def sink(ctx):
        cycle = 0
        while len(received) < len(words):
            ready = not (stall_every and cycle % stall_every == 0)
            ctx.set(dut.results.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(
                dut.results.valid, dut.results.payload.as_value())
            if valid and ready:
                received.append(payload)
            cycle += 1
            assert cycle < 40 * len(words) + 200, "no progress"
        cycles[0] = cycle
        ctx.set(dut.results.ready, 1)
        for _ in range(2 * dut.latency):
            _, _, valid = await ctx.tick().sample(dut.results.valid)
            assert not valid, "an extra result appeared"

    sim.add_testbench(source)
    sim.add_testbench(sink)
    run_amaranth(sim)
    data, total = unpack([int(w) for w in received], n)
    return data, total, cycles[0], dut


@pytest.mark.parametrize("n", [2, 3])
def test_random_ops(n):
    program, _, _ = build_program("random", n, 2, seed=n, count=300)
    data, total, _, _ = simulate(n, 2, program)
    check(data, total, program, n, 2)


def test_random_ops_with_idle_and_backpressure():
    program, _, _ = build_program("random", 2, 3, seed=7, count=200)
    data, total, _, _ = simulate(2, 3, program, stall_every=3, idle_every=4)
    check(data, total, program, 2, 3)


@pytest.mark.parametrize("kind", ["attention", "attention-sink", "gating", "routing"])
def test_softmax_rows(kind):
    program, finals, golden = build_program(kind, 4, 2, seed=3, count=80)
    data, total, _, _ = simulate(4, 2, program, stall_every=5)
    check(data, total, program, 4, 2, finals, golden)


def test_full_rate_and_latency():
    """Back-to-back ops (no RECIP) flow one per cycle but for the top-k waits; the first
    result after `latency`."""
    program, _, _ = build_program("random", 4, 1, seed=5, count=60)
    program = [op for op in program if op["opcode"].name != "RECIP"]
    waits = topk_waits(program)
    assert waits > 0
    data, total, cycles, dut = simulate(4, 1, program)
    check(data, total, program, 4, 1)
    assert cycles <= len(program) + waits + dut.latency + 2, (cycles, len(program), waits)


def test_recips_pipeline_and_a_div_waits_for_them():
    """RECIPs of several slots are taken one per cycle (their Newton pipeline is
    pipelined); a DIV waits until every RECIP in flight has written its slot, and reads
    the new reciprocal; ops that do not read it pass a RECIP."""
    n, slots = 4, 4
    rng = np.random.default_rng(11)
    sums = [int(x) for x in rng.integers(1, 1 << 20, slots)]
    program = [beat(OP.RECIP, n, c=sums[s], slot=s) for s in range(slots)]
    program.append(beat(OP.SUM, n, a=rng.integers(-99, 99, n), slot=0, first=1))
    program += [beat(OP.DIV, n, a=rng.integers(-(1 << 30), 1 << 30, n),
                     shift=NUMERICS.attn_out_frac_bits, slot=s) for s in range(slots)]
    data, total, cycles, dut = simulate(n, slots, program)
    check(data, total, program, n, slots)
    # One op per cycle but for the DIVs' wait: the RECIPs and the SUM, then the last
    # RECIP's pipeline, then the DIVs; serialised RECIPs would add 3 x recip_latency.
    assert cycles <= len(program) + dut.recip_latency + dut.latency + 2, (
        cycles, len(program), dut.recip_latency, dut.latency)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_topk_rows_against_golden(n):
    """MoE routing rows (6/32/48 experts, k up to the bound, ties) at small N, then gating."""
    program, finals, golden = build_program("routing", n, 3, seed=10 + n, count=9 * 12)
    assert any(op["opcode"].name == "TOPK_INDEX" for op in program)
    data, total, _, _ = simulate(n, 3, program, stall_every=4, idle_every=5)
    check(data, total, program, n, 3, finals, golden)


def test_topk_back_to_back():
    """TOPK beats of one row back to back, all ties: exact, ties to the earlier beat,
    and each beat that reads the list waits one cycle behind the previous one."""
    n = 4
    program = [beat(OP.TOPK, n, a=[5] * n, c=n * i, first=i == 0) for i in range(12)]
    program += [beat(OP.TOPK_INDEX, n, mask=0), beat(OP.TOPK, n, a=[9, 1, 9, 2], c=100,
                                                      mask=0b0111)]
    data, total, cycles, dut = simulate(n, 1, program)
    check(data, total, program, n, 1)
    assert data[12].tolist() == [0, 1, 2, 3]  # ties: the lowest indices
    assert data[13].tolist() == [9, 9, 5, 5]  # lane 3 masked out
    waits = topk_waits(program)
    assert waits == len(program) - 1
    assert len(program) + waits + dut.latency - 2 <= cycles <= len(program) + waits + \
        dut.latency + 2, (cycles, waits, dut.latency)


def test_topk_rows_of_one_beat_and_interleaved_ops_do_not_wait():
    """Rows of one beat (``first``) back to back, and a longer row's beats with other
    ops between them: no top-k wait, one op per cycle, exact."""
    n, slots = 4, 2
    rng = np.random.default_rng(4)
    program = [beat(OP.TOPK, n, a=rng.integers(-9, 9, n), c=n * i, slot=i % slots, first=1)
               for i in range(8)]
    for i in range(6):
        program += [beat(OP.TOPK, n, a=rng.integers(-9, 9, n), c=n * i, first=i == 0),
                    beat(OP.SUM, n, a=rng.integers(-9, 9, n), slot=1, first=i == 0)]
    program.append(beat(OP.TOPK_INDEX, n, mask=0))
    assert topk_waits(program) == 0
    data, total, cycles, dut = simulate(n, slots, program)
    check(data, total, program, n, slots)
    assert cycles <= len(program) + dut.latency + 2, (cycles, dut.latency)


def test_topk_ties_go_to_the_beat_folded_first():
    """A row's beats in any index order: ties go to the earlier beat, as golden's model."""
    n = 4
    program = [beat(OP.TOPK, n, a=[7, 3, 7, 1], c=40, first=1),
               beat(OP.TOPK, n, a=[7, 9, 2, 7], c=0),
               beat(OP.TOPK_INDEX, n, mask=0)]
    data, total, _, _ = simulate(n, 1, program)
    check(data, total, program, n, 1)
    assert data[2].tolist() == [1, 40, 42, 0]


def test_topk_empty_entries():
    """Fewer than K entries: TOPK reads 0, TOPK_INDEX reads -1 for the empty ones."""
    n = 4
    program = [beat(OP.TOPK, n, a=[3, -7, 0, 0], c=40, mask=0b0011, first=1),
               beat(OP.TOPK_INDEX, n, mask=0)]
    data, total, _, _ = simulate(n, 1, program)
    check(data, total, program, n, 1)
    assert data[0].tolist() == [3, -7, 0, 0] and data[1].tolist() == [40, 41, -1, -1]


@pytest.mark.parametrize("k", [1, 3])
def test_topk_list_shorter_than_lanes(k):
    """max_top_k < n: only K entries kept; lanes K.. read 0; equal to golden topk."""
    n = 4
    program = [beat(OP.TOPK, n, a=[1, 8, 8, -2], c=0, first=1),
               beat(OP.TOPK, n, a=[8, 9, 1, 8], c=4),
               beat(OP.TOPK_INDEX, n, mask=0)]
    dut = VectorUnit(n, 1, max_top_k=k)
    assert dut.max_top_k == k
    data, total, _, _ = simulate(n, 1, program, max_top_k=k)
    want, _ = expected_results(program, n, 1, max_top_k=k)
    assert (data == want).all(), (data.tolist(), want.tolist())
    row = np.array([1, 8, 8, -2, 8, 9, 1, 8])
    assert data[2, :k].tolist() == topk(row[None, :], k)[0].tolist()
    assert (data[:, k:] == 0).all()


@pytest.mark.parametrize("k", [0, 5, -1])
def test_topk_list_length_out_of_range_is_refused(k):
    message = r"top-k list length \(max_top_k\) must be between 1 and 4"
    with pytest.raises(ValueError, match=message):
        VectorUnit(4, max_top_k=k)


def test_topk_list_length_must_be_an_integer():
    with pytest.raises(TypeError, match="integer"):
        VectorUnit(4, max_top_k=2.0)


@pytest.mark.parametrize(("n", "k"), [(4, 5), (8, 9), (8, 0), (16, 9)])
def test_impossible_top_k_is_refused(n, k):
    """A top_k above the unit's list (default min(n, 8)) or below 1 is a clear error."""
    with pytest.raises(ValueError, match=f"top_k {k} is impossible.*between 1 and {min(n, 8)}"):
        VectorUnit(n).check_top_k(k)


@pytest.mark.parametrize(("n", "k"), [(4, 4), (8, 8), (8, 4), (32, 8)])
def test_top_k_at_the_bound_is_accepted(n, k):
    VectorUnit(n).check_top_k(k)


def test_result_layout():
    assert VectorResult(8).size == 9 * 48


@pytest.mark.parametrize("n", [0, 1, 33, -4])
def test_lanes_out_of_range_are_refused(n):
    with pytest.raises(ValueError, match="between 2 and 32"):
        VectorUnit(n)


@pytest.mark.parametrize("slots", [0, 65])
def test_slots_out_of_range_are_refused(slots):
    with pytest.raises(ValueError, match="between 1 and 64"):
        VectorUnit(4, slots)


@pytest.mark.parametrize("n", [8.0, "8", True])
def test_lanes_must_be_an_integer(n):
    with pytest.raises(TypeError, match="integer"):
        VectorUnit(n)


def test_model_catches_a_wrong_result():
    """The scoreboard can fail: one flipped bit in one lane is reported."""
    program, _, _ = build_program("random", 2, 2, seed=1, count=20)
    data, total = expected_results(program, 2, 2)
    check(data, total, program, 2, 2)
    data = data.copy()
    data[-1, 0] ^= 1
    with pytest.raises(AssertionError, match="wrong"):
        check(data, total, program, 2, 2)
