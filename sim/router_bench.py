"""One router under test with its four neighbours modelled in Python: credit-counting
senders, stalling receivers, a scoreboard that checks every flit, and a watchdog that
fails on deadlock. The router is the centre of a 3 x 3 mesh, so every port carries
traffic.

:func:`run` drives it in the Amaranth simulator (``tests/test_router_unit.py``) or, inside
a cocotb test that has called :func:`attach`, on a Verilator build of the same router
(``tb/router_tb.py``: ``make mutate`` runs the unit tests on each Yosys mutant this way).
The bench itself is written once, against :class:`_AmaranthIO` / :class:`_CocotbIO`: set
inputs, then sample at the clock edge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from amaranth.hdl import Value
from amaranth.lib import data, wiring
from amaranth.sim import Simulator

from rtl.router import Router
from sim import coverage
from sim.runner import run_amaranth
from spec.noc import MessageClass, NocConfig, Port, branch_region

K, HERE = 3, (1, 1)
INDEX_BITS = 4  # flits per packet: at most 2**INDEX_BITS
#: Payloads scramble (packet id, flit index) by an odd multiplier mod 2**16 (a bijection),
#: so every payload bit toggles even in short tests.
_SCRAMBLE, _OFFSET = 0x9E3B, 0x3C5A


def tag(pid: int, index: int) -> int:
    """The payload of flit ``index`` of packet ``pid``."""
    return ((pid << INDEX_BITS | index) * _SCRAMBLE + _OFFSET) & 0xFFFF


def untag(payload: int) -> tuple[int, int]:
    """(packet id, flit index) of a payload made by :func:`tag`."""
    word = ((payload - _OFFSET) * pow(_SCRAMBLE, -1, 1 << 16)) & 0xFFFF
    return word >> INDEX_BITS, word & ((1 << INDEX_BITS) - 1)


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
            "payload": tag(self.pid, i),
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
        ports = {p for p in Port if packet.mask & branch_region(here, p, cfg.k)}
    else:
        x, y = packet.dst
        if not (x < cfg.k and y < cfg.k):
            return set()
        ports = {router.route_table[x, y]}
    # A turn the routing never makes (a U-turn among them) drops the packet.
    return ports if ports <= set(router.outputs_of[packet.source]) else set()


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
        pid, index = untag(flit.payload)
        assert pid in self.packets, f"unknown flit {flit.payload:#x} on {port.name}"
        packet = self.packets[pid]
        assert port in self.expect[pid], f"packet {pid} wrongly delivered on {port.name}"
        assert self.got.get((pid, port), 0) == index, \
            f"packet {pid} flit {index} on {port.name} out of order, lost or duplicated"
        self.got[pid, port] = index + 1
        # Every field as sent, but a multicast head's mask cut to the branch it takes.
        expected = packet.flits(cfg)[index]
        if expected["multicast"] and expected["head"]:
            expected["mask"] &= branch_region((self.router.x, self.router.y), port, cfg.k)
        got = {"head": flit.head, "tail": flit.tail, "vc": flit.vc, "cls": flit.cls,
               "multicast": flit.multicast, "mask": flit.mask,
               "dst": {"x": flit.dst.x, "y": flit.dst.y}, "payload": flit.payload}
        assert got == expected, f"packet {pid} flit {index} on {port.name}: {got} != {expected}"
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


def bench_router(vcs: int = 2, depth: int = 4) -> Router:
    """The router every bench drives: the centre of a 3 x 3 mesh, 16-bit payloads."""
    return Router(*HERE, k=K, payload_bits=16, vcs=vcs, depth=depth)


class _AmaranthIO:
    """The bench's view of the Amaranth simulator."""

    def __init__(self, ctx):
        self.ctx = ctx

    def set(self, signal, value) -> None:
        self.ctx.set(signal, value)

    async def tick(self, signals: list) -> list:
        """The values of ``signals`` at the next clock edge (before it updates them)."""
        return list((await self.ctx.tick().sample(*signals))[2:])

    async def ticks(self, count: int) -> None:
        await self.ctx.tick().repeat(count)

    def get(self, signal):
        return self.ctx.get(signal)


class _CocotbIO:
    """The same view of a Verilator build of :func:`bench_router` under cocotb: each
    Amaranth port maps to its Verilog port, structures are packed and unpacked."""

    def __init__(self, dut, router: Router):
        from cocotb.triggers import ReadOnly, RisingEdge

        self.dut, self._read_only, self._edge = dut, ReadOnly, RisingEdge(dut.clk)
        self.ports = {}  # id of the port's signal -> (Verilog handle, shape, input?)
        for path, member, value in router.signature.flatten(router):
            name = "__".join(str(part) for part in path)
            self.ports[id(Value.cast(value))] = (getattr(dut, name), value.shape(),
                                                 member.flow == wiring.In)

    def _port(self, signal):
        return self.ports[id(Value.cast(signal))]

    def set(self, signal, value) -> None:
        handle, shape, _ = self._port(signal)
        handle.value = shape.const(value).as_bits() if isinstance(shape, data.Layout) \
            else int(value)

    def _read(self, signal):
        handle, shape, _ = self._port(signal)
        bits = int(handle.value)
        return data.Const(shape, bits) if isinstance(shape, data.Layout) else bits

    async def tick(self, signals: list) -> list:
        await self._read_only()
        values = [self._read(signal) for signal in signals]
        await self._edge
        return values

    async def ticks(self, count: int) -> None:
        for _ in range(count):
            await self._edge

    def get(self, signal):
        return self._read(signal)

    async def reset(self) -> None:
        """Every input low, then two cycles of reset: the router as after power-up."""
        for handle, _, is_input in self.ports.values():
            if is_input:
                handle.value = 0
        self.dut.rst.value = 1
        await self.ticks(2)
        self.dut.rst.value = 0
        await self.ticks(1)


#: Set by :func:`attach` inside a cocotb test: the build :func:`run` drives instead of
#: the Amaranth simulator.
_cocotb_dut = None


def attach(dut) -> None:
    """Inside a cocotb test on a build of :func:`bench_router` (two VCs, depth 4): make
    :func:`run` (called from a :func:`cocotb.task.bridge` thread) drive ``dut``."""
    global _cocotb_dut
    _cocotb_dut = dut


class _Bench:
    """One router driven cycle by cycle: its local source (valid held until accepted),
    upstream neighbours that send with their credits, downstream neighbours that
    consume flits (``stall``) and give the credits back, and the checking scoreboard."""

    def __init__(self, router, packets: list[Packet], rng, *, vcs: int, depth: int,
                 idle: float, stall: float, eject_stall: float):
        self.router, self.rng, self.vcs, self.depth = router, rng, vcs, depth
        self.idle, self.stall, self.eject_stall = idle, stall, eject_stall
        self.board = Scoreboard(router)
        self.queues = {(p, v): [] for p in Port for v in range(vcs)}  # per source VC
        for packet in packets:
            self.board.add(packet)
            self.queues[packet.source, packet.vc] += packet.flits(router.config)
        self.start = {packet.pid: packet.start for packet in packets}
        self.sent_at: dict[int, int] = {}
        self.links = [p for p in Port if p is not Port.L]
        self.credits = {(p, v): depth for p in self.links for v in range(vcs)}  # upstream
        self.downstream = {p: [[] for _ in range(vcs)] for p in self.links}
        self.give_back = {p: 0 for p in self.links}
        self.current = {v: None for v in range(vcs)}  # the flit held valid on inject[v]

    def _ready(self, port: Port, vc: int, cycle: int) -> bool:
        """The head flit of a source VC may go this cycle (not idle, packet started)."""
        queue = self.queues[port, vc]
        return bool(queue) and self.rng.random() >= self.idle \
            and self.start[untag(queue[0]["payload"])[0]] <= cycle

    def drive(self, io, cycle: int) -> None:
        """The inputs of one cycle: local injection, upstream flits and credits."""
        router, vcs = self.router, self.vcs
        for v in range(vcs):
            if self.current[v] is None and self._ready(Port.L, v, cycle):
                self.current[v] = self.queues[Port.L, v].pop(0)
                io.set(router.inject[v].payload, self.current[v])
            io.set(router.inject[v].valid, self.current[v] is not None)
            io.set(router.eject[v].ready, self.rng.random() >= self.eject_stall)
        # Upstream neighbours send on a VC with a credit (round-robin start).
        sending = {}
        for p in self.links:
            for i in range(vcs):
                v = (cycle % vcs + i) % vcs
                if self.credits[p, v] and self._ready(p, v, cycle):
                    sending[p] = self.queues[p, v].pop(0)
                    self.credits[p, v] -= 1
                    break
            link = router.link(p, incoming=True)
            io.set(link.valid, p in sending)
            if p in sending:
                io.set(link.flit, sending[p])
            # Downstream neighbours: give back the credits of flits they consumed.
            io.set(router.link(p, incoming=False).credit, self.give_back[p])
        for flit in sending.values():
            self.sent_at[untag(flit["payload"])[0]] = cycle

    def samples(self) -> list:
        """The outputs read each cycle, in the order :meth:`observe` takes them."""
        router, vcs = self.router, self.vcs
        out = [router.inject[v].ready for v in range(vcs)]
        out += [router.eject[v].valid for v in range(vcs)]
        out += [router.eject[v].ready for v in range(vcs)]
        out += [router.eject[v].payload for v in range(vcs)]
        for p in self.links:
            out += [router.link(p, incoming=False).valid, router.link(p, incoming=False).flit,
                    router.link(p, incoming=True).credit]
        return out

    def observe(self, values: list, cycle: int) -> bool:
        """One cycle's outputs: accepted injections, deliveries (to the scoreboard),
        returned credits, the downstream neighbours' consumption. Whether anything was
        delivered."""
        vcs, depth = self.vcs, self.depth
        ready, values = values[:vcs], values[vcs:]
        e_valid, e_ready, e_flit, values = (values[:vcs], values[vcs:2 * vcs],
                                            values[2 * vcs:3 * vcs], values[3 * vcs:])
        progress = False
        for v in range(vcs):
            if self.current[v] is not None and ready[v]:
                self.sent_at[untag(self.current[v]["payload"])[0]] = cycle
                self.current[v] = None
            if e_valid[v] and e_ready[v]:
                self.board.deliver(cycle, Port.L, e_flit[v])
                progress = True
            elif e_valid[v]:
                coverage.router_backpressure("L")
        for i, p in enumerate(self.links):
            valid, flit, credit = values[3 * i:3 * i + 3]
            for v in range(vcs):
                self.credits[p, v] += credit >> v & 1
                assert self.credits[p, v] <= depth, f"credit overflow at {p.name} VC {v}"
            downstream = self.downstream[p]
            if valid:
                self.board.deliver(cycle, p, flit)
                downstream[flit.vc].append(flit)
                assert len(downstream[flit.vc]) <= depth, \
                    f"{p.name} VC {flit.vc} sent past its credits"
                progress = True
            self.give_back[p] = 0
            if any(len(queue) == depth for queue in downstream):
                coverage.router_backpressure(p.name)
            for v in range(vcs):
                if downstream[v] and self.rng.random() >= self.stall:
                    downstream[v].pop(0)
                    self.give_back[p] |= 1 << v
        return progress

    def delivered(self) -> bool:
        return self.board.outstanding() == 0 and not any(self.queues.values()) \
            and all(c is None for c in self.current.values())

    async def run(self, io, max_cycles: int, watchdog: int) -> int:
        """Until every flit is out and every credit back upstream; the cycles taken."""
        quiet = 0
        for cycle in range(max_cycles):
            self.drive(io, cycle)
            progress = self.observe(await io.tick(self.samples()), cycle)
            quiet = 0 if progress else quiet + 1
            delivered = self.delivered()
            if delivered and all(c == self.depth for c in self.credits.values()):
                return cycle
            assert quiet < watchdog, (
                f"credits lost: {watchdog} cycles after the last delivery the upstream "
                f"neighbours hold {self.credits} of {self.depth} each" if delivered else
                f"deadlock: nothing delivered for {watchdog} cycles with "
                f"{self.board.outstanding()} flits outstanding (cycle {cycle})")
        raise AssertionError(f"not finished in {max_cycles} cycles")


def run(packets: list[Packet], *, vcs: int = 2, depth: int = 4, seed: int = 0,
        idle: float = 0.0, stall: float = 0.0, eject_stall: float = 0.0,
        max_cycles: int = 4000, watchdog: int = 200) -> dict:
    """Drive ``packets`` (each from its source, in list order per source and VC) through
    one router; return the scoreboard, injection cycles and the router's counters."""
    router = bench_router(vcs, depth)
    bench = _Bench(router, packets, np.random.default_rng(seed), vcs=vcs, depth=depth,
                   idle=idle, stall=stall, eject_stall=eject_stall)
    result = {"board": bench.board, "sent_at": bench.sent_at}

    async def drive(io):
        result["cycles"] = await bench.run(io, max_cycles, watchdog)
        await io.ticks(2)
        result["dropped"] = io.get(router.dropped)
        result["error"] = io.get(router.error)

    if _cocotb_dut is None:
        sim = Simulator(router)
        sim.add_clock(1e-8)

        async def on_amaranth(ctx):
            await drive(_AmaranthIO(ctx))

        sim.add_testbench(on_amaranth)
        run_amaranth(sim)
    else:
        if (vcs, depth) != (2, 4):
            raise ValueError(f"the Verilator bench is built with vcs=2, depth=4, not "
                             f"vcs={vcs}, depth={depth}")
        from cocotb.task import resume

        async def on_verilator():
            io = _CocotbIO(_cocotb_dut, router)
            await io.reset()
            await drive(io)

        resume(on_verilator)()
    bench.board.finish()
    return result
