"""The mesh in the Amaranth simulator: traffic from every node (unicast and multicast,
wormhole packets on both classes, stalled ejection), a scoreboard (every packet to
every destination exactly once, uncorrupted, in order per source, destination and VC),
a watchdog that fails on deadlock; and the channel-dependency check."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from rtl.mesh import Mesh, channel_dependencies, check_deadlock_free, find_cycle
from sim.runner import run_amaranth
from spec.noc import MAX_K, MIN_K, MessageClass, NocConfig, Port, multicast_mask, xy_route

INDEX_BITS = 4  # payload = packet id << INDEX_BITS | flit index


@dataclass
class Packet:
    pid: int
    src: tuple[int, int]
    vc: int
    dsts: frozenset  # delivered to these nodes (empty: dropped)
    length: int = 1
    dst: tuple[int, int] = (0, 0)
    mask: int = 0
    start: int = 0
    multicast: bool = False

    def flits(self, config: NocConfig) -> list[dict]:
        return [{
            "head": i == 0, "tail": i == self.length - 1, "vc": self.vc,
            "cls": config.vc_class(self.vc), "multicast": self.multicast or bool(self.mask),
            "mask": self.mask,
            "dst": {"x": self.dst[0], "y": self.dst[1]},
            "payload": self.pid << INDEX_BITS | i,
        } for i in range(self.length)]


def unicast(pid, src, dst, vc, length=1, start=0) -> Packet:
    return Packet(pid, src, vc, frozenset([dst]), length, dst=dst, start=start)


def multicast(pid, src, nodes, vc, k, start=0) -> Packet:
    return Packet(pid, src, vc, frozenset(nodes), mask=multicast_mask(nodes, k), start=start)


@dataclass
class Scoreboard:
    k: int
    packets: dict[int, Packet] = field(default_factory=dict)
    got: dict[tuple[int, tuple], int] = field(default_factory=dict)
    holder: dict[tuple[tuple, int], int] = field(default_factory=dict)
    last_pid: dict[tuple, int] = field(default_factory=dict)
    arrivals: dict[tuple[int, tuple], int] = field(default_factory=dict)  # head cycle

    def deliver(self, cycle: int, node: tuple[int, int], vc: int, flit) -> None:
        pid, index = flit.payload >> INDEX_BITS, flit.payload & ((1 << INDEX_BITS) - 1)
        assert pid in self.packets, f"unknown flit {flit.payload:#x} at {node}"
        packet = self.packets[pid]
        assert node in packet.dsts, f"packet {pid} delivered to {node}, not {set(packet.dsts)}"
        assert flit.vc == vc == packet.vc, f"packet {pid} changed VC"
        assert self.got.get((pid, node), 0) == index, \
            f"packet {pid} flit {index} at {node}: lost, duplicated or out of order"
        self.got[pid, node] = index + 1
        assert (flit.head, flit.tail) == (index == 0, index == packet.length - 1)
        assert flit.dst.x == packet.dst[0] and flit.dst.y == packet.dst[1]
        holder = self.holder.get((node, vc))
        assert holder in (None, pid), f"packet {pid} interleaved into {holder} at {node}"
        self.holder[node, vc] = None if flit.tail else pid
        if index == 0:
            if packet.mask:
                x, y = node
                assert flit.mask >> (y * self.k + x) & 1, "multicast mask lost its node"
            key = (packet.src, node, vc)
            assert self.last_pid.get(key, -1) < pid, f"packet {pid} overtook on {key}"
            self.last_pid[key] = pid
            self.arrivals[pid, node] = cycle

    def outstanding(self) -> int:
        return sum(p.length - self.got.get((p.pid, node), 0)
                   for p in self.packets.values() for node in p.dsts)


def run(k: int, packets: list[Packet], *, vcs: int = 2, depth: int = 4, seed: int = 0,
        idle: float = 0.0, eject_stall: float = 0.0, max_cycles: int = 5000,
        watchdog: int = 300, sim_gating: bool = False) -> dict:
    """Inject ``packets`` (in list order per source node and VC) into a k x k mesh and
    check every delivery; returns the scoreboard, acceptance cycles and drop counts, the
    local ports' handshakes per cycle (``trace``) and the cycles no router held
    anything (``quiet``)."""
    rng = np.random.default_rng(seed)
    mesh = Mesh(k, payload_bits=16, vcs=vcs, depth=depth, sim_gating=sim_gating)
    cfg = mesh.config
    board = Scoreboard(k)
    nodes = [(x, y) for y in range(k) for x in range(k)]
    queues = {(n, v): [] for n in nodes for v in range(vcs)}
    start = {}
    for packet in packets:
        board.packets[packet.pid] = packet
        queues[packet.src, packet.vc] += packet.flits(cfg)
        start[packet.pid] = packet.start
    accepted: dict[int, int] = {}
    result = {"board": board, "accepted": accepted, "trace": [], "quiet": 0}
    streams = [(i, n, v) for i, n in enumerate(nodes) for v in range(vcs)]

    sim = Simulator(mesh)
    sim.add_clock(1e-8)

    async def bench(ctx):
        current = {(n, v): None for n in nodes for v in range(vcs)}
        quiet = 0
        for cycle in range(max_cycles):
            for i, n, v in streams:
                queue = queues[n, v]
                if current[n, v] is None and queue and rng.random() >= idle \
                        and start[queue[0]["payload"] >> INDEX_BITS] <= cycle:
                    current[n, v] = queue.pop(0)
                    ctx.set(mesh.inject[i][v].payload, current[n, v])
                ctx.set(mesh.inject[i][v].valid, current[n, v] is not None)
                ctx.set(mesh.eject[i][v].ready, rng.random() >= eject_stall)
            samples = []
            for i, _, v in streams:
                samples += [mesh.inject[i][v].ready, mesh.eject[i][v].valid,
                            mesh.eject[i][v].ready, mesh.eject[i][v].payload]
            values = (await ctx.tick().sample(*samples, mesh.holding))[2:]
            result["quiet"] += not values[-1]
            result["trace"].append(tuple(v.as_bits() if isinstance(v, data.Const) else v
                                         for v in values))
            progress = False
            for j, (_, n, v) in enumerate(streams):
                ready, valid, eready, flit = values[4 * j:4 * j + 4]
                if current[n, v] is not None and ready:
                    accepted.setdefault(current[n, v]["payload"] >> INDEX_BITS, cycle)
                    current[n, v] = None
                    progress = True
                if valid and eready:
                    board.deliver(cycle, n, v, flit)
                    progress = True
            quiet = 0 if progress else quiet + 1
            if board.outstanding() == 0 and not any(queues.values()) \
                    and all(c is None for c in current.values()):
                break
            assert quiet < watchdog, f"deadlock: no progress for {watchdog} cycles with " \
                f"{board.outstanding()} flits outstanding (cycle {cycle})"
        else:
            raise AssertionError(f"not finished in {max_cycles} cycles")
        await ctx.tick().repeat(3)
        result["dropped"] = [ctx.get(mesh.dropped[i]) for i in range(k * k)]
        result["error"] = ctx.get(mesh.error)
        for i, _, v in streams:
            assert not ctx.get(mesh.eject[i][v].valid), "a flit left over in the network"

    sim.add_testbench(bench)
    run_amaranth(sim)
    assert board.outstanding() == 0
    assert all(h is None for h in board.holder.values()), "a packet never finished"
    return result


def test_zero_load_latency_is_two_cycles_per_hop():
    """One single-flit packet at a time from (0, 0) to every node of a 3 x 3 mesh: it is
    delivered 2 + 2 x hops cycles after injection."""
    k = 3
    packets = [unicast(i, (0, 0), (x, y), vc=i % 2, start=20 * i)
               for i, (x, y) in enumerate((x, y) for y in range(k) for x in range(k))]
    result = run(k, packets)
    board = result["board"]
    for p in packets:
        hops = p.dst[0] + p.dst[1]
        latency = board.arrivals[p.pid, p.dst] - result["accepted"][p.pid]
        assert latency == 2 + 2 * hops, f"{p.dst}: {latency} cycles for {hops} hops"


def random_traffic(k: int, count: int, seed: int, vcs: int = 2) -> list[Packet]:
    """Unicast packets of 1-4 flits (a fifth of them single-flit multicasts) from every
    node to random destinations, on random VCs."""
    rng = np.random.default_rng(seed)
    nodes = [(x, y) for y in range(k) for x in range(k)]
    packets = []
    for pid in range(count):
        src = nodes[rng.integers(len(nodes))]
        vc = int(rng.integers(vcs))
        if rng.random() < 0.2:
            chosen = [n for n in nodes if rng.random() < 0.4] or [nodes[0]]
            packets.append(multicast(pid, src, chosen, vc, k))
        else:
            packets.append(unicast(pid, src, nodes[rng.integers(len(nodes))], vc,
                                   length=int(rng.integers(1, 5))))
    return packets


def test_mixed_traffic_with_stalls_3x3(seed):
    """Broadcasts and multicast sets from several nodes, wormhole unicast packets to the
    same nodes in between (the copies keep their order), then random traffic from every
    node, with idle injection and stalled ejection."""
    k = 3
    nodes = [(x, y) for y in range(k) for x in range(k)]
    packets = [multicast(0, (1, 1), nodes, 0, k), multicast(1, (0, 0), nodes, 1, k),
               multicast(2, (2, 2), [(0, 0), (2, 0), (0, 2)], 0, k),
               multicast(3, (0, 2), [(0, 2)], 1, k),
               multicast(4, (2, 0), [(1, 0), (1, 1), (1, 2), (0, 1)], 0, k)]
    packets += [unicast(5 + i, (1, 1), n, 0, length=3) for i, n in enumerate(nodes)]
    packets.append(multicast(20, (1, 1), nodes[::2], 0, k))
    packets += [replace(p, pid=p.pid + 100) for p in random_traffic(k, 100, seed=seed + 11)]
    result = run(k, packets, seed=seed + 12, idle=0.3, eject_stall=0.5)
    assert result["dropped"] == [0] * 9 and result["error"] == 0


def test_random_traffic_saturated_2x2_four_vcs(seed):
    """Everything offered at once, shallow buffers, four VCs: the network stays live."""
    result = run(2, random_traffic(2, 80, seed=seed + 21, vcs=4), vcs=4, depth=2,
                 seed=seed + 22,
                 eject_stall=0.3)
    assert result["error"] == 0


def test_a_gated_network_clock_changes_nothing(seed):
    """With ``sim_gating`` the routers' clock stops while the network is empty. Packets
    sent one at a time (a lone flit on a link is then all the network holds), then in
    bursts with quiet gaps, with idle sources and stalled ejection: the same handshakes
    at every local port, cycle for cycle, as the ungated mesh."""
    packets = [replace(p, start=30 * p.pid if p.pid < 20 else 600 + 40 * (p.pid // 10))
               for p in random_traffic(3, 80, seed=seed + 31)]
    runs = [run(3, packets, seed=seed + 32, idle=0.3, eject_stall=0.3, sim_gating=gating)
            for gating in (False, True)]
    assert runs[0]["trace"] == runs[1]["trace"]
    assert runs[1]["quiet"] > len(runs[1]["trace"]) // 10, "the network was never idle"


def test_unroutable_is_dropped_at_the_source_and_counted():
    k = 2
    bad = [Packet(0, (1, 0), 0, frozenset(), length=3, dst=(2, 0)),
           Packet(1, (0, 1), 1, frozenset(), dst=(5, 5)),
           Packet(2, (0, 1), 0, frozenset(), multicast=True)]  # an empty multicast
    good = [unicast(10 + i, (i % 2, i // 2 % 2), (1, 1), i % 2, length=2) for i in range(8)]
    result = run(k, bad + good, seed=4)
    assert result["dropped"] == [0, 1, 2, 0]  # node index y * k + x
    assert result["error"] == 1


def yx_route(here, dst):
    """Y first, then X: deadlock-free on its own, but not together with the XY
    multicast tree."""
    y, dy = here[1], dst[1]
    if dy != y:
        return Port.S if dy > y else Port.N
    return xy_route(here, dst)


def test_dimension_ordered_configurations_are_accepted():
    for k in range(MIN_K, MAX_K + 1):
        graph = channel_dependencies(NocConfig(k=k, vcs=4))
        assert find_cycle(graph) is None
        # Every link carries some dependency (the graph is not trivially empty).
        links = {c[:3] for c in graph if c[0] == "link"}
        assert len(links) == 4 * k * (k - 1)


def test_cyclic_configurations_are_refused():
    with pytest.raises(ValueError, match="cycle"):
        Mesh(3, routing=lambda here, dst: yx_route(here, dst)
             if (dst[0] + dst[1]) % 2 else xy_route(here, dst))
    with pytest.raises(ValueError, match="cycle"):
        Mesh(2, routing=yx_route)
    # Requests and responses sharing VCs: protocol deadlock.
    with pytest.raises(ValueError, match="cycle"):
        check_deadlock_free(NocConfig(k=2), class_vcs=lambda cls: range(2))
    check_deadlock_free(NocConfig(k=2, vcs=4),
                        class_vcs=lambda cls: [0, 1] if cls is MessageClass.REQUEST else [3])


def test_impossible_parameters_are_refused():
    for kwargs, match in (({"k": 1}, "k must"), ({"k": 9}, "k must"), ({"vcs": 1}, "vcs must"),
                          ({"depth": 17}, "depth must")):
        with pytest.raises(ValueError, match=match):
            Mesh(**kwargs)
    with pytest.raises(ValueError, match="back"):
        Mesh(3, routing=lambda here, dst: Port.L if here == dst else
             (Port.E if here[0] == 0 else Port.W))
    circle = {(0, 0): Port.E, (1, 0): Port.S, (1, 1): Port.W, (0, 1): Port.N}
    with pytest.raises(ValueError, match="loop"):
        Mesh(3, routing=lambda here, dst: Port.L if here == dst else
             circle.get(here, xy_route(here, dst)))
