"""A k x k mesh of routers, and the channel-dependency check that refuses a routing
function or VC-class assignment that could deadlock."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from amaranth import Cat, DomainRenamer, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.router import COUNTER_BITS, LINK_PORTS, Router, Routing
from rtl.sim_gate import gated
from spec.noc import DEFAULT_DEPTH, MessageClass, NocConfig, Port, xy_route
from spec.params import check_bool

__all__ = ["Mesh", "channel_dependencies", "check_deadlock_free", "find_cycle"]

#: A channel of the dependency graph: ("link", (x, y), port, vc) for the link leaving
#: node (x, y) through ``port``; ("inject", (x, y), vc) and ("eject", (x, y), vc) for the
#: local port's two directions.
Channel = tuple
ClassVcs = Callable[[MessageClass], Iterable[int]]

#: Width of a router's link-flit counter (wraps; read as differences).
LINK_COUNTER_BITS = 32


def _path(k: int, routing: Routing, src: tuple[int, int], dst: tuple[int, int]) -> list[Port]:
    """The output ports a unicast packet takes from ``src`` to ``dst`` (ending in L)."""
    here, ports, came = src, [], Port.L
    for _ in range(2 * k * k):
        port = routing(here, dst)
        if not isinstance(port, Port):
            raise ValueError(f"routing returned {port!r}, not a Port, at {here} for {dst}")
        if port is not Port.L and port is came.opposite and came is not Port.L:
            raise ValueError(f"routing turns a packet for {dst} back at {here} ({port.name})")
        ports.append(port)
        if port is Port.L:
            if here != dst:
                raise ValueError(f"routing delivers a packet for {dst} at {here}")
            return ports
        here = (here[0] + port.step[0], here[1] + port.step[1])
        if not (0 <= here[0] < k and 0 <= here[1] < k):
            raise ValueError(f"routing sends a packet for {dst} off the {k} x {k} mesh")
        came = port
    raise ValueError(f"routing never delivers a packet from {src} to {dst} (a loop)")


def channel_dependencies(config: NocConfig, routing: Routing = xy_route,
                         class_vcs: ClassVcs | None = None) -> dict[Channel, set[Channel]]:
    """The channel-dependency graph: channel a -> channel b when a packet holding a may
    wait for b.

    - Routing: along every unicast path of ``routing`` and every XY path (multicast
      follows the XY tree, the union of XY paths; multicast packets are single-flit, so
      a branch holds nothing while its siblings wait), from each channel to the next,
      on the packet's VC (a packet keeps its VC at every hop).
    - Protocol: a node consuming a request may have to inject a response, so each
      ejection VC of the request class depends on every injection VC of the response
      class.

    ``class_vcs(cls)`` names the VCs of a message class (the router's assignment by
    default: the lower half requests, the upper half responses).
    """
    k = config.k
    class_vcs = class_vcs or config.class_vcs
    hops: set[tuple[Channel, Channel]] = set()  # VC-less channel pairs
    for sx in range(k):
        for sy in range(k):
            for dx in range(k):
                for dy in range(k):
                    src, dst = (sx, sy), (dx, dy)
                    for function in {routing, xy_route}:
                        here, prev = src, ("inject", src)
                        for port in _path(k, function, src, dst):
                            channel = ("eject", here) if port is Port.L else ("link", here, port)
                            hops.add((prev, channel))
                            here = (here[0] + port.step[0], here[1] + port.step[1])
                            prev = channel
    graph: dict[Channel, set[Channel]] = {}
    for a, b in hops:
        for v in range(config.vcs):
            graph.setdefault(a + (v,), set()).add(b + (v,))
    for x in range(k):
        for y in range(k):
            for v in class_vcs(MessageClass.REQUEST):
                for w in class_vcs(MessageClass.RESPONSE):
                    graph.setdefault(("eject", (x, y), v), set()).add(("inject", (x, y), w))
    return graph


def find_cycle(graph: dict[Channel, set[Channel]]) -> list[Channel] | None:
    """A cycle of ``graph`` (its channels, the first repeated at the end), or None."""
    state: dict[Channel, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph, key=repr):
        if state.get(root):
            continue
        path, stack = [root], [iter(sorted(graph.get(root, ()), key=repr))]
        state[root] = 1
        while stack:
            for nxt in stack[-1]:
                if state.get(nxt) == 1:
                    return path[path.index(nxt):] + [nxt]
                if not state.get(nxt):
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(sorted(graph.get(nxt, ()), key=repr)))
                    break
            else:
                state[path.pop()] = 2
                stack.pop()
    return None


def _describe(channel: Channel) -> str:
    kind, (x, y), *rest = channel
    if kind == "link":
        return f"{rest[0].name} link of ({x}, {y}) VC {rest[1]}"
    return f"{kind} at ({x}, {y}) VC {rest[0]}"


def check_deadlock_free(config: NocConfig, routing: Routing = xy_route,
                        class_vcs: ClassVcs | None = None) -> None:
    """Raise ValueError naming a cycle when the channel-dependency graph has one."""
    cycle = find_cycle(channel_dependencies(config, routing, class_vcs))
    if cycle is not None:
        shown = " -> ".join(map(_describe, cycle[:8])) + (" -> ..." if len(cycle) > 8 else "")
        raise ValueError(f"the channel-dependency graph of this {config.k} x {config.k} "
                         f"mesh has a cycle of {len(cycle) - 1} channels, so it can "
                         f"deadlock: {shown}")


class Mesh(wiring.Component):
    """``k`` x ``k`` routers (:class:`rtl.router.Router`) joined by links; node (x, y)
    is ``routers[y * k + x]`` and its local port is ``inject[y * k + x]`` /
    ``eject[y * k + x]`` (one stream per VC). Links at the mesh edge are tied off.

    At construction the channel-dependency graph of ``routing`` and the VC classes is
    built (:func:`channel_dependencies`) and a configuration whose graph has a cycle is
    refused with a ValueError: dimension-ordered routing with request and response
    classes on separate VCs passes.

    Parameters
    ----------
    k, payload_bits, vcs, depth, routing
        As for :class:`rtl.router.Router`.

    Attributes
    ----------
    inject : ``k * k`` lists of ``vcs`` stream sinks of :class:`spec.noc.Flit`
    eject : ``k * k`` lists of ``vcs`` stream sources
    dropped : ``k * k`` Signal(16), out
        Each router's dropped-packet count (unroutable packets are dropped where they
        are injected).
    link_flits : ``k * k`` Signal(32), out
        Flits each router has sent to its neighbours since reset (modulo 2^32): each is
        one link traversal, so their sum over a transfer is its flits x hops.
    error : Signal, out
        Some router dropped a packet since reset.
    holding : Signal (not a port)
        Some router holds a flit or a credit (:attr:`rtl.router.Router.holding`).
    sim_gating : bool
        For simulation only: each router's clock ticks only in cycles where it is
        ``holding``, a flit is offered to it or arrives on a link, or a credit comes back
        to it (:mod:`rtl.sim_gate`); most routers are idle most of a layer's cycles, and
        Verilator then skips them. Cycle for cycle the same.

    Latency
    -------
    A flit accepted on ``inject[s]`` at cycle t is valid on ``eject[d]`` at cycle
    t + 2 + 2 x hops at zero load (hops: the Manhattan distance).
    """

    def __init__(self, k: int = 2, *, payload_bits: int = 32, vcs: int = 2,
                 depth: int = DEFAULT_DEPTH, routing: Routing = xy_route,
                 sim_gating: bool = False):
        self.config = config = NocConfig(k=k, payload_bits=payload_bits, vcs=vcs, depth=depth)
        check_deadlock_free(config, routing)
        self.sim_gating = check_bool("sim_gating", sim_gating)
        self.holding = Signal()
        self.routers = [Router(x, y, k=k, payload_bits=payload_bits, vcs=vcs, depth=depth,
                               routing=routing)
                        for y in range(k) for x in range(k)]
        flit = config.flit
        super().__init__({
            "inject": In(stream.Signature(flit)).array(k * k, vcs),
            "eject": Out(stream.Signature(flit)).array(k * k, vcs),
            "dropped": Out(COUNTER_BITS).array(k * k),
            "link_flits": Out(LINK_COUNTER_BITS).array(k * k),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        k = self.config.k
        m.d.comb += self.holding.eq(Cat(router.holding for router in self.routers).any())
        for node, router in enumerate(self.routers):
            x, y = router.x, router.y
            # Gated, each router has a clock of its own: it ticks while the router holds
            # something, a flit is offered to it, arrives on a link or a credit comes back.
            domain = f"router_{x}_{y}" if self.sim_gating else "sync"
            wake = [router.holding, *(s.valid for s in self.inject[node])]
            m.submodules[f"router_{x}_{y}"] = (DomainRenamer(domain)(router)
                                               if self.sim_gating else router)
            for v in range(self.config.vcs):
                wiring.connect(m, wiring.flipped(self.inject[node][v]), router.inject[v])
                wiring.connect(m, router.eject[v], wiring.flipped(self.eject[node][v]))
            m.d.comb += self.dropped[node].eq(router.dropped)
            sent = []
            for port in LINK_PORTS:
                nx, ny = x + port.step[0], y + port.step[1]
                if 0 <= nx < k and 0 <= ny < k:
                    sent.append(router.link(port, incoming=False).valid)
                    wake += [router.link(port, incoming=True).valid,
                             router.link(port, incoming=False).credit.any()]
                    wiring.connect(m, router.link(port, incoming=False),
                                   self.routers[ny * k + nx].link(port.opposite, incoming=True))
                else:  # the mesh edge: nothing arrives, no credit ever comes back
                    m.d.comb += [router.link(port, incoming=True).valid.eq(0),
                                 router.link(port, incoming=False).credit.eq(0)]
            # Counted in the router's clock domain: a flit's output register is valid for
            # one of its ticks (a router holding it keeps its clock running).
            m.d[domain] += self.link_flits[node].eq(self.link_flits[node] + sum(sent))
            if self.sim_gating:
                gated(m, domain, Cat(*wake).any())
        m.d.comb += self.error.eq(Cat(*[router.error for router in self.routers]).any())
        return m
