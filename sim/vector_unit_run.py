"""The vector unit in a stream harness: builds, and runs of golden-checked programs
(the cocotb side is ``tb.vector_unit_tb``). Used by the tests, ``make bench`` and
``make mutate``."""

from __future__ import annotations

import functools

from rtl.vector_unit import VectorUnit
from sim.harness import StreamHarness
from sim.runner import build, run

MODULE = "tb.vector_unit_tb"
#: Harness memory depth (beats) of both streams: every program of the suite fits.
DEPTH = 2048


@functools.cache  # elaborating the unit takes seconds: once per process and parameter set
def vector_unit_build(n: int, slots: int = 4, depth: int = DEPTH, simulator: str | None = None,
                      waves: bool | None = None):
    """The vector unit in a harness (memories of ``depth`` beats): one build per parameter set."""

    harness = StreamHarness(VectorUnit(n, slots), {"ops": depth, "results": depth})
    return build(harness, f"vector_unit-n{n}-s{slots}-d{depth}", simulator=simulator,
                 waves=waves)


def simulate_program(n: int, kind: str, *, slots: int = 4, seed: int = 1, count: int = 400,
                     idle: float = 0.0, stall: float = 0.0, simulator: str | None = None,
                     testcase: str = "program_matches_golden") -> dict:
    """Run one program kind on the vector unit, check it against golden, return metrics."""
    params = {"n": n, "slots": slots, "seed": seed, "kind": kind, "count": count,
              "idle": idle, "stall": stall}
    return run(vector_unit_build(n, slots, simulator=simulator), MODULE, testcase=testcase,
               seed=seed, params=params, tag=f"{kind}-c{count}-i{idle}-s{stall}")


def full_rate_span(beats: int) -> float:
    """The most cycles an attention program of ``beats`` beats may span, first op in to
    last result out, with no idle input and no stalled output: one op per cycle, apart
    from the RECIP interlock of each row."""
    return beats * 1.25 + 40


#: (name, kind, count, idle, stall): the program kinds of the suite.
PROGRAM_CASES = [
    ("random", "random", 600, 0.0, 0.0),
    ("random-stalls", "random", 600, 0.3, 0.5),
    ("attention", "attention", 400, 0.0, 0.0),
    ("attention-sink-stalls", "attention-sink", 400, 0.2, 0.3),
    ("gating-stalls", "gating", 400, 0.1, 0.4),
    ("routing-stalls", "routing", 120, 0.1, 0.4),
    # Exponents with one high bit, top-k values at every scale (tb.vector_unit_tb's
    # edge_program): where the random programs' operand ranges stop short.
    ("edges-stalls", "edges", 400, 0.1, 0.3),
]


def program_cases(seed: int = 0) -> list[dict]:
    """:data:`PROGRAM_CASES` with seeds ``seed + 1`` and ``seed + 2`` (the suite's cases)."""
    return [dict(name=name, kind=kind, count=count, idle=idle, stall=stall, seed=case_seed)
            for name, kind, count, idle, stall in PROGRAM_CASES
            for case_seed in (seed + 1, seed + 2)]


def simulate_programs(n: int, cases: list[dict], *, slots: int = 4,
                      simulator: str | None = None, handle=None, mutant: int = 0) -> dict:
    """Several programs (``cases`` of name, kind, count, idle, stall, seed) in one
    simulation, a reset between them: one simulator start instead of one per program
    (``handle``: on this build instead, with ``mutant`` selected)."""
    return run(handle or vector_unit_build(n, slots, simulator=simulator), MODULE,
               testcase="programs_match_golden", params={"n": n, "slots": slots,
                                                         "cases": cases},
               tag=f"cases-{len(cases)}", mutant=mutant)
