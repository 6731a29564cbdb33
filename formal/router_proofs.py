"""Formal properties of the router: an Amaranth harness around one :class:`Router` whose
inputs are free (the solver picks them every cycle), with assumptions that model
well-behaved neighbours and assertions for each property.

The router proved is the centre of a 3 x 3 mesh (all four neighbours exist) with 2 VCs,
2-flit buffers and 4-bit payloads: every mechanism at its smallest size.

Properties (each a separate proof, see :data:`PROOFS`):

- ``credits``: every credit counter equals the buffer slots its neighbour has free
  (credits + flits in the neighbour's buffer or on the link == depth), so it can never
  overflow or underflow; every input buffer, likewise, never takes more flits than it
  has room for.
- ``ownership``: once a head flit of a multi-flit packet has left through an output
  VC, every flit on that output VC comes from the same input VC until the tail flit;
  no other packet's flit interleaves. Strengthened by the router's own holder state.
- ``delivery``: one chosen flit entering through the west link (a single-flit
  packet whose payload no other flit carries) leaves exactly once, on the output XY
  routing names, the cycle after it reaches the head of its buffer, unchanged; it
  never appears anywhere else or a second time.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, ResetSignal, Signal
from amaranth.hdl import Assert, Assume, Fragment
from amaranth.lib import wiring

from rtl.noc import Port
from rtl.router import LINK_PORTS, Router

__all__ = ["PARAMS", "PROOFS", "RouterHarness"]

#: The router under proof.
PARAMS = {"x": 1, "y": 1, "k": 3, "payload_bits": 2, "vcs": 2, "depth": 2}


class RouterHarness(wiring.Component):
    """The router with its ports on the harness's boundary (free inputs), neighbour
    models as assumptions, and the assertions of ``properties``."""

    def __init__(self, properties: tuple[str, ...], **params):
        unknown = set(properties) - {"credits", "ownership", "delivery"}
        if unknown:
            raise ValueError(f"unknown properties {sorted(unknown)}")
        self.properties = properties
        self.router = Router(**{**PARAMS, **params})
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
                credit, count = probe["credit"][port][v], probe["count"][port][v]
                on_link = outgoing.valid & (outgoing.flit.vc == v)
                m.d.comb += [
                    Assert(credit <= depth),
                    Assert(credit + self.down[port, v] + on_link == depth),
                    Assert(count <= depth),
                    Assert(self.up[port, v] + count + incoming.credit[v] == depth),
                ]
        for v in range(cfg.vcs):
            m.d.comb += [Assert(probe["count"][Port.L][v] <= depth),
                         Assert(probe["eject_count"][v] <= depth)]

    def _ownership(self, m, cfg, probe):
        vcs = cfg.vcs
        for o in LINK_PORTS:
            out = self.link(o, False)
            for v in range(vcs):
                held = Signal(name=f"held_{o.name}{v}")
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
                held_now = Mux(sending, ~out.flit.tail, held)
                owner_now = Mux(sending & ~held, src, owner)
                m.d.comb += Assert(probe["busy"][o][v] == held_now)
                for p in Port:
                    if p is o:
                        continue
                    holds = probe["active"][p][v] & probe["cur_route"][p][v][o]
                    m.d.comb += Assert(holds == (held_now & (owner_now == p * vcs + v)))
        for p in Port:
            for v in range(vcs):
                route = probe["cur_route"][p][v]
                one_hot = Cat(*[route == 1 << o for o in Port
                                if o is Port.L or o is not p]).any()  # never a U-turn
                m.d.comb += Assert(~probe["active"][p][v] | one_hot)
                m.d.comb += Assert(~probe["active"][p][v] | (probe["sent"][p][v] == 0))

    def _delivery(self, m, cfg, probe):
        router, vcs = self.router, cfg.vcs
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
        seen = Signal()
        tracked, left, arrive = Signal(), Signal(), Signal()
        tvc = Signal(range(vcs))
        route = Signal(5)
        ahead = Signal(range(cfg.depth + 1))
        enters = west.valid & (flit.payload == payload)
        # Packet framing upstream: the tracked flit does not arrive inside another packet.
        framing = [Signal(name=f"west_open{v}") for v in range(vcs)]
        for v in range(vcs):
            with m.If(west.valid & (flit.vc == v)):
                m.d.sync += framing[v].eq(~flit.tail & (framing[v] | flit.head))
        inside = Cat(*[framing[v] & (flit.vc == v) for v in range(vcs)]).any()
        m.d.comb += Assume(~enters | (~seen & good & ~inside))
        for port in LINK_PORTS:
            if port is not Port.W:
                link = self.link(port, True)
                m.d.comb += Assume(~(link.valid & (link.flit.payload == payload)))
        for v in range(vcs):
            m.d.comb += Assume(~(self.inject[v].valid & (self.inject[v].payload.payload
                                                         == payload)))
        reads = [probe["pop"][Port.W][v] | probe["discard"][Port.W][v] for v in range(vcs)]
        counts = [probe["count"][Port.W][v] for v in range(vcs)]
        with m.If(enters):
            m.d.sync += [seen.eq(1), tracked.eq(1), tvc.eq(flit.vc), route.eq(expected)]
            with m.Switch(flit.vc):
                for v in range(vcs):
                    with m.Case(v):
                        m.d.sync += ahead.eq(counts[v] - reads[v])
        m.d.sync += arrive.eq(0)
        with m.If(tracked & ~left):
            for v in range(vcs):
                with m.If(tvc == v):
                    m.d.comb += Assert(ahead < counts[v])
                    with m.If(reads[v]):
                        with m.If(ahead == 0):
                            m.d.comb += Assert(probe["pop"][Port.W][v])
                            m.d.sync += [left.eq(1), arrive.eq(1)]
                        with m.Else():
                            m.d.sync += ahead.eq(ahead - 1)
        for port in LINK_PORTS:
            out = self.link(port, False)
            shows = out.valid & (out.flit.payload == payload)
            m.d.comb += Assert(shows == (arrive & route[port]))
            with m.If(shows):
                m.d.comb += Assert(out.flit.head & out.flit.tail & (out.flit.vc == tvc))
        for v in range(vcs):
            m.d.comb += Assert(~(self.eject[v].valid
                                 & (self.eject[v].payload.payload == payload)))


#: name -> (properties, sby mode, depth, quick): ``quick`` proofs also run in `make test`.
PROOFS = {
    "credits": (("credits",), "prove", 4, True),
    "ownership": (("ownership",), "bmc", 10, False),
    "delivery": (("delivery",), "bmc", 10, False),
}
