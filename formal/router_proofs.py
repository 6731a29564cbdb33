"""Formal properties of the router: an Amaranth harness around one :class:`Router` whose
inputs are free (the solver picks them every cycle), with assumptions that model
well-behaved neighbours and assertions for each property.

The router proved is the centre of a 3 x 3 mesh (all four neighbours exist) with 2 VCs,
2-flit buffers and 2-bit payloads: every mechanism at its smallest size; two more
proofs use 4 VCs with 3-flit buffers and 1-flit buffers.

Properties (see :data:`PROOFS` for the proofs that check them):

- ``credits``: every credit counter equals the buffer slots its neighbour has free
  (credits + flits on the link, in the neighbour's buffer or freed there with the
  credit not yet sent back == depth), so it can never overflow or underflow; every
  input buffer, likewise, never takes more flits than it has room for.
- ``ownership``: once a head flit of a multi-flit packet has left through an output
  VC, every flit on that output VC comes from the same input VC until the tail flit;
  no other packet's flit interleaves. Strengthened by the router's own holder state.
- ``delivery``: one chosen flit entering through the west link (a routable
  single-flit packet whose payload no other flit carries) is never discarded; the
  cycle after it leaves its buffer it is in the output register XY routing names,
  unchanged; it never appears on another output, on the local port, or a second time
  (no loss, no duplication, no corruption). That it does leave (liveness) is not
  proved here: the simulations' watchdogs check it.
- ``reachable`` (covers): the tracked flit does arrive, a multi-flit packet does pass a
  held output, credits do run out, a packet is dropped, a multicast leaves on two
  outputs at once: the assumptions do not make the proofs vacuous.

The assertions are proved by k-induction (unbounded), with invariants that tie the
harness's view to the router's state (occupancy, the age order of each buffer's slots
is a total order, the flits an input VC holds for one output form whole packets in
order, holders, per-input packet state, where the tracked flit sits and that no other
flit carries its payload).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from amaranth import Cat, Module, Mux, ResetSignal, Signal
from amaranth.hdl import Assert, Assume, Cover, Fragment
from amaranth.lib import wiring

from rtl.router import LINK_PORTS, Router
from spec.noc import Port

__all__ = ["PARAMS", "PROOFS", "Proof", "RouterHarness"]

#: The router under proof.
PARAMS = {"x": 1, "y": 1, "k": 3, "payload_bits": 2, "vcs": 2, "depth": 2}


class RouterHarness(wiring.Component):
    """The router with its ports on the harness's boundary (free inputs), neighbour
    models as assumptions, and the assertions of ``properties``."""

    def __init__(self, properties: tuple[str, ...], **params):
        unknown = set(properties) - {"credits", "ownership", "delivery", "reachable"}
        if unknown:
            raise ValueError(f"unknown properties {sorted(unknown)}")
        self.properties = properties
        self.router = Router(**{**PARAMS, **params})
        self.router.observe = True  # every input slot's flit, for the invariants
        #: Payload of the tracked flit (``delivery``): constant, chosen by the solver.
        members = dict(self.router.signature.members)
        members["track_payload"] = wiring.In(self.router.config.payload_bits)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        router, cfg = self.router, self.router.config
        # Elaborate the router here, so that its internal state (``probe``) exists.
        m.submodules.router = Fragment.get(router, platform)
        probe = router.probe
        for v in range(cfg.vcs):
            wiring.connect(m, wiring.flipped(self.inject[v]), router.inject[v])
            wiring.connect(m, router.eject[v], wiring.flipped(self.eject[v]))
        for port in LINK_PORTS:
            wiring.connect(m, wiring.flipped(getattr(self, f"in_{port.name.lower()}")),
                           router.link(port, incoming=True))
            wiring.connect(m, router.link(port, incoming=False),
                           wiring.flipped(getattr(self, f"out_{port.name.lower()}")))
        m.d.comb += [self.dropped.eq(router.dropped), self.error.eq(router.error)]
        m.d.comb += Assume(~ResetSignal())
        self._neighbours(m, cfg, probe)
        if "credits" in self.properties:
            self._credits(m, cfg, probe)
        if "ownership" in self.properties:
            self._ownership(m, cfg, probe)
        if "delivery" in self.properties:
            self._delivery(m, cfg, probe)
        if "reachable" in self.properties:
            self._reachable(m, cfg, probe)
        return m

    def _neighbours(self, m, cfg, probe):
        """Upstream neighbours send only with a credit; downstream neighbours return a
        credit only for a flit they hold."""
        depth = cfg.depth
        self.up, self.down = {}, {}
        for port in LINK_PORTS:
            incoming, outgoing = self.link(port, True), self.link(port, False)
            for v in range(cfg.vcs):
                up = Signal(range(depth + 1), init=depth, name=f"up_{port.name}{v}")
                arrives = incoming.valid & (incoming.flit.vc == v)
                m.d.sync += up.eq(up - arrives + incoming.credit[v])
                m.d.comb += Assume(~arrives | (up != 0))
                down = Signal(range(depth + 1), name=f"down_{port.name}{v}")
                leaves = outgoing.valid & (outgoing.flit.vc == v)
                m.d.sync += down.eq(down + leaves - outgoing.credit[v])
                m.d.comb += Assume(~outgoing.credit[v] | (down != 0))
                self.up[port, v], self.down[port, v] = up, down

    def link(self, port: Port, incoming: bool):
        return getattr(self, f"{'in' if incoming else 'out'}_{port.name.lower()}")

    def _credits(self, m, cfg, probe):
        depth = cfg.depth
        for port in LINK_PORTS:
            incoming, outgoing = self.link(port, True), self.link(port, False)
            for v in range(cfg.vcs):
                credit = probe["credit"][port][v]
                count, pending = probe["inputs"][port][v]["count"], probe["pending"][port][v]
                on_link = outgoing.valid & (outgoing.flit.vc == v)
                m.d.comb += [
                    Assert(credit <= depth),
                    Assert(credit + self.down[port, v] + on_link == depth),
                    Assert(self.up[port, v] + count + pending + incoming.credit[v] == depth),
                ]
        # The ejection FIFOs' pointers agree with their occupancy.
        for buffer in probe["ejects"]:
            end = buffer["r_ptr"] + buffer["count"]
            m.d.comb += [Assert(buffer["count"] <= depth), Assert(buffer["r_ptr"] < depth),
                         Assert(buffer["w_ptr"] < depth),
                         Assert(Mux(end >= depth, end - depth, end) == buffer["w_ptr"])]
        # The age order of every input buffer's used slots is a total order (so each
        # output's ``oldest`` pick is at most one slot).
        for row in probe["inputs"]:
            for b in row:
                used, older = b["used"], b["is_older"]
                for i in range(depth):
                    for j in range(depth):
                        for k in range(depth):
                            if len({i, j, k}) == 3:
                                m.d.comb += Assert(~(used[i] & used[j] & used[k]
                                                     & older(i, j) & older(j, k))
                                                   | older(i, k))

    @staticmethod
    def _order(b, o: Port, depth: int):
        """For output ``o`` of input buffer ``b``: the used slots bound there, and for
        each slot whether it is the youngest of them, and for each pair whether slot i
        comes right before slot j among them."""
        needs = [b["slots"][i].route[o] for i in range(depth)]
        older = b["is_older"]
        youngest = [needs[i] & ~Cat(*[needs[j] & older(i, j) for j in range(depth)
                                      if j != i]).any() for i in range(depth)]
        before = {}
        for i in range(depth):
            for j in range(depth):
                if i != j:
                    between = Cat(*[needs[k] & older(i, k) & older(k, j)
                                    for k in range(depth) if k not in (i, j)]).any()
                    before[i, j] = needs[i] & needs[j] & older(i, j) & ~between
        return needs, youngest, before

    def _ownership(self, m, cfg, probe):
        vcs, depth = cfg.vcs, cfg.depth
        self.held = {}
        held_now, owner_now = {}, {}
        for o in LINK_PORTS:
            out = self.link(o, False)
            for v in range(vcs):
                held = self.held[o, v] = Signal(name=f"held_{o.name}{v}")
                owner = Signal(range(5 * vcs), name=f"owner_{o.name}{v}")
                sending = out.valid & (out.flit.vc == v)
                src = probe["out_src"][o]
                with m.If(sending):
                    with m.If(held):
                        m.d.comb += Assert(src == owner)
                    with m.Else():
                        m.d.comb += Assert(out.flit.head)
                    with m.If(out.flit.tail):
                        m.d.sync += held.eq(0)
                    with m.Elif(~held):
                        m.d.sync += [held.eq(1), owner.eq(src)]
                # Invariants linking this view (one cycle behind) to the router's state.
                held_now[o, v] = Mux(sending, ~out.flit.tail, held)
                owner_now[o, v] = Mux(sending & ~held, src, owner)
                m.d.comb += Assert(probe["busy"][o][v] == held_now[o, v])
        for p in Port:
            for v in range(vcs):
                b = probe["inputs"][p][v]
                is_open, open_route = probe["is_open"][p][v], probe["open_route"][p][v]
                turns = self.router.outputs_of[p]  # the outputs built for this input
                one_hot = Cat(*[open_route == 1 << o for o in turns]).any()
                m.d.comb += Assert(~is_open | (open_route == 0) | one_hot)
                for slot, flit in zip(b["slots"], b["stored"], strict=True):
                    route = slot.route
                    m.d.comb += Assert((route & (0b11111 ^ sum(1 << o for o in turns))) == 0)
                    # Only a single-flit packet (a multicast) has several outputs.
                    several = (route & (route - 1)[:5]) != 0
                    # A packet's first flit is a head flit (later ones may be too).
                    m.d.comb += Assert((route == 0) | ~slot.start | flit.head)
                    m.d.comb += Assert(~several | (slot.start & flit.tail))
                for o in turns:
                    needs, youngest, before = self._order(b, o, depth)
                    oldest = b["oldest"][o]
                    slots, stored = b["slots"], b["stored"]
                    # The flits bound for o, oldest first, are whole packets in order ...
                    for (i, j), adjacent in before.items():
                        m.d.comb += Assert(~adjacent | (stored[i].tail == slots[j].start))
                    # ... the youngest one is unfinished exactly when its packet is open ...
                    bound_open = is_open & (open_route == 1 << o)
                    for i in range(depth):
                        m.d.comb += Assert(~youngest[i] | (stored[i].tail == ~bound_open))
                    # ... and the input holds o exactly when its oldest flit there is not a
                    # head (its packet's head has left), or none is, with its packet open.
                    oldest_body = Cat(*[oldest[i] & ~slots[i].start
                                        for i in range(depth)]).any()
                    carrying = Mux(Cat(*needs).any(), oldest_body, bound_open)
                    if o is Port.L:
                        continue
                    m.d.comb += Assert(carrying == (held_now[o, v]
                                                    & (owner_now[o, v] == p * vcs + v)))

    def _delivery(self, m, cfg, probe):
        router, vcs, depth = self.router, cfg.vcs, cfg.depth
        payload = self.track_payload
        first = Signal(init=1)
        m.d.sync += first.eq(0)
        previous = Signal.like(payload)
        m.d.sync += previous.eq(payload)
        m.d.comb += Assume(first | (payload == previous))

        west = self.in_w
        flit = west.flit
        # The tracked flit: a routable single-flit unicast packet through the west link,
        # not for this node (so it leaves on a link) and not back west.
        expected = Signal(5, name="expected_route")
        with m.Switch(Cat(flit.dst.x, flit.dst.y)):
            for (dx, dy), port in router.route_table.items():
                if port not in (Port.L, Port.W):
                    with m.Case(dx | dy << 3):
                        m.d.comb += expected.eq(1 << port)
        class_ok = Cat(*[(flit.vc == v) & (flit.cls.as_value() == cfg.vc_class(v).value)
                         for v in range(vcs)]).any()
        good = flit.head & flit.tail & ~flit.multicast & (expected != 0) & class_ok
        tracked, left = Signal(name="tracked"), Signal(name="left")
        arrive = self.arrive = Signal(name="arrive")
        tvc = Signal(range(vcs))
        tslot = Signal(range(depth))
        route = Signal(5)
        enters = west.valid & (flit.payload == payload)
        # Packet framing upstream: the tracked flit does not arrive inside another packet.
        framing = [Signal(name=f"west_open{v}") for v in range(vcs)]
        for v in range(vcs):
            with m.If(west.valid & (flit.vc == v)):
                m.d.sync += framing[v].eq(~flit.tail & (framing[v] | flit.head))
            # The router's packet state is the upstream's.
            m.d.comb += Assert(probe["is_open"][Port.W][v] == framing[v])
        inside = Cat(*[framing[v] & (flit.vc == v) for v in range(vcs)]).any()
        m.d.comb += Assume(~enters | (~tracked & good & ~inside))
        for port in LINK_PORTS:
            if port is not Port.W:
                link = self.link(port, True)
                m.d.comb += Assume(~(link.valid & (link.flit.payload == payload)))
        for v in range(vcs):
            m.d.comb += Assume(~(self.inject[v].valid & (self.inject[v].payload.payload
                                                         == payload)))
        west_bufs = probe["inputs"][Port.W]
        with m.If(enters):
            m.d.sync += [tracked.eq(1), tvc.eq(flit.vc), route.eq(expected)]
            for v in range(vcs):
                with m.If(flit.vc == v):
                    m.d.comb += Assert(west_bufs[v]["w_en"])  # never discarded
                    for i in range(depth):
                        with m.If(west_bufs[v]["w_sel"][i]):
                            m.d.sync += tslot.eq(i)
        m.d.sync += arrive.eq(0)
        with m.If(tracked & ~left):
            for v in range(vcs):
                for i in range(depth):
                    with m.If((tvc == v) & (tslot == i)):
                        clear = west_bufs[v]["clear"][i]
                        with m.If(clear != 0):
                            m.d.comb += Assert(clear == route)
                            m.d.sync += [left.eq(1), arrive.eq(1)]
        for port in LINK_PORTS:
            out = self.link(port, False)
            shows = out.valid & (out.flit.payload == payload)
            m.d.comb += Assert(shows == (arrive & route[port]))
            with m.If(shows):
                m.d.comb += Assert(out.flit.head & out.flit.tail & (out.flit.vc == tvc))
        for v in range(vcs):
            m.d.comb += Assert(~(self.eject[v].valid
                                 & (self.eject[v].payload.payload == payload)))
        st = SimpleNamespace()
        st.__dict__.update(arrive=arrive, depth=depth, left=left, payload=payload, probe=probe,
                           route=route, tracked=tracked, tslot=tslot, tvc=tvc, vcs=vcs)
        self._delivery_invariants(m, st)

    def _delivery_invariants(self, m: Module, st: SimpleNamespace) -> None:
        """Invariants for induction: where the tracked flit is, and that it is the only flit
        with its payload anywhere in the router."""
        arrive, depth, left, payload, probe = st.arrive, st.depth, st.left, st.payload, st.probe
        route, tracked, tslot, tvc, vcs = st.route, st.tracked, st.tslot, st.tvc, st.vcs
        m.d.comb += [Assert(~left | tracked), Assert(~arrive | left),
                     Assert(~tracked | Cat(*[route == 1 << o for o in LINK_PORTS
                                              if o is not Port.W]).any())]
        for p in Port:
            for v in range(vcs):
                b = probe["inputs"][p][v]
                for i, (slot, entry) in enumerate(zip(b["slots"], b["stored"], strict=True)):
                    in_use = slot.route != 0
                    if p == Port.W:
                        at = tracked & ~left & (tvc == v) & (tslot == i)
                        m.d.comb += Assert(~at | (entry.head & entry.tail & slot.start
                                                  & (slot.route == route)
                                                  & (entry.payload == payload)))
                        m.d.comb += Assert(~(in_use & (entry.payload == payload)) | at)
                    else:
                        m.d.comb += Assert(~(in_use & (entry.payload == payload)))
        for buffer in probe["ejects"]:
            r_ptr, count = buffer["r_ptr"], buffer["count"]
            for i, entry in enumerate(buffer["slots"]):
                position = Mux(r_ptr <= i, i - r_ptr, i + depth - r_ptr)
                m.d.comb += Assert(~((position < count) & (entry.payload == payload)))

    def _reachable(self, m, cfg, probe):
        """Covers: the assumptions leave the interesting behaviour possible (the proofs
        are not vacuous)."""
        east, south = self.out_e, self.out_s
        m.d.comb += [
            Cover(self.arrive),
            Cover(east.valid & east.flit.tail & ~east.flit.head & self.held[Port.E, 0]),
            Cover(probe["credit"][Port.E][0] == 0),
            Cover(self.dropped != 0),
            Cover(east.valid & south.valid & east.flit.multicast & south.flit.multicast
                  & (east.flit.payload == south.flit.payload)),
        ]


@dataclass(frozen=True)
class Proof:
    """One SymbiYosys task: the harness's property groups, the sby mode and depth,
    router parameters over :data:`PARAMS`, and whether `make test` runs it."""

    properties: tuple[str, ...]
    mode: str
    depth: int
    quick: bool = False
    params: tuple[tuple[str, object], ...] = ()


ALL = ("credits", "ownership", "delivery")

#: The proofs ``make formal`` runs. Each property's induction needs the invariants of
#: the ones before it (a buffer never overfilled, a held output's owner), so the later
#: proofs assert those too.
PROOFS = {
    "router": Proof(ALL, "prove", 4, quick=True),
    "router_vc4_d3": Proof(ALL, "prove", 4, params=(("vcs", 4), ("depth", 3))),
    "router_d1": Proof(ALL, "prove", 4, params=(("depth", 1),)),
    "credits": Proof(("credits",), "prove", 4),
    "reachable": Proof(ALL + ("reachable",), "cover", 10),
}
