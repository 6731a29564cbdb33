"""The accumulator memory alone (Amaranth simulator): banked writes from two prioritised
writers under random traffic against a Python model of the memory."""

import random

import pytest
from amaranth.sim import Simulator

from rtl.accumulator import AccumulatorMemory
from sim.runner import run_amaranth

N, DEPTH = 4, 16


def _random_write(rng: random.Random) -> dict:
    return {"addr": rng.randrange(DEPTH), "lanes": rng.randrange(1, 1 << N),
            "data": [rng.randrange(-(1 << 47), 1 << 47) for _ in range(N)]}


@pytest.mark.parametrize("banks", [1, 2, 4])
def test_banked_writers_lose_nothing_and_pass_each_other(banks, seed):
    """Two writers stream random writes (valid held until taken): every write lands,
    in each writer's order, the first writer winning a bank both want; with banks > 1
    both write in one cycle whenever their banks differ; a read returns the entry
    addressed the cycle before, as it was before that cycle's writes, and a port not
    enabled keeps the data it had."""
    rng = random.Random(seed * 8 + banks)
    acc = AccumulatorMemory(N, DEPTH, read_ports=("r",), writers=("first", "second"),
                            banks=banks)
    writes = {name: [_random_write(rng) for _ in range(150)] for name in ("first", "second")}
    model = [[0] * N for _ in range(DEPTH)]
    stats = {"both": 0, "waited": 0, "checked": 0, "held": 0}
    shown = None  # what the read port shows: the last enabled read's entry

    async def bench(ctx):
        nonlocal shown
        queues = {name: list(items) for name, items in writes.items()}
        while any(queues.values()):
            offered = {}
            for name, queue in queues.items():
                port = getattr(acc, name)
                valid = bool(queue) and rng.random() < 0.8
                ctx.set(port.valid, valid)
                if valid:
                    ctx.set(port.payload.addr, queue[0]["addr"])
                    ctx.set(port.payload.lanes, queue[0]["lanes"])
                    ctx.set(port.payload.data, queue[0]["data"])
                    offered[name] = queue[0]
            read_addr, enabled = rng.randrange(DEPTH), rng.random() < 0.7
            ctx.set(acc.r_addr, read_addr)
            ctx.set(acc.r_en, enabled)
            if enabled:
                shown = list(model[read_addr])
            taken = {name: ctx.get(getattr(acc, name).ready) for name in offered}
            if len(offered) == 2:
                same = offered["first"]["addr"] % banks == offered["second"]["addr"] % banks
                assert taken == {"first": 1, "second": int(not same)}
                stats["both"] += not same
                stats["waited"] += same
            else:
                assert all(taken.values())
            for name in ("second", "first"):  # the first writer's write lands last
                if name in offered and taken[name]:
                    w = queues[name].pop(0)
                    for lane in range(N):
                        if w["lanes"] >> lane & 1:
                            model[w["addr"]][lane] = w["data"][lane]
            await ctx.tick()
            if shown is not None:
                assert [int(x) for x in ctx.get(acc.r_data)] == shown
                stats["checked"] += 1
                stats["held"] += not enabled
        for name in writes:
            ctx.set(getattr(acc, name).valid, 0)
        ctx.set(acc.r_en, 1)
        for entry in range(DEPTH):
            ctx.set(acc.r_addr, entry)
            await ctx.tick()
            assert [int(x) for x in ctx.get(acc.r_data)] == model[entry], entry

    sim = Simulator(acc)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    run_amaranth(sim)
    assert stats["waited"] > 0 and stats["held"] > 0
    assert (stats["both"] > 0) == (banks > 1)


@pytest.mark.parametrize("banks", [0, 3, 16, "2"])
def test_impossible_bank_counts_are_refused(banks):
    with pytest.raises(ValueError, match="banks"):
        AccumulatorMemory(N, DEPTH, banks=banks)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 1}, r"lane count must be an integer in \[2, 32\]"),
    ({"depth": 100}, "depth must be a power of two"),
    ({"read_ports": "rd"}, "read port names must be a sequence"),
    ({"writers": ("w", "w")}, "writer names must be a sequence of unique"),
    ({"read_ports": ("r",), "writers": ("r_addr",)}, "clash with the read ports"),
])
def test_impossible_accumulators_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AccumulatorMemory(**kwargs)
