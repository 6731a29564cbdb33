"""Tensor core in the Amaranth simulator at small N, and its parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from golden.gemm import gemm, wrap
from rtl.tensor_core import TensorCore
from sim.gemm_stream import assemble, operand_beats, result_rows
from sim.runner import run_amaranth


def simulate(n, a, b, *, stall_every=0, idle_every=0, a_bits=8):
    """Drive ``a @ b`` through TensorCore(n, a_bits) in the Amaranth simulator; return C."""
    dut = TensorCore(n, a_bits)
    a_words, b_words = operand_beats(a, b, n, a_bits)
    rows_expected = len(a_words) // a.shape[1] * n
    received = []
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def source(ctx):
        for index, (aw, bw) in enumerate(zip(a_words, b_words, strict=True)):
            if idle_every and index % idle_every == 0:
                ctx.set(dut.a.valid, 0)
                ctx.set(dut.b.valid, 0)
                await ctx.tick()
            ctx.set(dut.a.payload.as_value(), aw)
            ctx.set(dut.b.payload.as_value(), bw)
            ctx.set(dut.a.valid, 1)
            ctx.set(dut.b.valid, 1)
            await ctx.tick().until(dut.a.ready)
        ctx.set(dut.a.valid, 0)
        ctx.set(dut.b.valid, 0)

    async def sink(ctx):
        cycle = 0
        while len(received) < rows_expected:
            ready = not (stall_every and cycle % stall_every == 0)
            ctx.set(dut.c.ready, ready)
            _, _, valid, payload = await ctx.tick().sample(dut.c.valid, dut.c.payload.as_value())
            if valid and ready:
                received.append(payload)
            cycle += 1
            assert cycle < 100 * rows_expected + 1000, "no progress"
        # Nothing more may come out once the expected rows are in.
        ctx.set(dut.c.ready, 1)
        for _ in range(4 * n):
            _, _, valid = await ctx.tick().sample(dut.c.valid)
            assert not valid, "an extra result row appeared"

    sim.add_testbench(source)
    sim.add_testbench(sink)
    run_amaranth(sim)
    values, last = result_rows(received, n)
    assert (last == (np.arange(len(received)) % n == n - 1)).all()
    return assemble(values, a.shape[0], b.shape[1], n)


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("shape", [(5, 7, 4), (2, 1, 3), (6, 2, 6)])
def test_small_gemm(n, shape):
    m, k, p = shape
    rng = np.random.default_rng(n * 100 + k)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, p))
    assert (simulate(n, a, b) == gemm(a, b)).all()


def test_small_gemm_with_idle_and_backpressure():
    rng = np.random.default_rng(11)
    a, b = rng.integers(-128, 128, (4, 5)), rng.integers(-128, 128, (5, 4))
    assert (simulate(2, a, b, stall_every=3, idle_every=4) == gemm(a, b)).all()


@pytest.mark.parametrize("a_bits", [16, 17])
def test_wide_a_operand(a_bits):
    """A values of a_bits (the tile's GEMM engine joins two int8 limbs into 16), the
    extremes included; sums wrap at int32 like golden's."""
    rng = np.random.default_rng(a_bits)
    low, high = -(1 << (a_bits - 1)), 1 << (a_bits - 1)
    a, b = rng.integers(low, high, (5, 300)), rng.integers(-128, 128, (300, 3))
    a[0], b[:, 0] = low, -128  # row 0 x column 0: 300 x 2^(a_bits+6) wraps int32 at 17
    assert (simulate(2, a, b, a_bits=a_bits) == wrap(a @ b, 32)).all()


@pytest.mark.parametrize("a_bits", [7, 18, 12.0])
def test_a_width_out_of_range_is_refused(a_bits):
    with pytest.raises(ValueError, match="A operand width"):
        TensorCore(4, a_bits)


@pytest.mark.parametrize("n", [0, 1, 33, -4])
def test_size_out_of_range_is_refused(n):
    with pytest.raises(ValueError, match=r"tensor core size must be an integer in \[2, 32\]"):
        TensorCore(n)


@pytest.mark.parametrize("n", [8.0, "8", True])
def test_size_must_be_an_integer(n):
    with pytest.raises(TypeError, match="integer"):
        TensorCore(n)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_latency_attribute_matches_the_hardware(n):
    """Row 0 is valid exactly `latency` cycles after the tile's `last` beat is taken."""
    dut = TensorCore(n)
    k = 3
    a_words, b_words = operand_beats(np.ones((n, k), int), np.ones((k, n), int), n)
    observed = []
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def bench(ctx):
        ctx.set(dut.c.ready, 1)
        taken_last_at = None
        beat = 0
        for cycle in range(10 * n + 20):
            if beat < k:
                ctx.set(dut.a.payload.as_value(), a_words[beat])
                ctx.set(dut.b.payload.as_value(), b_words[beat])
            ctx.set(dut.a.valid, beat < k)
            ctx.set(dut.b.valid, beat < k)
            if ctx.get(dut.c.valid):
                observed.append(cycle - taken_last_at)
                return
            if beat < k and ctx.get(dut.a.ready):
                if beat == k - 1:
                    taken_last_at = cycle
                beat += 1
            await ctx.tick()

    sim.add_testbench(bench)
    run_amaranth(sim)
    assert observed == [dut.latency]
