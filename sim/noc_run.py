"""Traffic runs on a mesh (Verilator): the entry used by tests and ``make bench``.

A run offers a pattern's traffic at a load (packets per node per cycle, Bernoulli) for a
warm-up and a measurement window, then drains; :func:`figures` turns its counters into
offered and accepted load (flits per node per cycle) and average latency (cycles, from a
packet's birth, source queueing included, to its tail's delivery).

**Saturation** (README, "Network"): a run is *saturated* when the network accepts less
than 95 % of the load offered in the window, or the average latency exceeds 3x the
zero-load latency of the same pattern. :func:`saturation_search` raises the load in
steps of 0.05 / length packets per node per cycle until a run saturates, then bisects
four times between the last good and the first saturated load; the pattern's
saturation throughput is the accepted load of the last good run.
"""

from __future__ import annotations

import functools

from sim.runner import SimBuild, build, run
from sim.traffic import Pattern, TrafficBench, destination
from spec.noc import DEFAULT_DEPTH

MODULE = "tb.noc_tb"
#: Cycles a drain may take before the run is declared deadlocked.
DRAIN_LIMIT = 20000
#: A run is saturated below this share of the offered load accepted ...
ACCEPTED_SHARE = 0.95
#: ... or above this multiple of the zero-load latency.
LATENCY_FACTOR = 3.0


#: Packets per node per cycle for the correctness runs (3 x 3, 4 x 4): below every pattern's
#: saturation even with 10 % sink stalls, so no source queue overflows; in neighbour
#: traffic the node next to the east edge takes packets from both sides.
CHECK_LOADS = {"uniform": 0.3, "transpose": 0.12, "bit_complement": 0.12, "tornado": 0.2,
               "hotspot": 0.1, "neighbour": 0.3, "moe": 0.05}


def correctness_runs(k: int, packets: int, stall: float = 0.1) -> list[dict]:
    """One run per pattern, long enough for at least ``packets`` packets (3 % margin
    for the Bernoulli sources), at :data:`CHECK_LOADS` with random sink stalls."""
    runs = []
    for pattern, load in CHECK_LOADS.items():
        active = sum(1 for x in range(k) for y in range(k)
                     if destination(Pattern[pattern.upper()], x, y, k) != (x, y))
        per_cycle = active * load * (2 if pattern == "moe" else 1)
        runs.append(dict(pattern=pattern, load=load, warmup=200,
                         measure=int(1.03 * packets / per_cycle) - 200, stall=stall,
                         hot_rate=0.2 if pattern == "hotspot" else 0.0))
    return runs


def check_complete(result: dict, packets: int) -> None:
    """Every packet of every correctness run generated, queued and delivered (the
    cocotb side has already checked errors, drops, drain and tagged packets)."""
    for one in result["runs"]:
        assert one["refused"] == 0, one
        assert one["generated"] >= packets, one
        assert one["delivered"] == one["generated"] == one["injected"], one
        if one["moe"]:
            assert one["responses"] == one["delivered"], one


@functools.cache
def traffic_build(k: int, vcs: int = 2, depth: int = DEFAULT_DEPTH,
                  queue: int = 16) -> SimBuild:
    bench = TrafficBench(k, vcs=vcs, depth=depth, queue=queue)
    return build(bench, f"traffic-k{k}-v{vcs}-d{depth}-q{queue}", opt_fast="-O1")


def simulate(k: int, *, runs: list[dict] | None = None, sweep: dict | None = None,
             vcs: int = 2, depth: int = DEFAULT_DEPTH, seed: int = 1,
             handle: SimBuild | None = None, mutant: int = 0) -> dict:
    """Run ``runs`` (see :mod:`tb.noc_tb`) and/or one saturation ``sweep`` on a k x k mesh
    (``handle``: on this build of its traffic bench instead, with ``mutant`` selected)."""
    params = {"k": k, "runs": runs or []}
    if sweep is not None:
        params["sweep"] = sweep
    tag = f"k{k}-v{vcs}-d{depth}-" + ("sweep-" + sweep["pattern"] if sweep else f"{len(runs)}runs")
    return run(handle or traffic_build(k, vcs, depth), MODULE, testcase="traffic", seed=seed,
               params=params, tag=tag, mutant=mutant)


def figures(run: dict) -> dict:
    """Offered and accepted load (flits/node/cycle), average and largest latency."""
    nodes, window = run["nodes"], run["measure"]
    generated = run["generated"]
    flits_per_packet = run["length"] + (1 if run["moe"] else 0)  # MoE: + the response
    cycles = run["warmup"] + window
    done = run["tagged_done"]
    return {
        "load": run["load"],
        "offered": generated * flits_per_packet / (nodes * cycles),
        "accepted": run["window_flits"] / (nodes * window),
        "latency": run["latency_sum"] / done if done else None,
        "latency_max": run["latency_max"],
        "refused": run["refused"],
    }


def saturated(point: dict, zero_latency: float) -> bool:
    return (point["accepted"] < ACCEPTED_SHARE * point["offered"]
            or point["latency"] is None or point["latency"] > LATENCY_FACTOR * zero_latency)


async def saturation_search(measure, zero_latency: float, *, length: int = 1,
                            bisections: int = 4) -> dict:
    """Find the saturation throughput with ``measure(load) -> figures`` (a coroutine)."""
    step = 0.05 / length
    good, bad, load = None, None, step
    while load <= 1.0 / length + 1e-9:
        point = await measure(load)
        if saturated(point, zero_latency):
            bad = load
            break
        good = point
        load += step
    if bad is not None:
        low = good["load"] if good else 0.0
        for _ in range(bisections):
            middle = (low + bad) / 2
            point = await measure(middle)
            if saturated(point, zero_latency):
                bad = middle
            else:
                good, low = point, middle
    return {
        "zero_load_latency": zero_latency,
        "saturation": good["accepted"] if good else 0.0,
        "saturation_load": good["load"] if good else 0.0,
        "first_saturated_load": bad,
    }
