"""The mesh under synthetic traffic (Verilator; generators and checking sinks in hardware,
sim/traffic.py): every pattern, 10 000 packets on 3 x 3 with random stalls at the local
ports (`make bench` runs 50 000 per pattern on 4 x 4; 3 x 3 keeps this suite's build
small), none lost, duplicated, reordered or corrupted, no deadlock; the zero-load
latency the router documents; and the checks themselves catching a corrupted flit."""

from __future__ import annotations

import pytest
from amaranth.sim import Simulator

from sim.noc_run import check_complete, correctness_runs, figures, simulate
from sim.runner import run_amaranth
from sim.traffic import TrafficBench

K = 3
#: Packets per pattern here; `make bench` runs 50 000 per pattern with the same checks.
PACKETS = 10_000


def test_every_pattern_delivers_every_packet_exactly_once():
    check_complete(simulate(K, runs=correctness_runs(K, PACKETS)), PACKETS)


def test_zero_load_latency_is_two_cycles_per_hop():
    """Neighbour traffic (1 hop) and bit-complement (up to 4 hops on 3 x 3, the centre
    silent) at 0.5 % load: latency = constant + 2 x hops."""
    near, far = (figures(r)["latency"] for r in simulate(K, runs=[
        dict(pattern=p, load=0.005, measure=6000) for p in ("neighbour", "bit_complement")
    ])["runs"])
    hops = [abs(K - 1 - 2 * x) + abs(K - 1 - 2 * y) for x in range(K) for y in range(K)]
    far_hops = sum(hops) / sum(1 for h in hops if h)  # over the nodes that send
    assert (far - near) / (far_hops - 1) == pytest.approx(2.0, abs=0.1)


def test_a_corrupted_flit_is_caught():
    """The sinks' checks are live: with one sink seeing a flipped payload bit, errors
    are counted (and none without the fault)."""
    counts = []
    for corrupt in (None, 3):
        bench = TrafficBench(2, corrupt=corrupt)
        sim = Simulator(bench)
        sim.add_clock(1e-8)

        async def drive(ctx, bench=bench):
            ctx.set(bench.rate, 20000)
            ctx.set(bench.phase, 1)
            await ctx.tick().repeat(100)
            counts.append(ctx.get(bench.errors))

        sim.add_testbench(drive)
        run_amaranth(sim)
    assert counts[0] == 0 and counts[1] > 0


def test_impossible_parameters_are_refused():
    with pytest.raises(ValueError, match="queue"):
        TrafficBench(2, queue=1)
    with pytest.raises(ValueError, match="corrupt"):
        TrafficBench(2, corrupt=4)
