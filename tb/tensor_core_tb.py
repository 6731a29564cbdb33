"""cocotb tests of the tensor core inside a StreamHarness (see tests/test_tensor_core.py).

Each test reads its parameters with :func:`sim.runner.parameters` and hands metrics back
with :func:`sim.runner.report`. The scoreboard is the golden GEMM: every result row is
compared, and the row count must be exact (a missing, duplicated or extra row fails).
:class:`CoreWatch` checks the core's ``active`` output and its flow control cycle
by cycle.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import FallingEdge

from golden.gemm import gemm
from rtl.tensor_core import TensorCore
from sim.gemm_stream import assemble, operand_beats, result_rows, tile_grid
from sim.harness_driver import HarnessDriver
from sim.runner import parameters, report


def make_operands(rng: np.random.Generator, m: int, k: int, p: int, kind: str):
    """Random int8 operands; ``extreme`` mixes in the corners -128 and 127 heavily."""
    if kind == "random":
        return rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, p))
    if kind == "extreme":
        corners = np.array([-128, -128, -128, 127, 0, -1])
        return rng.choice(corners, (m, k)), rng.choice(corners, (k, p))
    if kind == "min":  # -128 * -128 summed over all of K: the largest accumulator
        return np.full((m, k), -128), np.full((k, p), -128)
    raise ValueError(f"unknown operand kind {kind!r}")


class TensorCoreTB:
    """Loads a GEMM into the harness, runs it and checks it against golden."""

    def __init__(self, dut, n: int):
        self.harness = HarnessDriver(dut)
        self.dut, self.n = dut, n
        self.core = TensorCore(n)  # its latency and result FIFO depth

    def set_idle_generator(self, probability: float) -> None:
        self.harness.set_idle("a", probability)
        self.harness.set_idle("b", probability)

    def set_backpressure_generator(self, probability: float) -> None:
        self.harness.set_backpressure("c", probability)

    def load(self, a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
        """Load the operand beats; return (beats per operand stream, result rows expected)."""
        a_words, b_words = operand_beats(a, b, self.n)
        self.harness.load("a", a_words)
        self.harness.load("b", b_words)
        self.a_words = a_words
        rows, cols = tile_grid(a.shape[0], b.shape[1], self.n)
        expected_rows = rows * cols * self.n
        self.harness.expect("c", expected_rows)
        return len(a_words), expected_rows

    def check(self, a: np.ndarray, b: np.ndarray, expected_rows: int) -> None:
        received = self.harness.counter("c_received")
        assert received == expected_rows, f"{received} result rows, expected {expected_rows}"
        values, last = result_rows(self.harness.read("c", expected_rows), self.n)
        want_last = (np.arange(expected_rows) % self.n) == self.n - 1
        assert (last == want_last).all(), "result `last` flags are not on every N-th row"
        got = assemble(values, a.shape[0], b.shape[1], self.n)
        want = gemm(a, b)
        bad = np.argwhere(got != want)
        assert bad.size == 0, (
            f"{len(bad)} wrong results, first at {tuple(bad[0])}: "
            f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"
        )


class CoreWatch:
    """Checks the core cycle by cycle, from what the harness counts (beats sent on ``a``,
    rows received from ``c``) and the A beats the run sends (``a_words``: their ``last``
    flags say which take ends a tile):

    - ``active`` (``TensorCore.active``): high while a beat may be in the array (fewer
      than ``latency + N`` cycles since a beat was taken; by then its rows are in the
      result FIFO) or a row of a taken tile has not left on ``c``, so a clock gated by it
      never stops mid-work; low otherwise, so an idle core's clock can stop;
    - with ``intake`` (A and B offered in every cycle until all are sent, the streams
      agreeing): the flow control, exactly. A beat is taken in every cycle after the
      first take unless it is a ``last`` beat without room: fewer than N of the
      ``result_depth`` result rows unreserved (a tile reserves N at its last beat, each
      row leaving on ``c`` frees one) or fewer than N cycles since the previous last
      beat. So the core neither takes a tile it has no room for (a lost row) nor holds
      one back that it has room for (a lost cycle).

    Watches from the cycle after a reset; :meth:`stop` raises on the first cycle that
    differed, or if the core was never seen quiet."""

    def __init__(self, tb: TensorCoreTB, a_words: list[int], intake: bool = False):
        self.dut, self.n, self.intake = tb.dut, tb.n, intake
        self.flush, self.depth = tb.core.latency + tb.n, tb.core.result_depth
        flag = 1 << (8 * tb.n)
        self.is_last = [bool(w & flag) for w in a_words]
        self.lasts = np.concatenate([[0], np.cumsum(self.is_last)])
        self.failure: str | None = None
        self.quiet_cycles = 0
        self.task = cocotb.start_soon(self._watch())

    def _fail(self, cycle: int, message: str) -> None:
        if self.failure is None:
            self.failure = f"cycle {cycle} after reset: {message}"

    async def _watch(self) -> None:
        dut, n, flush = self.dut, self.n, self.flush
        since, sent_before, received_before = flush, int(dut.a_sent.value), 0
        credits, since_last, cycle, decided = self.depth, n, 0, None
        while True:
            await FallingEdge(dut.clk)  # registers settled after the rising edge
            cycle += 1
            sent, received = int(dut.a_sent.value), int(dut.c_received.value)
            took = sent > sent_before
            # The core's registers after this edge, from what it did in the last cycle.
            ended = took and self.is_last[sent_before]
            credits += received - received_before - (n if ended else 0)
            since_last = 1 if ended else min(since_last + 1, n)
            since = 0 if took else min(since + 1, flush)
            if decided is not None and took != decided[0]:
                self._fail(cycle, f"beat {sent_before} {'taken' if took else 'not taken'}, "
                                  f"expected {'' if decided[0] else 'not '}(credits "
                                  f"{decided[1]}, {decided[2]} cycles since a last beat)")
            if credits < 0:
                self._fail(cycle, f"a tile taken without room for its rows ({credits})")
            sent_before, received_before = sent, received
            owed = n * int(self.lasts[sent]) - received
            want = since < flush or owed > 0
            got = int(dut.active.value)
            if got != want:
                self._fail(cycle, f"active = {got}, expected {int(want)} ({since} cycles "
                                  f"since a beat was taken, {owed} rows owed)")
            self.quiet_cycles = 0 if want else self.quiet_cycles + 1
            # This cycle's beat, offered from the first take until all are sent.
            decided = None  # (must the beat be taken, the credits and count it follows)
            if self.intake and 0 < sent < len(self.is_last):
                room = credits >= n and since_last == n
                decided = (not self.is_last[sent] or room, credits, since_last)

    def stop(self) -> None:
        self.task.cancel()
        assert self.failure is None, self.failure
        assert self.quiet_cycles > 0, "the core never went quiet after the run"


async def _reset_one_cycle(dut) -> None:
    """Hold ``rst`` over exactly one rising edge (written on falling edges, so no race
    with the edge): the harness registers it, and the core sees one cycle of reset."""
    await FallingEdge(dut.clk)
    dut.rst.value = 1
    await FallingEdge(dut.clk)
    dut.rst.value = 0


async def _one_cycle_resets(tb: TensorCoreTB, rng: np.random.Generator) -> None:
    """The reset is synchronous and one cycle of it clears every register: a GEMM of
    K = N tiles (a ``last`` beat every N cycles, no idle input or backpressure) is cut by
    a one-cycle reset at each of ``latency + 3N`` consecutive cycles into its stream, so
    cuts land while the pipeline stages of the PEs, PE (N-1, N-1)'s included, hold a
    ``last`` beat (a stage not cleared by the reset would push a stale row). After
    each cut the core must be quiet (``active`` low: no stale row pushed into the result
    FIFO, nothing in flight) with ``error`` clear; then a fresh GEMM (new operands
    loaded; the reset stopped the harness too) runs bit-exact, its flow control and
    ``active`` checked cycle by cycle (:class:`CoreWatch`)."""
    dut, n = tb.dut, tb.n
    tb.set_idle_generator(0.0)
    tb.set_backpressure_generator(0.0)
    for offset in range(1, tb.core.latency + 3 * n + 1):
        what = f"one-cycle reset {offset} cycles into a GEMM"
        a, b = make_operands(rng, 2 * n, n, 4 * n, "random")
        tb.load(a, b)
        stats = await tb.harness.run(seed=offset, timeout_cycles=offset)
        assert not stats.finished, f"{what}: the GEMM finished before the reset"
        await _reset_one_cycle(dut)
        await tb.harness.settle(n + 4)
        assert int(dut.active.value) == 0, f"{what}: core active after the reset (stale state)"
        assert int(dut.error.value) == 0, f"{what}: error flag set after the reset"
        a, b = make_operands(rng, 2 * n, n, 4 * n, "random")
        await _checked_gemm(tb, a, b, f"{what}, the fresh GEMM", offset, 0.0, 0.0)


def _timeout(beats: int, rows: int, idle: float, stall: float, n: int) -> int:
    return int(4 * (beats / (1 - idle) + rows / (1 - stall))) + 20 * n + 1000


async def _checked_gemm(tb: TensorCoreTB, a, b, what: str, seed: int, idle: float,
                        stall: float) -> None:
    """Run A · B (``idle`` and ``stall``: what the harness's generators are set to),
    watched by :class:`CoreWatch`, its flow control too when no input idles: every row
    bit-exact, no error flag."""
    beats, rows = tb.load(a, b)
    watch = CoreWatch(tb, tb.a_words, intake=idle == 0)
    stats = await tb.harness.run(seed=seed,
                                 timeout_cycles=_timeout(beats, rows, idle, stall, tb.n))
    assert stats.finished, f"{what}: timed out after {stats.cycles} cycles"
    await tb.harness.settle(4 * tb.n)
    try:
        tb.check(a, b, rows)
        watch.stop()
    except AssertionError as error:
        raise AssertionError(f"{what}: {error}") from None
    assert int(tb.dut.error.value) == 0, f"{what}: error flag set on a well-formed stream"


async def _start(dut, idle: float, stall: float, kind: str = "random"):
    """The test's parameters, a reset TB with the GEMM (seeded operands) loaded."""
    p = parameters()
    tb = TensorCoreTB(dut, p["n"])
    a, b = make_operands(np.random.default_rng(p["seed"]), p["m"], p["k"], p["p"], kind)
    tb.set_idle_generator(idle)
    tb.set_backpressure_generator(stall)
    await tb.harness.reset()
    beats, rows = tb.load(a, b)
    return p, tb, a, b, beats, rows


@cocotb.test()
async def gemm_matches_golden(dut):
    """A random GEMM, tiles back to back, optional idle/backpressure; bit-exact."""
    idle, stall = parameters().get("idle", 0.0), parameters().get("stall", 0.0)
    p, tb, a, b, beats, rows = await _start(dut, idle, stall, parameters().get("kind", "random"))
    n, seed = p["n"], p["seed"]
    stats = await tb.harness.run(seed=seed, timeout_cycles=_timeout(beats, rows, idle, stall, n))
    assert stats.finished, f"timed out after {stats.cycles} cycles"
    await tb.harness.settle(4 * n)
    tb.check(a, b, rows)
    assert int(dut.error.value) == 0, "error flag set on a well-formed stream"
    first_in, last_out = tb.harness.counter("a_first"), tb.harness.counter("c_last")
    span = last_out - first_in + 1
    report(
        cycles=stats.cycles,
        span_cycles=span,
        macs=int(a.shape[0] * a.shape[1] * b.shape[1]),
        utilisation=a.shape[0] * a.shape[1] * b.shape[1] / (n * n * span),
        wall_s=stats.wall_s,
        cycles_per_s=stats.cycles_per_s,
    )


@cocotb.test()
async def reset_mid_stream(dut):
    """Reset halfway through a GEMM, then run it again: the result is exact, nothing stale."""
    p, tb, a, b, beats, rows = await _start(dut, idle=0.0, stall=0.3)
    n, seed = p["n"], p["seed"]
    stats = await tb.harness.run(seed=seed, timeout_cycles=beats // 2)
    assert not stats.finished, "the GEMM finished before the reset could interrupt it"
    assert tb.harness.counter("c_received") > 0, "reset came before any result left"
    await tb.harness.reset()
    assert int(dut.error.value) == 0
    stats = await tb.harness.run(seed=seed + 1, timeout_cycles=_timeout(beats, rows, 0, 0.3, n))
    assert stats.finished, "timed out after the reset"
    await tb.harness.settle(4 * n)
    tb.check(a, b, rows)


@cocotb.test()
async def operand_stream_ends_early(dut):
    """A ends one beat before B on the second tile: error set, first tile intact, halt;
    ``active`` right in every cycle, low once the first tile has drained. Then one
    cycle of reset clears the error, and one-cycle resets cut GEMMs at every cycle of
    a sweep (:func:`_one_cycle_resets`)."""
    p = parameters()
    n, k = p["n"], p["k"]
    rng = np.random.default_rng(p["seed"])
    tb = TensorCoreTB(dut, n)
    a, b = make_operands(rng, n, k, 2 * n, "random")
    await tb.harness.reset()
    tb.load(a, b)
    a_words, _ = operand_beats(a, b, n)
    flag = 1 << (8 * n)
    a_words[k + k - 2] |= flag  # second tile: `last` on A's beat K-2 only
    tb.harness.load("a", a_words)
    watch = CoreWatch(tb, a_words)
    stats = await tb.harness.run(seed=p["seed"], timeout_cycles=4 * k + 40 * n)
    assert not stats.finished, "the harness finished although the streams disagree"
    assert int(dut.error.value) == 1, "mismatched `last` flags did not set the error flag"
    sent = tb.harness.counter("a_sent")
    assert sent == k + k - 2, f"core consumed {sent} beats, expected to halt at {2 * k - 2}"
    tb.check(a[:, :], b[:, :n], n)  # the first tile drained, exactly once
    await tb.harness.settle(8 * n)
    assert tb.harness.counter("c_received") == n, "rows left the core after the error"
    watch.stop()  # quiet once the first tile drained, though the bad beats wait
    await _reset_one_cycle(dut)
    await tb.harness.settle(2)
    assert int(dut.error.value) == 0, "one cycle of reset did not clear the error flag"
    await _one_cycle_resets(tb, rng)


@cocotb.test()
async def two_runs_in_one_simulation(dut):
    """A small GEMM, then a larger one on the same harness: both exact (no stale beat)."""
    p = parameters()
    n = p["n"]
    rng = np.random.default_rng(p["seed"])
    tb = TensorCoreTB(dut, n)
    await tb.harness.reset()
    for m, k, q in ((n, 3, n), (2 * n, 5, 3 * n)):
        a, b = make_operands(rng, m, k, q, "random")
        beats, rows = tb.load(a, b)
        stats = await tb.harness.run(seed=p["seed"], timeout_cycles=_timeout(beats, rows, 0, 0, n))
        assert stats.finished, f"run with {beats} beats timed out"
        await tb.harness.settle(4 * n)
        tb.check(a, b, rows)


@cocotb.test()
async def gemm_cases(dut):
    """Several GEMMs in one simulation (``cases``: m, k, p, kind, idle, stall, seed, name),
    each after a reset, with its idle/backpressure; every one bit-exact, no error flag,
    ``active`` right in every cycle, and without idle input the flow control exact
    (:class:`CoreWatch`)."""
    p = parameters()
    n = p["n"]
    tb = TensorCoreTB(dut, n)
    for case in p["cases"]:
        what = f"case {case['name']} seed {case['seed']}"
        a, b = make_operands(np.random.default_rng(case["seed"]), case["m"], case["k"],
                             case["p"], case["kind"])
        tb.set_idle_generator(case["idle"])
        tb.set_backpressure_generator(case["stall"])
        await tb.harness.reset()
        await _checked_gemm(tb, a, b, what, case["seed"], case["idle"], case["stall"])
    report(passed=True, cases=len(p["cases"]))
