"""Run one GEMM on the tensor core in a simulator: the entry used by tests, bench and CLI."""

from __future__ import annotations

import functools

from rtl.tensor_core import TensorCore
from sim.gemm_stream import tile_grid
from sim.harness import StreamHarness
from sim.runner import SimBuild, build, run

MODULE = "tb.tensor_core_tb"


#: Smallest harness memories (beats): every GEMM of the test suite fits one build per N.
MIN_OPERAND_DEPTH, MIN_RESULT_DEPTH = 2048, 512


#: (name, m, k, p, kind, idle, stall): shapes not multiples of N, K < N, K = 1, long K.
GEMM_CASES = [
    ("ragged", 13, 21, 11, "random", 0.0, 0.0),
    ("stalls", 13, 21, 11, "random", 0.3, 0.5),
    ("short-k", 20, 3, 20, "random", 0.0, 0.0),
    ("k1-stalls", 9, 1, 17, "random", 0.2, 0.2),
    ("extremes", 16, 40, 16, "extreme", 0.1, 0.3),
    ("min-long-k", 2, 1024, 2, "min", 0.0, 0.2),
    # One beat per tile and a result stream that almost never drains: the core must
    # stop taking tiles when the result FIFO's room is reserved, and lose no row.
    ("result-backpressure", 16, 1, 16, "random", 0.0, 0.9),
    # Many one-beat tiles, operands and results both irregular: the reservation count
    # rises and falls through its whole range with tiles taken at any cycle.
    ("tiles-idle-backpressure", 32, 1, 48, "random", 0.6, 0.6),
]


def gemm_cases(seed: int = 0) -> list[dict]:
    """:data:`GEMM_CASES` with seeds ``seed + 1`` and ``seed + 2`` (the suite's cases)."""
    return [{"name": name, "m": m, "k": k, "p": p, "kind": kind, "idle": idle,
             "stall": stall, "seed": case_seed}
            for name, m, k, p, kind, idle, stall in GEMM_CASES
            for case_seed in (seed + 1, seed + 2)]


def memory_depth(beats: int, minimum: int = MIN_OPERAND_DEPTH) -> int:
    """Harness memory depth for ``beats``: a power of two >= ``minimum``, so builds get reused."""
    return max(minimum, 1 << (beats - 1).bit_length())


@functools.cache
def tensor_core_build(n: int, operand_depth: int = MIN_OPERAND_DEPTH,
                      result_depth: int = MIN_RESULT_DEPTH, simulator: str | None = None,
                      waves: bool | None = None) -> SimBuild:
    """The tensor core of size ``n`` in a harness with memories of the given depths (beats)."""
    harness = StreamHarness(
        TensorCore(n), {"a": operand_depth, "b": operand_depth, "c": result_depth}
    )
    name = f"tensor_core-n{n}-a{operand_depth}-c{result_depth}"
    return build(harness, name, simulator=simulator, waves=waves)


def simulate_gemm(n: int, m: int, k: int, p: int, *, seed: int = 1, kind: str = "random",
                  idle: float = 0.0, stall: float = 0.0, simulator: str | None = None,
                  waves: bool | None = None, depth: int | None = None) -> dict:
    """Simulate an M x K by K x P GEMM, check it against golden, return the run's metrics.

    ``depth`` fixes the operand memory depth (so several GEMMs share one build); by
    default it is the smallest that fits. Raises :class:`sim.runner.SimulationFailed`
    when a result differs from golden.
    """
    for name, value in (("m", m), ("k", k), ("p", p)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"GEMM size {name} must be a positive integer, not {value!r}")
    rows, cols = tile_grid(m, p, n)
    beats, result_rows = rows * cols * k, rows * cols * n
    if depth is not None and depth < beats:
        raise ValueError(f"a harness of depth {depth} cannot hold the {beats} beats of this GEMM")
    handle = tensor_core_build(n, depth or memory_depth(beats),
                               memory_depth(result_rows, MIN_RESULT_DEPTH), simulator, waves)
    params = {"n": n, "m": m, "k": k, "p": p, "seed": seed, "kind": kind,
              "idle": idle, "stall": stall}
    tag = f"{kind}-m{m}-k{k}-p{p}-i{idle}-s{stall}"
    return run(handle, MODULE, testcase="gemm_matches_golden", seed=seed, params=params,
               tag=tag)


def cases_depths(n: int, cases: list[dict]) -> tuple[int, int]:
    """Operand and result harness depths that hold every case of ``cases``."""
    sizes = [tile_grid(c["m"], c["p"], n) for c in cases]
    beats = max(r * q * c["k"] for (r, q), c in zip(sizes, cases, strict=True))
    rows = max(r * q * n for r, q in sizes)
    return memory_depth(beats), memory_depth(rows, MIN_RESULT_DEPTH)


def simulate_gemm_cases(n: int, cases: list[dict], *, simulator: str | None = None,
                        handle: SimBuild | None = None, mutant: int = 0) -> dict:
    """Several GEMMs in one simulation (one simulator start instead of one per GEMM):
    ``cases`` of m, k, p, kind, idle, stall, seed and a name for the messages; the
    harness is as deep as the largest needs (``handle``: run on this build instead, with
    ``mutant`` selected). Raises SimulationFailed naming the case."""
    if handle is None:
        handle = tensor_core_build(n, *cases_depths(n, cases), simulator, None)
    return run(handle, MODULE, testcase="gemm_cases", params={"n": n, "cases": cases},
               tag=f"cases-{len(cases)}", mutant=mutant)
