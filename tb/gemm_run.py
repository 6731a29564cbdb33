"""Run one GEMM on the tensor core in a simulator: the entry used by tests, bench and CLI."""

from __future__ import annotations

import functools

from rtl.tensor_core import TensorCore
from tb.gemm_stream import tile_grid
from tb.harness import StreamHarness
from tb.runner import SimBuild, build, run

MODULE = "tb.tensor_core_tb"


def memory_depth(beats: int) -> int:
    """Harness memory depth for ``beats``: a power of two >= 2048, so builds get reused."""
    return max(2048, 1 << (beats - 1).bit_length())


@functools.cache
def tensor_core_build(n: int, depth: int = 2048, simulator: str | None = None,
                      waves: bool | None = None) -> SimBuild:
    """The tensor core of size ``n`` in a harness holding ``depth`` beats per stream."""
    harness = StreamHarness(TensorCore(n), {"a": depth, "b": depth, "c": depth})
    return build(harness, f"tensor_core-n{n}-d{depth}", simulator=simulator, waves=waves)


def simulate_gemm(n: int, m: int, k: int, p: int, *, seed: int = 1, kind: str = "random",
                  idle: float = 0.0, stall: float = 0.0, simulator: str | None = None,
                  waves: bool | None = None) -> dict:
    """Simulate an M x K by K x P GEMM, check it against golden, return the run's metrics.

    Raises :class:`tb.runner.SimulationFailed` when a result differs from golden.
    """
    for name, value in (("m", m), ("k", k), ("p", p)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"GEMM size {name} must be a positive integer, not {value!r}")
    rows, cols = tile_grid(m, p, n)
    beats = rows * cols * max(k, n)
    handle = tensor_core_build(n, memory_depth(beats), simulator, waves)
    params = {"n": n, "m": m, "k": k, "p": p, "seed": seed, "kind": kind,
              "idle": idle, "stall": stall}
    tag = f"{kind}-m{m}-k{k}-p{p}-i{idle}-s{stall}"
    return run(handle, MODULE, testcase="gemm_matches_golden", seed=seed, params=params,
               tag=tag)
