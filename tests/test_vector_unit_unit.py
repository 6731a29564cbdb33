"""Vector unit in the Amaranth simulator at small N, and its parameter checks."""

from __future__ import annotations

import pytest
from amaranth.sim import Simulator

from rtl.vector_unit import VectorResult, VectorUnit
from tb.vector_unit_tb import build_program, check, expected_results, pack, unpack


def simulate(n, slots, program, *, stall_every=0, idle_every=0):
    """Drive ``program`` through VectorUnit(n, slots); return (data, totals, cycles, unit)."""
    dut = VectorUnit(n, slots)
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
    sim.run()
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


@pytest.mark.parametrize("kind", ["attention", "attention-sink", "gating"])
def test_softmax_rows(kind):
    program, finals, golden = build_program(kind, 4, 2, seed=3, count=80)
    data, total, _, _ = simulate(4, 2, program, stall_every=5)
    check(data, total, program, 4, 2, finals, golden)


def test_full_rate_and_latency():
    """Back-to-back ops (no RECIP) flow one per cycle; the first result after `latency`."""
    program, _, _ = build_program("random", 4, 1, seed=5, count=60)
    program = [op for op in program if op["opcode"].name != "RECIP"]
    data, total, cycles, dut = simulate(4, 1, program)
    check(data, total, program, 4, 1)
    assert cycles <= len(program) + dut.latency + 2, (cycles, len(program), dut.latency)


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
