"""cocotb tests of the tensor core inside a StreamHarness (see tests/test_tensor_core.py).

Each test reads its parameters with :func:`sim.runner.parameters` and hands metrics back
with :func:`sim.runner.report`. The scoreboard is the golden GEMM: every result row is
compared, and the row count must be exact (a missing, duplicated or extra row fails).
"""

from __future__ import annotations

import cocotb
import numpy as np

from golden.gemm import gemm
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


def _timeout(beats: int, rows: int, idle: float, stall: float, n: int) -> int:
    return int(4 * (beats / (1 - idle) + rows / (1 - stall))) + 20 * n + 1000


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
    """A ends one beat before B on the second tile: error set, first tile intact, halt."""
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
    stats = await tb.harness.run(seed=p["seed"], timeout_cycles=4 * k + 40 * n)
    assert not stats.finished, "the harness finished although the streams disagree"
    assert int(dut.error.value) == 1, "mismatched `last` flags did not set the error flag"
    sent = tb.harness.counter("a_sent")
    assert sent == k + k - 2, f"core consumed {sent} beats, expected to halt at {2 * k - 2}"
    tb.check(a[:, :], b[:, :n], n)  # the first tile drained, exactly once
    await tb.harness.settle(8 * n)
    assert tb.harness.counter("c_received") == n, "rows left the core after the error"


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
    each after a reset, with its idle/backpressure; every one bit-exact, no error flag."""
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
        beats, rows = tb.load(a, b)
        stats = await tb.harness.run(
            seed=case["seed"], timeout_cycles=_timeout(beats, rows, case["idle"],
                                                       case["stall"], n))
        assert stats.finished, f"{what}: timed out after {stats.cycles} cycles"
        await tb.harness.settle(4 * n)
        try:
            tb.check(a, b, rows)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None
        assert int(dut.error.value) == 0, f"{what}: error flag set on a well-formed stream"
    report(passed=True, cases=len(p["cases"]))
