"""cocotb side of :class:`sim.traffic.TrafficBench`: runs of warm-up, measurement and drain,
each a handful of Python wake-ups (the traffic is generated and checked in hardware).

Parameters (:func:`sim.runner.parameters`): ``runs``, a list of dicts with ``pattern``
(a :class:`sim.traffic.Pattern` name), ``load`` (packets per node per cycle offered),
``length``, ``warmup``, ``measure``, and optionally ``hot_rate``, ``hotspot``, ``stall``
(probabilities) — or ``sweep``: {pattern, length, ...} to find the pattern's saturation
(:func:`sim.noc_run.saturation_search`) inside one simulation. Reports one dict of counter
deltas per run (:func:`sim.noc_run.figures` turns them into loads and latencies).
"""

from __future__ import annotations

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles

from sim.noc_run import DRAIN_LIMIT, figures, saturation_search
from sim.runner import parameters, report, select_mutant
from sim.traffic import Pattern, TrafficBench

CLOCK_NS = 10
COUNTERS = (*TrafficBench.COUNTERS, "latency_sum", "cycle")


def _probability(p: float) -> int:
    return max(0, min(0xFFFF, round(p * 65536)))


class Traffic:
    def __init__(self, dut, nodes: int):
        self.dut, self.nodes = dut, nodes
        select_mutant(dut)
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start())

    def read(self) -> dict:
        return {name: int(getattr(self.dut, name).value) for name in COUNTERS}

    async def reset(self) -> None:
        self.dut.rst.value = 1
        self.dut.phase.value = 0
        await ClockCycles(self.dut.clk, 2)
        self.dut.rst.value = 0
        await ClockCycles(self.dut.clk, 1)

    async def run(self, pattern: str, load: float, length: int = 1, warmup: int = 1000,
                  measure: int = 2000, hot_rate: float = 0.0, hotspot: int = 0,
                  stall: float = 0.0) -> dict:
        """One run; the counters' changes over it (latency_max over the run), checked
        for loss, duplication, corruption and deadlock."""
        dut = self.dut
        dut.pattern.value = int(Pattern[pattern.upper()])
        dut.rate.value = _probability(load)
        dut.length.value = length
        dut.hot_rate.value = _probability(hot_rate)
        dut.hotspot.value = hotspot
        dut.stall.value = _probability(stall)
        before = self.read()
        dut.phase.value = 1
        await ClockCycles(dut.clk, warmup)
        dut.phase.value = 2
        await ClockCycles(dut.clk, measure)
        dut.phase.value = 0
        moe = pattern.upper() == "MOE"
        idle = 0  # drain: until every queued packet (and response) has arrived
        while True:
            await ClockCycles(dut.clk, 100)
            now = self.read()
            queued = (now["generated"] - now["refused"]) - (before["generated"] - before["refused"])
            done = now["delivered"] - before["delivered"]
            answers = now["responses"] - before["responses"]
            if done == queued and (not moe or answers == done):
                break
            idle += 100
            assert idle <= DRAIN_LIMIT, (
                f"{pattern} at load {load}: {queued - done} packets still in the network "
                f"{DRAIN_LIMIT} cycles after the sources stopped (deadlock?)")
        after = self.read()
        delta = {name: after[name] - before[name] for name in COUNTERS}
        delta["latency_max"] = int(dut.latency_max.value)
        delta.update(pattern=pattern, load=load, length=length, warmup=warmup, measure=measure,
                     nodes=self.nodes, moe=moe)
        assert delta["errors"] == 0, f"{pattern}: {delta['errors']} flits failed a check"
        assert delta["dropped"] == 0, f"{pattern}: the routers dropped {delta['dropped']}"
        assert delta["tagged_done"] == delta["tagged_born"], delta
        return delta


@cocotb.test()
async def traffic(dut):
    params = parameters()
    k = params["k"]
    bench = Traffic(dut, k * k)
    await bench.reset()
    results = []
    for spec in params.get("runs", []):
        results.append(await bench.run(**spec))
    if "sweep" in params:
        spec = dict(params["sweep"])
        zero = await bench.run(spec["pattern"], load=0.005, length=spec.get("length", 1),
                               measure=4000, stall=spec.get("stall", 0.0),
                               hot_rate=spec.get("hot_rate", 0.0))
        results.append(zero)

        async def measure(load: float) -> dict:
            run = await bench.run(load=load, **spec)
            results.append(run)
            return figures(run)

        search = await saturation_search(measure, figures(zero)["latency"],
                                         length=spec.get("length", 1))
        report(runs=results, saturation=search)
        return
    report(runs=results)
