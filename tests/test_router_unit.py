"""The router in the Amaranth simulator: one router at the centre of a 3 x 3 mesh, its
four neighbours modelled in Python (credit-counting senders, stalling receivers), a
scoreboard that checks every flit, and a watchdog that fails on deadlock."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl.noc import MessageClass, NocConfig, Port, branch_region, multicast_mask
from rtl.router import Router
from tb import coverage
from tb.runner import run_amaranth

K, HERE = 3, (1, 1)
INDEX_BITS = 4  # payload = packet id << INDEX_BITS | flit index


@dataclass
class Packet:
    """A packet as the testbench sees it: source, VC, destination and flit count."""

    pid: int
    source: Port
    vc: int
    length: int = 1
    dst: tuple[int, int] = HERE
    mask: int = 0  # nonzero: a multicast to these nodes
    cls: MessageClass | None = None  # None: the VC's class
    multicast: bool = False
    start: int = 0  # not offered before this cycle
    headless: bool = False  # its first flit is not a head (a broken packet)

    def flits(self, config: NocConfig) -> list[dict]:
        cls = config.vc_class(self.vc) if self.cls is None else self.cls
        return [{
            "head": i == 0 and not self.headless, "tail": i == self.length - 1,
            "vc": self.vc, "cls": cls,
            "multicast": self.multicast or bool(self.mask), "mask": self.mask,
            "dst": {"x": self.dst[0], "y": self.dst[1]},
            "payload": self.pid << INDEX_BITS | i,
        } for i in range(self.length)]


def expected_ports(router: Router, packet: Packet) -> set[Port]:
    """Where ``packet`` leaves ``router``: nothing when it must be dropped."""
    cfg, here = router.config, (router.x, router.y)
    cls = cfg.vc_class(packet.vc) if packet.cls is None else packet.cls
    if cls is not cfg.vc_class(packet.vc) or packet.headless:
        return set()
    if packet.multicast or packet.mask:
        if packet.length != 1:
            return set()
        return {p for p in Port if packet.mask & branch_region(here, p, cfg.k)}
    x, y = packet.dst
    if not (x < cfg.k and y < cfg.k):
        return set()
    port = router.route_table[x, y]
    return set() if port is packet.source and port is not Port.L else {port}


@dataclass
class Scoreboard:
    """Checks each delivered flit against its packet; :meth:`finish` checks that every
    expected flit came exactly once."""

    router: Router
    packets: dict[int, Packet] = field(default_factory=dict)
    expect: dict[int, set[Port]] = field(default_factory=dict)
    got: dict[tuple[int, Port], int] = field(default_factory=dict)
    holder: dict[tuple[Port, int], int] = field(default_factory=dict)
    last_pid: dict[tuple[Port, int, Port], int] = field(default_factory=dict)
    delivered: list[tuple[int, Port, int]] = field(default_factory=list)  # cycle, port, pid

    def add(self, packet: Packet) -> None:
        self.packets[packet.pid] = packet
        self.expect[packet.pid] = expected_ports(self.router, packet)

    def deliver(self, cycle: int, port: Port, flit) -> None:
        cfg = self.router.config
        pid, index = flit.payload >> INDEX_BITS, flit.payload & ((1 << INDEX_BITS) - 1)
        assert pid in self.packets, f"unknown flit {flit.payload:#x} on {port.name}"
        packet = self.packets[pid]
        assert port in self.expect[pid], f"packet {pid} wrongly delivered on {port.name}"
        assert self.got.get((pid, port), 0) == index, \
            f"packet {pid} flit {index} on {port.name} out of order, lost or duplicated"
        self.got[pid, port] = index + 1
        assert (flit.head, flit.tail) == (index == 0, index == packet.length - 1)
        assert flit.vc == packet.vc, "flit left its VC"
        if packet.mask:
            region = branch_region((self.router.x, self.router.y), port, cfg.k)
            assert flit.mask == packet.mask & region, "multicast mask not cut to the branch"
        # Wormhole: a VC carries one packet from its head to its tail.
        holder = self.holder.get((port, flit.vc))
        assert holder in (None, pid), \
            f"packet {pid} interleaved into packet {holder} on {port.name} VC {flit.vc}"
        self.holder[port, flit.vc] = None if flit.tail else pid
        if index == 0:
            coverage.router_flit(packet.source.name, port.name, flit.vc)
            key = (packet.source, packet.vc, port)
            assert self.last_pid.get(key, -1) < pid, f"packet {pid} overtook on {key}"
            self.last_pid[key] = pid
            self.delivered.append((cycle, port, pid))

    def outstanding(self) -> int:
        return sum(self.packets[pid].length - self.got.get((pid, port), 0)
                   for pid, ports in self.expect.items() for port in ports)

    def finish(self) -> None:
        assert self.outstanding() == 0, "flits lost"
        assert all(h is None for h in self.holder.values()), "a packet never finished"
        for pid, packet in self.packets.items():
            if packet.mask and packet.source is Port.L and self.expect[pid]:
                coverage.router_multicast({port.name for port in self.expect[pid]})


def run(packets: list[Packet], *, vcs: int = 2, depth: int = 4, seed: int = 0,
        idle: float = 0.0, stall: float = 0.0, eject_stall: float = 0.0,
        max_cycles: int = 4000, watchdog: int = 200) -> dict:
    """Drive ``packets`` (each from its source, in list order per source and VC) through
    one router; return the scoreboard, injection cycles and the router's counters."""
    rng = np.random.default_rng(seed)
    router = Router(*HERE, k=K, payload_bits=16, vcs=vcs, depth=depth)
    cfg = router.config
    board = Scoreboard(router)
    queues = {(p, v): [] for p in Port for v in range(vcs)}  # flits waiting per source VC
    for packet in packets:
        board.add(packet)
        queues[packet.source, packet.vc] += packet.flits(cfg)
    sent_at: dict[int, int] = {}
    start = {packet.pid: packet.start for packet in packets}
    result = {"board": board, "sent_at": sent_at}
    links = [p for p in Port if p is not Port.L]

    sim = Simulator(router)
    sim.add_clock(1e-8)

    async def bench(ctx):
        credits = {(p, v): depth for p in links for v in range(vcs)}  # upstream models
        downstream = {p: [[] for _ in range(vcs)] for p in links}
        give_back = {p: 0 for p in links}
        current = {v: None for v in range(vcs)}  # the flit held valid on inject[v]
        quiet = 0
        for cycle in range(max_cycles):
            # Drive: local injection (valid holds until accepted).
            for v in range(vcs):
                if current[v] is None and queues[Port.L, v] and rng.random() >= idle \
                        and start[queues[Port.L, v][0]["payload"] >> INDEX_BITS] <= cycle:
                    current[v] = queues[Port.L, v].pop(0)
                    ctx.set(router.inject[v].payload, current[v])
                ctx.set(router.inject[v].valid, current[v] is not None)
                ctx.set(router.eject[v].ready, rng.random() >= eject_stall)
            # Drive: upstream neighbours send on a VC with a credit (round-robin start).
            sending = {}
            for p in links:
                first = cycle % vcs
                for i in range(vcs):
                    v = (first + i) % vcs
                    if queues[p, v] and credits[p, v] and rng.random() >= idle \
                            and start[queues[p, v][0]["payload"] >> INDEX_BITS] <= cycle:
                        sending[p] = queues[p, v].pop(0)
                        credits[p, v] -= 1
                        break
                link = router.link(p, incoming=True)
                ctx.set(link.valid, p in sending)
                if p in sending:
                    ctx.set(link.flit, sending[p])
                # Downstream neighbours: give back the credits of flits they consumed.
                ctx.set(router.link(p, incoming=False).credit, give_back[p])
            for flit in sending.values():
                sent_at[flit["payload"] >> INDEX_BITS] = cycle
            samples = [router.inject[v].ready for v in range(vcs)]
            samples += [router.eject[v].valid for v in range(vcs)]
            samples += [router.eject[v].ready for v in range(vcs)]
            samples += [router.eject[v].payload for v in range(vcs)]
            for p in links:
                samples += [router.link(p, incoming=False).valid,
                            router.link(p, incoming=False).flit,
                            router.link(p, incoming=True).credit]
            values = (await ctx.tick().sample(*samples))[2:]
            ready, values = values[:vcs], values[vcs:]
            e_valid, e_ready, e_flit, values = (values[:vcs], values[vcs:2 * vcs],
                                                values[2 * vcs:3 * vcs], values[3 * vcs:])
            progress = False
            for v in range(vcs):
                if current[v] is not None and ready[v]:
                    sent_at[current[v]["payload"] >> INDEX_BITS] = cycle
                    current[v] = None
                if e_valid[v] and e_ready[v]:
                    board.deliver(cycle, Port.L, e_flit[v])
                    progress = True
                elif e_valid[v]:
                    coverage.router_backpressure("L")
            for i, p in enumerate(links):
                valid, flit, credit = values[3 * i:3 * i + 3]
                for v in range(vcs):
                    credits[p, v] += credit >> v & 1
                    assert credits[p, v] <= depth, f"credit overflow at {p.name} VC {v}"
                if valid:
                    board.deliver(cycle, p, flit)
                    downstream[p][flit.vc].append(flit)
                    assert len(downstream[p][flit.vc]) <= depth, \
                        f"{p.name} VC {flit.vc} sent past its credits"
                    progress = True
                give_back[p] = 0
                if any(len(queue) == depth for queue in downstream[p]):
                    coverage.router_backpressure(p.name)
                for v in range(vcs):
                    if downstream[p][v] and rng.random() >= stall:
                        downstream[p][v].pop(0)
                        give_back[p] |= 1 << v
            quiet = 0 if progress else quiet + 1
            if board.outstanding() == 0 and not any(queues.values()) \
                    and all(c is None for c in current.values()):
                break
            assert quiet < watchdog, f"deadlock: nothing delivered for {watchdog} cycles " \
                f"with {board.outstanding()} flits outstanding (cycle {cycle})"
        else:
            raise AssertionError(f"not finished in {max_cycles} cycles")
        await ctx.tick().repeat(2)
        result["dropped"] = ctx.get(router.dropped)
        result["error"] = ctx.get(router.error)
        result["cycles"] = cycle

    sim.add_testbench(bench)
    run_amaranth(sim)
    board.finish()
    return result


def test_single_flits_take_one_router_cycle():
    """Every source to every output it can reach, one packet at a time: the flit leaves
    2 cycles after it is offered (1 router cycle, then the output register / ejection
    buffer), i.e. 2 cycles per hop with the link."""
    cases = [(Port.L, (x, y)) for x in range(K) for y in range(K)]
    cases += [(Port.W, (2, 1)), (Port.W, (1, 0)), (Port.W, (1, 2)), (Port.W, (1, 1)),
              (Port.E, (0, 1)), (Port.E, (1, 2)), (Port.N, (1, 2)), (Port.N, (1, 1)),
              (Port.S, (1, 0)), (Port.S, (1, 1))]
    packets = [Packet(i, source, vc=i % 2, dst=dst, start=8 * i)
               for i, (source, dst) in enumerate(cases)]
    result = run(packets)
    board = result["board"]
    assert len(board.delivered) == len(packets)
    for cycle, port, pid in board.delivered:
        packet = board.packets[pid]
        assert {port} == expected_ports(board.router, packet)
        assert cycle - result["sent_at"][pid] == board.router.hop_latency == 2, \
            f"{packet.source.name} -> {packet.dst}"


def test_wormhole_packets_on_both_vcs_under_stalls(seed):
    rng = np.random.default_rng(seed + 1)
    packets, pid = [], 0
    sources = {Port.L: [(x, y) for x in range(K) for y in range(K)],
               Port.W: [(2, 0), (2, 2), (1, 0), (1, 2), (1, 1)],
               Port.E: [(0, 0), (0, 2), (1, 1)], Port.N: [(1, 2), (1, 1)],
               Port.S: [(1, 0), (1, 1)]}
    for _ in range(12):
        for source, dsts in sources.items():
            dst = dsts[rng.integers(len(dsts))]
            packets.append(Packet(pid, source, vc=int(rng.integers(2)),
                                  length=int(rng.integers(1, 6)), dst=dst))
            pid += 1
    result = run(packets, seed=seed + 2, idle=0.2, stall=0.4, eject_stall=0.4)
    assert result["dropped"] == 0 and result["error"] == 0


#: Destinations a packet arriving on each port can still have (XY: no U-turns, no
#: turning from Y back into X).
REACHABLE = {
    Port.L: [(x, y) for x in range(K) for y in range(K)],
    Port.W: [(x, y) for x in (1, 2) for y in range(K)],
    Port.E: [(x, y) for x in (0, 1) for y in range(K)],
    Port.N: [(1, 1), (1, 2)],
    Port.S: [(1, 0), (1, 1)],
}


def test_random_unicast_and_multicast_traffic(seed):
    """Random packets from every input to every destination it can reach, random
    multicasts from the local port, both VCs, random lengths, idle inputs and stalled
    outputs: every flit delivered once, in order, to the right outputs."""
    rng = np.random.default_rng(seed + 100)
    nodes = REACHABLE[Port.L]
    packets = []
    for pid in range(150):
        # The local port more often: its multicasts are the ones with 31 branch sets.
        source = Port.L if rng.random() < 0.4 else list(Port)[rng.integers(1, len(Port))]
        vc = int(rng.integers(2))
        if source is Port.L and rng.random() < 0.7:
            # A random non-empty set of output branches, then some nodes of each.
            branches = [p for p in Port if rng.random() < 0.5] or [Port(rng.integers(5))]
            chosen = []
            for branch in branches:
                region = [n for n in nodes
                          if multicast_mask([n], K) & branch_region(HERE, branch, K)]
                chosen += [n for n in region if rng.random() < 0.5] or \
                    [region[rng.integers(len(region))]]
            packets.append(Packet(pid, source, vc=vc, mask=multicast_mask(chosen, K)))
        else:
            dsts = REACHABLE[source]
            packets.append(Packet(pid, source, vc=vc, length=int(rng.integers(1, 5)),
                                  dst=dsts[rng.integers(len(dsts))]))
    result = run(packets, seed=seed + 101, idle=0.2, stall=0.4, eject_stall=0.3,
                 max_cycles=6000)
    assert result["dropped"] == 0 and result["error"] == 0


@pytest.mark.parametrize("vcs,depth", [(4, 2), (2, 1)])
def test_more_vcs_and_shallow_buffers(vcs, depth, seed):
    rng = np.random.default_rng(vcs + seed)
    packets = [Packet(i, Port.L if i % 2 else Port.W, vc=int(rng.integers(vcs)),
                      length=int(rng.integers(1, 5)),
                      dst=[(2, 1), (1, 2), (2, 0)][i % 3]) for i in range(40)]
    result = run(packets, vcs=vcs, depth=depth, seed=seed + 3, stall=0.3)
    outputs = {(port, pid) for _, port, pid in result["board"].delivered}
    assert len(outputs) == 40


def test_round_robin_shares_the_local_output_fairly():
    """Five inputs stream single flits to the local port at once: while all are
    backlogged, the ejection takes them in turn."""
    per_source = 12
    sources = list(Port)
    packets = [Packet(i * len(sources) + s, source, vc=0, dst=HERE)
               for i in range(per_source) for s, source in enumerate(sources)]
    result = run(packets)
    order = [result["board"].packets[pid].source for _, _, pid in result["board"].delivered]
    window = order[5:5 * (per_source - 2)]  # every source backlogged throughout
    for start in range(0, len(window) - 5, 5):
        assert set(window[start:start + 5]) == set(sources), window[start:start + 5]
    cycles = [c for c, _, _ in result["board"].delivered]
    assert cycles[-1] - cycles[0] == len(cycles) - 1, "the output idled while backlogged"


def test_multicast_branches_once_each():
    nodes = [(x, y) for x in range(K) for y in range(K)]
    sets = [nodes, [(0, 0), (2, 2)], [(1, 1)], [(1, 0), (1, 2), (0, 1)], [(2, 0), (2, 1)],
            [(0, 2)], nodes[:5]]
    packets = [Packet(i, Port.L, vc=i % 2, mask=multicast_mask(s, K)) for i, s in enumerate(sets)]
    # From the west (moving east): only nodes at x >= 1 can still be in its mask.
    east = [n for n in nodes if n[0] >= 1]
    packets += [Packet(10, Port.W, vc=0, mask=multicast_mask(east, K)),
                Packet(11, Port.N, vc=1, mask=multicast_mask([(1, 1), (1, 2)], K)),
                Packet(12, Port.E, vc=0, mask=multicast_mask([(0, 0), (1, 0)], K))]
    result = run(packets, seed=5, stall=0.5, eject_stall=0.3)
    board = result["board"]
    assert {(pid, port) for _, port, pid in board.delivered} == \
        {(pid, port) for pid, ports in board.expect.items() for port in ports}
    assert board.expect[0] == set(Port)


def test_local_backpressure_holds_the_eject_stream():
    """A mostly stalled ejection: nothing is lost, the packets wait, and the eject
    stream obeys the stream rules (checked by the scoreboard's order and the run)."""
    packets = [Packet(i, [Port.W, Port.N, Port.L, Port.E, Port.S][i % 5], vc=i % 2,
                      length=1 + i % 3, dst=HERE) for i in range(30)]
    result = run(packets, seed=7, eject_stall=0.8, watchdog=400)
    assert result["cycles"] > 60


def test_unroutable_packets_are_dropped_and_counted():
    bad = [
        Packet(0, Port.L, vc=0, length=3, dst=(3, 0)),       # outside the 3 x 3 mesh
        Packet(1, Port.L, vc=1, dst=(7, 7)),
        Packet(2, Port.L, vc=0, multicast=True),              # empty multicast mask
        Packet(3, Port.L, vc=1, length=2, mask=0b111),        # multi-flit multicast
        Packet(4, Port.L, vc=0, dst=(2, 1), cls=MessageClass.RESPONSE),  # wrong class
        Packet(5, Port.W, vc=1, length=4, dst=(0, 1)),        # a U-turn back west
    ]
    headless = Packet(6, Port.L, vc=1, length=2, dst=(2, 1), headless=True)  # 2 drops
    good = [Packet(10 + i, Port.L if i % 2 else Port.W, vc=i % 2, length=2, dst=(2, 2))
            for i in range(6)]
    result = run(bad[:3] + good[:3] + bad[3:] + [headless] + good[3:], seed=9, stall=0.2)
    assert result["dropped"] == len(bad) + 2
    assert result["error"] == 1


def test_impossible_parameters_are_refused():
    for kwargs, match in (({"k": 1}, "k must"), ({"k": 9}, "k must"), ({"vcs": 3}, "even"),
                          ({"vcs": 10}, "vcs must"), ({"depth": 0}, "depth must"),
                          ({"payload_bits": 0}, "payload_bits"), ({"x": 4}, "x must"),
                          ({"y": -1}, "y must"), ({"routing": 3}, "routing must")):
        with pytest.raises(ValueError, match=match):
            Router(**kwargs)
    with pytest.raises(ValueError, match="off the mesh"):
        Router(0, 0, k=2, routing=lambda here, dst: Port.W)
    with pytest.raises(ValueError, match="delivers"):
        Router(0, 0, k=2, routing=lambda here, dst: Port.L)
