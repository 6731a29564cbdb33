"""The mesh router: five ports, dimension-ordered routing, credit-based wormhole flow
control over virtual channels, multicast along the XY tree."""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Array, C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.noc import Link, NocConfig, Port, branch_region, xy_route

__all__ = ["Router"]

#: Width of the saturating dropped-packet counter.
COUNTER_BITS = 16
#: Mesh ports, in :class:`Port` order after the local one.
LINK_PORTS = (Port.N, Port.E, Port.S, Port.W)

Routing = Callable[[tuple[int, int], tuple[int, int]], Port]


def round_robin(m: Module, requests: list, name: str) -> list[Signal]:
    """One grant among ``requests``; the last granted requester has the lowest priority
    next time (the priority moves only on a grant). Built as two lowest-set-bit picks
    (``x & -x``), linear in the number of requesters."""
    count = len(requests)
    request = Signal(count, name=f"{name}_request")
    grant = Signal(count, name=f"{name}_grant")
    above = Signal(count, name=f"{name}_above")  # requesters after the last granted one
    m.d.comb += request.eq(Cat(*requests))
    masked = request & above
    pool = Signal(count, name=f"{name}_pool")
    m.d.comb += [
        pool.eq(Mux(masked.any(), masked, request)),
        grant.eq(pool & (~pool + 1)[:count]),
    ]
    with m.If(grant.any()):
        m.d.sync += above.eq(~(grant | (grant - 1)[:count]))
    return [grant[i] for i in range(count)]


def _or_tree(values: list):
    """The OR of ``values``, as a balanced tree."""
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


class Router(wiring.Component):
    """A five-port mesh router (local, N, E, S, W) at position (``x``, ``y``) of a
    ``k`` x ``k`` mesh.

    Packets are flits of :class:`rtl.noc.Flit`. A unicast packet follows ``routing``
    (dimension-ordered XY by default: along x, then along y); a multicast packet (one
    flit with a node mask) is copied along the XY tree: each output gets the flit with
    its mask cut to the nodes beyond that output (:func:`rtl.noc.branch_region`), so a
    node is reached along exactly one branch and never gets two copies.

    Flow control is credit-based wormhole over ``vcs`` virtual channels per link, each
    with a ``depth``-flit buffer at the receiver. VCs ``[0, vcs/2)`` carry requests,
    ``[vcs/2, vcs)`` responses. A packet keeps the VC it was injected on at every hop
    (so it stays in its message class, a blocked class never stops the other, and
    packets of one source, destination and VC arrive in order). A head flit takes its
    VC on the output when no other packet holds it and holds it until its tail flit
    has passed; a single-flit packet holds nothing.

    Allocation is round-robin at every output. VC allocation is a check, since a packet
    keeps its VC: a head flit may go when its VC on the output is free, a body flit
    when the VC is its own. Switch allocation: every input VC requests the outputs its
    flit still needs (its route, or its held output for body flits) when that VC has a
    credit there, and every output grants one requester, round-robin. Every VC of an
    input port requests on its own (the buffers are registers, read in parallel), so
    one arbiter per output replaces the input stage of a separable allocator: several
    VCs of one input may win different outputs in one cycle, and an input VC may win
    several outputs (a multicast flit going out on several branches). A multicast flit
    leaves its buffer when every branch has taken it.

    Packets that cannot be routed are dropped whole and counted: a head flit to a node
    outside the mesh, a multicast with an empty mask or more than one flit, a flit whose
    ``cls`` is not its VC's class; and, each on its own, a body or tail flit with no
    packet open on its VC.
    They return their credits like any other flit, so a drop never wedges the router.

    Parameters
    ----------
    x, y : int
        Position in the mesh.
    k, payload_bits, vcs, depth : int
        See :class:`rtl.noc.NocConfig` (mesh size 2 … 8, payload 1 … 1024 bits, an even
        number of VCs 2 … 8, buffer depth 1 … 16 flits).
    routing : callable
        ``routing((x, y), (dst_x, dst_y)) -> Port`` for unicast packets;
        :func:`rtl.noc.xy_route` by default. The router tabulates it at elaboration;
        :class:`rtl.mesh.Mesh` refuses one whose channel-dependency graph has a cycle.

    Attributes
    ----------
    inject : list of ``vcs`` stream sinks of :class:`rtl.noc.Flit`
        Local injection, one stream per VC (the stream index is the VC; ``flit.vc`` is
        ignored). Ready while that VC's local buffer has room.
    eject : list of ``vcs`` stream sources of :class:`rtl.noc.Flit`
        Local delivery, one stream per VC, so a stalled class never blocks the other.
    in_n, in_e, in_s, in_w : :class:`rtl.noc.Link`, flipped
        Incoming links (the router returns credits).
    out_n, out_e, out_s, out_w : :class:`rtl.noc.Link`
        Outgoing links (the router holds the neighbour's credits).
    dropped : Signal(16), out
        Packets dropped since reset (saturating).
    error : Signal, out
        Sticky: a packet was dropped since reset.

    Latency and throughput
    ----------------------
    - One router cycle per hop: a flit written into an input buffer at the end of cycle
      t is routed, allocated and crosses the switch in cycle t + 1 into the output
      register (the route was computed as the flit was written, during the link
      cycle, and stored with it: off the allocation path, as lookahead routing would
      put it); the output register drives the link in cycle t + 2 and the next
      router's buffer takes it at the end of that cycle. **2 cycles per hop, link
      included**, at zero load.
    - Injection to delivery at zero load: a flit accepted on ``inject`` in cycle t is
      valid on the destination's ``eject`` in cycle t + 2 + 2 x hops.
    - Every output takes one flit per cycle. A credit comes back 2 cycles after the
      downstream router forwards the flit (1 cycle of credit register, 1 of counter), so
      one VC streams at full rate with ``depth`` >= 4.
    """

    def __init__(self, x: int = 0, y: int = 0, *, k: int = 4, payload_bits: int = 32,
                 vcs: int = 2, depth: int = 4, routing: Routing = xy_route):
        self.config = config = NocConfig(k=k, payload_bits=payload_bits, vcs=vcs, depth=depth)
        for name, value in (("x", x), ("y", y)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < k:
                raise ValueError(f"{name} must be an integer in [0, {k}), not {value!r}")
        if not callable(routing):
            raise ValueError(f"routing must be a function (here, dst) -> Port, not {routing!r}")
        self.x, self.y, self.routing = x, y, routing
        #: Unicast output port for every destination of the mesh.
        self.route_table = {}
        for dy in range(k):
            for dx in range(k):
                port = routing((x, y), (dx, dy))
                if not isinstance(port, Port):
                    raise ValueError(f"routing returned {port!r}, not a Port, for {(dx, dy)}")
                nx, ny = x + port.step[0], y + port.step[1]
                if not (0 <= nx < k and 0 <= ny < k):
                    raise ValueError(f"routing sends {(dx, dy)} off the mesh through {port.name} "
                                     f"at {(x, y)}")
                if (port is Port.L) != ((dx, dy) == (x, y)):
                    raise ValueError(f"routing at {(x, y)} delivers {(dx, dy)} through "
                                     f"{port.name}")
                self.route_table[dx, dy] = port
        #: Cycles per hop at zero load, link included.
        self.hop_latency = 2
        flit = config.flit
        link = Link(flit, vcs)
        members = {
            "inject": In(stream.Signature(flit)).array(vcs),
            "eject": Out(stream.Signature(flit)).array(vcs),
        }
        for port in LINK_PORTS:
            members[f"in_{port.name.lower()}"] = In(link)
            members[f"out_{port.name.lower()}"] = Out(link)
        members |= {"dropped": Out(COUNTER_BITS), "error": Out(1)}
        super().__init__(members)
        #: Internal state, filled in by :meth:`elaborate` for the formal harness:
        #: ``credit[o][v]`` (link outputs), ``busy[o][v]``, ``count[p][v]`` (input buffer
        #: occupancy),
        #: ``pop[p][v]``, ``active[p][v]``, ``cur_route[p][v]``, ``sent[p][v]``,
        #: ``discard[p][v]`` (dropping the head of a buffer), ``dropping[p][v]`` (inside a
        #: dropped packet), ``head[p][v]`` and
        #: ``slots[p][v]`` (buffer entries: flit and route), ``buffers`` (every buffer's
        #: ``count``, ``r_ptr``, ``w_ptr``), ``out_src[o]`` (input
        #: port * vcs + input VC of the flit in output register o, link outputs).
        self.probe: dict[str, list] = {}

    def link(self, port: Port, incoming: bool):
        return getattr(self, f"{'in' if incoming else 'out'}_{port.name.lower()}")

    # --- combinational helpers -----------------------------------------------------------

    def _route(self, m: Module, flit, vc: int, name: str) -> Signal:
        """The output ports (one bit per :class:`Port`) a head flit arriving on VC ``vc``
        needs; 0 when it cannot be routed."""
        cfg, here = self.config, (self.x, self.y)
        unicast = Signal(5, name=f"{name}_unicast")
        with m.Switch(Cat(flit.dst.x, flit.dst.y)):
            for (dx, dy), port in self.route_table.items():
                with m.Case(dx | dy << 3):
                    m.d.comb += unicast.eq(1 << port)
        multicast = Cat(*[(flit.mask & branch_region(here, port, cfg.k)) != 0
                          for port in Port])
        route = Signal(5, name=f"{name}_route")
        class_ok = flit.cls.as_value() == cfg.vc_class(vc).value
        m.d.comb += route.eq(Mux(~class_ok, 0,
                                 Mux(flit.multicast, Mux(flit.tail, multicast, 0), unicast)))
        return route

    def _buffer(self, m: Module, layout, name: str) -> dict:
        """A ``depth``-entry register FIFO: ``w_en``/``w_data`` in, ``r_data`` (the head,
        valid while ``count`` != 0) and ``r_en`` out. Writes and reads may coincide."""
        depth = self.config.depth
        slots = Array(Signal(layout, name=f"{name}_slot{i}") for i in range(depth))
        w_ptr = Signal(range(depth), name=f"{name}_wptr")
        r_ptr = Signal(range(depth), name=f"{name}_rptr")
        count = Signal(range(depth + 1), name=f"{name}_count")
        w_en, r_en = Signal(name=f"{name}_w_en"), Signal(name=f"{name}_r_en")
        w_data = Signal(layout, name=f"{name}_w_data")
        r_data = Signal(layout, name=f"{name}_r_data")
        m.d.comb += r_data.eq(slots[r_ptr])
        with m.If(w_en):
            m.d.sync += slots[w_ptr].eq(w_data)
            m.d.sync += w_ptr.eq(Mux(w_ptr == depth - 1, 0, w_ptr + 1))
        with m.If(r_en):
            m.d.sync += r_ptr.eq(Mux(r_ptr == depth - 1, 0, r_ptr + 1))
        m.d.sync += count.eq(count + w_en - r_en)
        return {"w_en": w_en, "w_data": w_data, "r_en": r_en, "r_data": r_data, "count": count,
                "slots": list(slots), "r_ptr": r_ptr, "w_ptr": w_ptr}

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        vcs, depth, here = cfg.vcs, cfg.depth, (self.x, self.y)
        entry = data.StructLayout({"flit": cfg.flit, "route": 5})
        ports = list(Port)

        # --- input buffers, one per (input port, VC); the route is computed on the way in
        bufs = [[self._buffer(m, entry, f"in{p.name}_vc{v}") for v in range(vcs)]
                for p in ports]
        for v in range(vcs):
            b, inject = bufs[Port.L][v], self.inject[v]
            m.d.comb += [
                inject.ready.eq(b["count"] != depth),
                b["w_en"].eq(inject.valid & inject.ready),
                b["w_data"].flit.eq(inject.payload),
                b["w_data"].flit.vc.eq(v),
                b["w_data"].route.eq(self._route(m, inject.payload, v, f"inL_vc{v}")),
            ]
        for p in LINK_PORTS:
            link = self.link(p, incoming=True)
            for v in range(vcs):
                b = bufs[p][v]
                m.d.comb += [
                    b["w_en"].eq(link.valid & (link.flit.vc == v)),
                    b["w_data"].flit.eq(link.flit),
                    # Never back where it came from: such a route is dropped, not wedged.
                    b["w_data"].route.eq(self._route(m, link.flit, v, f"in{p.name}_vc{v}")
                                         & ~(1 << p)),
                ]

        # --- output state: credits (links) or ejection buffer room (local), VC holders ---
        credit = {o: [Signal(range(depth + 1), init=depth, name=f"credit_{o.name}{v}")
                      for v in range(vcs)] for o in LINK_PORTS}
        busy = [[Signal(name=f"busy_{o.name}{v}") for v in range(vcs)] for o in ports]
        ejects = [self._buffer(m, cfg.flit, f"eject_vc{v}") for v in range(vcs)]
        has_credit = [[(ejects[v]["count"] != depth) if o is Port.L else (credit[o][v] != 0)
                       for v in range(vcs)] for o in ports]

        # --- input VC state and requests ------------------------------------------------
        active = [[Signal(name=f"active_{p.name}{v}") for v in range(vcs)] for p in ports]
        dropping = [[Signal(name=f"dropping_{p.name}{v}") for v in range(vcs)] for p in ports]
        cur_route = [[Signal(5, name=f"curroute_{p.name}{v}") for v in range(vcs)]
                     for p in ports]
        sent = [[Signal(5, name=f"sent_{p.name}{v}") for v in range(vcs)] for p in ports]
        discard = [[Signal(name=f"discard_{p.name}{v}") for v in range(vcs)] for p in ports]
        drop_event = [[Signal(name=f"dropev_{p.name}{v}") for v in range(vcs)] for p in ports]
        # want[p][v][o]: input VC (p, v) asks output o for its head flit this cycle.
        want = [[[Signal(name=f"want_{p.name}{v}_{o.name}") for o in ports]
                 for v in range(vcs)] for p in ports]
        for p in ports:
            for v in range(vcs):
                b = bufs[p][v]
                head = b["r_data"]
                valid = b["count"] != 0
                is_head = head.flit.head
                with m.If(valid):
                    with m.If(dropping[p][v]):  # the rest of a dropped packet
                        m.d.comb += discard[p][v].eq(1)
                        m.d.sync += dropping[p][v].eq(~head.flit.tail)
                    with m.Elif(active[p][v]):
                        for o in ports:
                            m.d.comb += want[p][v][o].eq(
                                cur_route[p][v][o] & has_credit[o][v])
                    with m.Elif(is_head & (head.route != 0)):
                        for o in ports:
                            m.d.comb += want[p][v][o].eq(
                                head.route[o] & ~sent[p][v][o] & ~busy[o][v]
                                & has_credit[o][v])
                    with m.Else():  # unroutable head, or a body/tail flit of no packet
                        m.d.comb += [discard[p][v].eq(1), drop_event[p][v].eq(1)]
                        m.d.sync += dropping[p][v].eq(is_head & ~head.flit.tail)

        # --- switch allocation: one round-robin arbiter per output ----------------------
        sources = [(p, v) for p in ports for v in range(vcs)]
        grant = {}  # (o, p, v) -> grant signal
        out_valid = {o: Signal(name=f"out_valid_{o.name}") for o in LINK_PORTS}
        out_flit = {o: Signal(cfg.flit, name=f"out_flit_{o.name}") for o in LINK_PORTS}
        out_src = {o: Signal(range(len(sources)), name=f"out_src_{o.name}") for o in LINK_PORTS}
        for o in ports:
            # No U-turns: a link output never serves its own input.
            eligible = [(p, v) for p, v in sources if p is Port.L or p is not o]
            grants = round_robin(m, [want[p][v][o] for p, v in eligible], f"sw_{o.name}")
            chosen = list(zip(eligible, grants, strict=True))
            for (p, v), g in chosen:
                grant[o, p, v] = g
            # The crossbar: grants are one-hot, so an AND-OR tree (no priority chain).
            flit = Signal(cfg.flit, name=f"xbar_{o.name}")
            src = Signal(range(len(sources)), name=f"xbar_src_{o.name}")
            picked = [Mux(g, bufs[p][v]["r_data"].flit.as_value(), 0) for (p, v), g in chosen]
            m.d.comb += [
                flit.eq(_or_tree(picked)),
                flit.vc.eq(_or_tree([Mux(g, v, 0) for (_, v), g in chosen])),
                src.eq(_or_tree([Mux(g, sources.index(pv), 0) for pv, g in chosen])),
            ]
            region = branch_region(here, o, cfg.k)
            out_data = Signal(cfg.flit, name=f"xbar_cut_{o.name}")
            m.d.comb += [out_data.eq(flit),
                         out_data.mask.eq(Mux(flit.head & flit.multicast, flit.mask & region,
                                              flit.mask))]
            # Per VC, straight from the grants (the VC of a source is fixed).
            fires = [Cat(*[g for (_, w), g in chosen if w == v]).any()
                     for v in range(vcs)]
            # Output VC holders: a head without a tail takes the VC, a tail frees it.
            for v in range(vcs):
                with m.If(fires[v]):
                    with m.If(flit.tail):
                        m.d.sync += busy[o][v].eq(0)
                    with m.Elif(flit.head):
                        m.d.sync += busy[o][v].eq(1)
            if o is Port.L:
                for v in range(vcs):
                    e = ejects[v]
                    m.d.comb += [e["w_en"].eq(fires[v]), e["w_data"].eq(out_data)]
            else:
                out = self.link(o, incoming=False)
                m.d.sync += [out_valid[o].eq(Cat(*grants).any()), out_flit[o].eq(out_data),
                             out_src[o].eq(src)]
                m.d.comb += [out.valid.eq(out_valid[o]), out.flit.eq(out_flit[o])]
                for v in range(vcs):
                    m.d.sync += credit[o][v].eq(credit[o][v] - fires[v] + out.credit[v])
        for v in range(vcs):
            e, eject = ejects[v], self.eject[v]
            m.d.comb += [eject.valid.eq(e["count"] != 0), eject.payload.eq(e["r_data"]),
                         e["r_en"].eq(eject.valid & eject.ready)]

        # --- input VC updates: branches taken, pops, packet state, credits back -----------
        pops = [[Signal(name=f"pop_{p.name}{v}") for v in range(vcs)] for p in ports]
        for p in ports:
            for v in range(vcs):
                won = Cat(*[grant.get((o, p, v), C(0, 1)) for o in ports])
                head = bufs[p][v]["r_data"]
                with m.If(active[p][v]):
                    m.d.comb += pops[p][v].eq(won.any())
                    with m.If(won.any() & head.flit.tail):
                        m.d.sync += active[p][v].eq(0)
                with m.Elif(won.any()):
                    done = sent[p][v] | won
                    with m.If(done == head.route):
                        m.d.comb += pops[p][v].eq(1)
                        m.d.sync += sent[p][v].eq(0)
                        with m.If(~head.flit.tail):  # a unicast packet opens: hold its output
                            m.d.sync += [active[p][v].eq(1), cur_route[p][v].eq(won)]
                    with m.Else():
                        m.d.sync += sent[p][v].eq(done)
                m.d.comb += bufs[p][v]["r_en"].eq(pops[p][v] | discard[p][v])
            if p is not Port.L:
                link = self.link(p, incoming=True)
                m.d.sync += link.credit.eq(Cat(bufs[p][v]["r_en"] for v in range(vcs)))

        # --- drop counter ------------------------------------------------------------------
        limit = (1 << COUNTER_BITS) - 1
        total = sum(drop_event[p][v] for p in ports for v in range(vcs))
        m.d.sync += self.dropped.eq(Mux(self.dropped + total >= limit, limit,
                                        self.dropped + total))
        with m.If(total != 0):
            m.d.sync += self.error.eq(1)

        self.probe.update(credit=credit, busy=busy, active=active, cur_route=cur_route,
                          pop=pops, discard=discard, dropping=dropping, out_src=out_src,
                          sent=sent,
                          count=[[b["count"] for b in row] for row in bufs],
                          head=[[b["r_data"] for b in row] for row in bufs],
                          slots=[[b["slots"] for b in row] for row in bufs],
                          eject_count=[e["count"] for e in ejects],
                          buffers=[b for row in bufs for b in row] + ejects)
        return m
