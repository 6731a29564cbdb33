"""The mesh router: five ports, dimension-ordered routing, credit-based wormhole flow
control over virtual channels, multicast along the XY tree."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

from amaranth import Array, C, Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from spec.noc import DEFAULT_DEPTH, Link, NocConfig, Port, branch_region, xy_route

__all__ = ["Router"]

#: Width of the saturating dropped-packet counter.
COUNTER_BITS = 16
#: The read ports of an input VC's buffer, each with the outputs it serves: one per cycle
#: per port, so an input VC sends up to two flits a cycle (X-bound or local, and Y-bound).
#: Under XY routing a flit from the north or south input goes south/north or local, and
#: one from the east or west goes on, turns, or is local: each input's outputs are split
#: between the two ports.
READ_PORTS = ((Port.L, Port.E, Port.W), (Port.N, Port.S))
READ_PORT_OF = {o: r for r, group in enumerate(READ_PORTS) for o in group}
#: Mesh ports, in :class:`Port` order after the local one.
LINK_PORTS = (Port.N, Port.E, Port.S, Port.W)

Routing = Callable[[tuple[int, int], tuple[int, int]], Port]


class RoundRobin:
    """A round-robin arbiter over ``count`` requesters: the last one *served* has the
    lowest priority next time. :meth:`pick` makes the grant; :meth:`advance` moves the
    priority, so an input arbiter can move only when its pick wins downstream."""

    def __init__(self, m: Module, count: int, name: str):
        self.m, self.count, self.name = m, count, name
        # Requesters after the last served (none to keep for a single requester).
        self.above = Signal(count, name=f"{name}_above") if count > 1 else None

    def pick(self, requests: list) -> list[Signal]:
        """One grant among ``requests`` (two lowest-set-bit picks, ``x & -x``: linear in
        the number of requesters, no priority chain)."""
        count, name = self.count, self.name
        if count == 1:
            return list(requests)
        request = Signal(count, name=f"{name}_request")
        pool = Signal(count, name=f"{name}_pool")
        grant = Signal(count, name=f"{name}_grant")
        masked = request & self.above
        self.m.d.comb += [
            request.eq(Cat(*requests)),
            pool.eq(Mux(masked.any(), masked, request)),
            grant.eq(pool & (~pool + 1)[:count]),
        ]
        return [grant[i] for i in range(count)]

    def advance(self, served) -> None:
        """Give ``served`` (one-hot or none: a list of bits or a value) the lowest priority
        from the next cycle."""
        if self.count == 1:
            return
        served = Cat(*served)
        with self.m.If(served.any()):
            self.m.d.sync += self.above.eq(~(served | (served - 1)[:self.count]))


def _index(one_hot: Value) -> Value:
    """The index of the set bit of ``one_hot`` (0 when none is)."""
    return _or_tree([Mux(one_hot[i], i, 0) for i in range(len(one_hot))])


def _or_tree(values: list):
    """The OR of ``values``, as a balanced tree."""
    while len(values) > 1:
        values = [values[i] | values[i + 1] if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]


def _oldest_per_output(m: Module, name: str, slots: list, is_older) -> tuple[list, list]:
    """Per output: the oldest slot whose route still needs it (one-hot over slots) and
    whether that flit starts its packet."""
    depth = len(slots)
    oldest, start_for = [], []
    for o in Port:
        pick = Signal(depth, name=f"{name}_oldest_{o.name}")
        m.d.comb += pick.eq(Cat(*[
            slots[i].route[o] & ~Cat(*[slots[j].route[o] & is_older(j, i)
                                      for j in range(depth) if j != i]).any()
            for i in range(depth)]))
        oldest.append(pick)
        start_for.append((pick & Cat(*[s.start for s in slots])).any())
    return oldest, start_for


class Router(wiring.Component):
    """A five-port mesh router (local, N, E, S, W) at position (``x``, ``y``) of a
    ``k`` x ``k`` mesh.

    Packets are flits of :class:`spec.noc.Flit`. A unicast packet follows ``routing``
    (dimension-ordered XY by default: along x, then along y); a multicast packet (one
    flit with a node mask) is copied along the XY tree: each output gets the flit with
    its mask cut to the nodes beyond that output (:func:`spec.noc.branch_region`), so a
    node is reached along exactly one branch and never gets two copies.

    Flow control is credit-based wormhole over ``vcs`` virtual channels per link, each
    with a ``depth``-flit buffer at the receiver. VCs ``[0, vcs/2)`` carry requests,
    ``[vcs/2, vcs)`` responses. A packet keeps the VC it was injected on at every hop
    (so it stays in its message class, a blocked class never stops the other, and
    packets of one source, destination and VC arrive in order). A head flit takes its
    VC on the output when no other packet holds it and holds it until its tail flit
    has passed; a single-flit packet holds nothing.

    Input buffers are not FIFOs: for each output, an input VC offers the *oldest flit
    bound for it* (an age order over the buffer's slots), so a flit waiting for a busy
    output does not hold up a younger one bound elsewhere (no head-of-line blocking;
    uniform traffic on one VC saturates a FIFO router near 0.59 of capacity), while the
    flits one input VC sends through one output keep their order: packets of one
    source, destination and VC arrive in order, and a packet's flits follow its head.
    A buffer has two read ports (:data:`READ_PORTS`: local/east/west and north/south),
    so an input VC sends up to two flits a cycle.

    Allocation is separable, input first, one round, with round-robin arbiters. VC
    allocation is a check, since a packet keeps its VC: a packet's first flit may go
    when its VC on the output is free, the rest follow it (their head holds that VC).
    Each read port's arbiter picks one output of its group whose oldest flit may go (a
    credit there, and the VC free for a first flit) and offers that flit; every output
    grants one of the offers it gets. An input arbiter's priority moves only when its
    offer is granted, so offers that collide spread out over the next cycles (as in
    iSLIP). A multicast flit goes out through up to one branch per read port a cycle and
    leaves its slot when every branch has taken it.

    Packets that cannot be routed are dropped whole and counted, as they arrive (they
    never take a slot): a head flit to a node outside the mesh, a multicast with an
    empty mask or more than one flit, a flit whose ``cls`` is not its VC's class, a
    flit that needs an output its input is not built with (:attr:`outputs_of`); and,
    each on its own, a body or tail flit with no packet open on its VC. A flit that
    arrives while a packet is open on its VC is part of that packet, head bit or not.
    Dropped flits return their credits like any other, so a drop never wedges the
    router.

    Parameters
    ----------
    x, y : int
        Position in the mesh.
    k, payload_bits, vcs, depth : int
        See :class:`spec.noc.NocConfig` (mesh size 2 … 8, payload 1 … 1024 bits, an even
        number of VCs 2 … 8, buffer depth 1 … 16 flits).
    routing : callable
        ``routing((x, y), (dst_x, dst_y)) -> Port`` for unicast packets;
        :func:`spec.noc.xy_route` by default. The router tabulates it at elaboration;
        :class:`rtl.mesh.Mesh` refuses one whose channel-dependency graph has a cycle.

    Attributes
    ----------
    inject : list of ``vcs`` stream sinks of :class:`spec.noc.Flit`
        Local injection, one stream per VC (the stream index is the VC; ``flit.vc`` is
        ignored). Ready while that VC's local buffer has room.
    eject : list of ``vcs`` stream sources of :class:`spec.noc.Flit`
        Local delivery, one stream per VC, so a stalled class never blocks the other.
    in_n, in_e, in_s, in_w : :class:`spec.noc.Link`, flipped
        Incoming links (the router returns credits).
    out_n, out_e, out_s, out_w : :class:`spec.noc.Link`
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
    - Every output takes one flit per cycle. A credit is back the cycle after the
      downstream router forwards the flit (its credit register) and counts at once, so
      a buffer slot serves a new flit every 3 cycles at best and one VC streams at full
      rate with ``depth`` >= 3. When several slots of one input VC free in one cycle,
      their credits go back one per cycle.
    """

    def __init__(self, x: int = 0, y: int = 0, *, k: int = 4, payload_bits: int = 32,
                 vcs: int = 2, depth: int = DEFAULT_DEPTH, routing: Routing = xy_route):
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
        #: The outputs a flit arriving on each input can need: from a link, those of the
        #: destinations the neighbour sends this way (``routing`` at the neighbour) and of
        #: the XY multicast tree's branches there; no U-turns. Only these (input, output)
        #: pairs are built; a flit needing any other output is dropped as unroutable.
        self.outputs_of = {p: self._outputs_of(p) for p in Port}
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
        #: ``credit[o][v]`` (link outputs), ``busy[o][v]`` (output VC held by a packet),
        #: ``is_open[p][v]``, ``open_route[p][v]``, ``discard[p][v]`` (a flit dropped as
        #: it arrives), ``pending[p][v]`` (credits not yet returned), ``inputs[p][v]``
        #: (the input buffers, see :meth:`_input_buffer`), ``ejects[v]`` (the ejection
        #: FIFOs), ``out_src[o]`` (input port * vcs + input VC of the flit in output
        #: register o, link outputs).
        self.probe: dict[str, list] = {}
        #: Out (not a port): the router holds a flit, a flit on an output link or a credit
        #: to return. While it does not and nothing arrives, no register changes (what
        #: :class:`rtl.mesh.Mesh` gates its clock on in simulation).
        self.holding = Signal()
        #: Set before elaboration to give each input buffer's probe ``stored[i]``, the
        #: flit in slot i (a read port per slot: for the formal harness).
        self.observe = False

    def _outputs_of(self, p: Port) -> tuple[Port, ...]:
        """The outputs flits arriving on input ``p`` may take (see :attr:`outputs_of`)."""
        k, (x, y) = self.config.k, (self.x, self.y)
        if p is Port.L:
            outputs = set(self.route_table.values())
            outputs |= {o for o in Port if branch_region((x, y), o, k)}
            return tuple(o for o in Port if o in outputs)
        sender = (x + p.step[0], y + p.step[1])
        if not (0 <= sender[0] < k and 0 <= sender[1] < k):
            return ()  # the mesh's edge: nothing arrives
        towards_us = p.opposite
        outputs = {port for dst, port in self.route_table.items()
                   if self.routing(sender, dst) is towards_us}
        ahead = branch_region(sender, towards_us, k)
        outputs |= {o for o in Port if branch_region((x, y), o, k) & ahead}
        return tuple(o for o in Port if o in outputs and o is not p)

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

    def _input_buffer(self, m: Module, name: str, outputs: tuple[Port, ...]) -> dict:
        """One input VC's buffer: ``depth`` slots of (flit, route, start: the flit opens
        its packet), served oldest-first *per output* (not first-in first-out). The
        route and start bits are registers; the flits sit in a small RAM with a write
        port and one read port per :data:`READ_PORTS` group (on an FPGA, LUT RAM: the
        read ports are the RAM's own multiplexers, which keeps the wide slot-select
        logic out of the fabric).

        A slot is in use while its route has an output left to serve. Each output takes
        the oldest flit that still needs it (``oldest[o]``, one-hot over slots, from an
        age order kept as one bit per pair of slots), so a flit waiting for a busy
        output does not block a younger one bound elsewhere (no head-of-line blocking),
        while the flits that share an output keep their arrival order. A write fills the
        lowest free slot; ``clear[i]`` takes outputs off slot i's route (the slot is
        freed when none are left). Route bits of outputs not in ``outputs`` stay zero."""
        cfg, depth = self.config, self.config.depth
        entry = data.StructLayout({"flit": cfg.flit, "route": 5, "start": 1})
        slots = [Signal(data.StructLayout({"route": 5, "start": 1}), name=f"{name}_slot{i}")
                 for i in range(depth)]
        store = m.submodules[f"{name}_store"] = Memory(shape=cfg.flit, depth=depth, init=[])
        # older[i, j], i < j: slot i holds the older flit (meaningful while both are used).
        older = {(i, j): Signal(name=f"{name}_older{i}_{j}")
                 for i in range(depth) for j in range(i + 1, depth)}

        def is_older(i, j):
            return older[i, j] if i < j else ~older[j, i]

        used = Signal(depth, name=f"{name}_used")
        m.d.comb += used.eq(Cat(*[s.route != 0 for s in slots]))
        count = Signal(range(depth + 1), name=f"{name}_count")
        m.d.comb += count.eq(sum(used[i] for i in range(depth)))
        free = ~used
        w_sel = Signal(depth, name=f"{name}_wsel")
        m.d.comb += w_sel.eq(free & (~free + 1)[:depth])
        w_en = Signal(name=f"{name}_w_en")
        w_data = Signal(entry, name=f"{name}_w_data")
        oldest, start_for = _oldest_per_output(m, name, slots, is_older)
        # The read ports: port r reads the oldest flit bound for the output ``offer[r]``
        # (one-hot or none: the output it offers a flit to this cycle).
        offer, flit_for = [], []
        for r in range(len(READ_PORTS)):
            offer.append(Signal(5, name=f"{name}_offer{r}"))
            read = Signal(depth, name=f"{name}_read{r}")
            m.d.comb += read.eq(_or_tree([Mux(offer[r][o], oldest[o], 0) for o in Port]))
            port = store.read_port(domain="comb")
            m.d.comb += port.addr.eq(_index(read))
            flit_for.append(port.data)
        clear = [Signal(5, name=f"{name}_clear{i}") for i in range(depth)]
        built = sum(1 << o for o in outputs)  # constant zeros elsewhere, for synthesis
        remaining = [slots[i].route & ~clear[i] & built for i in range(depth)]
        freed = Signal(range(depth + 1), name=f"{name}_freed")
        m.d.comb += freed.eq(sum(used[i] & (remaining[i] == 0) for i in range(depth)))
        # The formal harness reads every slot's flit (``observe``): one more port each.
        stored = []
        for i in range(depth if self.observe else 0):
            port = store.read_port(domain="comb")
            m.d.comb += port.addr.eq(i)
            stored.append(port.data)
        write = store.write_port()
        m.d.comb += [write.en.eq(w_en), write.addr.eq(_index(w_sel)), write.data.eq(w_data.flit)]
        for i in range(depth):
            m.d.sync += slots[i].route.eq(remaining[i])
            with m.If(w_en & w_sel[i]):
                m.d.sync += [slots[i].route.eq(w_data.route & built),
                             slots[i].start.eq(w_data.start)]
                for j in range(depth):
                    if j < i:
                        m.d.sync += older[j, i].eq(1)
                    elif j > i:
                        m.d.sync += older[i, j].eq(0)
        return {"w_en": w_en, "w_data": w_data, "w_sel": w_sel, "count": count, "used": used,
                "slots": slots, "older": older, "is_older": is_older, "oldest": oldest,
                "start": start_for, "offer": offer, "flit": flit_for, "clear": clear,
                "freed": freed, "stored": stored}

    def elaborate(self, platform):
        m = Module()
        st = SimpleNamespace()
        for stage in (self._inputs, self._output_state, self._allocate, self._crossbar,
                      self._free_slots, self._drops):
            stage(m, st)
        self.probe.update(credit=st.credit, busy=st.busy, out_src=st.out_src,
                          discard=st.discard, is_open=st.is_open, open_route=st.open_route,
                          pending=st.pending, inputs=st.bufs, ejects=st.ejects)
        return m

    def _inputs(self, m: Module, st: SimpleNamespace) -> None:
        """Input buffers, one per (input port, VC); the route is computed on the way in,
        and a flit that cannot be routed never takes a slot."""
        cfg, ports = self.config, list(Port)
        vcs, depth = cfg.vcs, cfg.depth
        bufs = [[self._input_buffer(m, f"in{p.name}_vc{v}", self.outputs_of[p])
                 for v in range(vcs)] for p in ports]
        # Per input VC: a packet is open (head in, tail not yet), and the route its
        # body flits take (0: the packet is being dropped).
        is_open = [[Signal(name=f"open_{p.name}{v}") for v in range(vcs)] for p in ports]
        open_route = [[Signal(5, name=f"openroute_{p.name}{v}") for v in range(vcs)]
                      for p in ports]
        discard = [[Signal(name=f"discard_{p.name}{v}") for v in range(vcs)] for p in ports]
        drop_event = [[Signal(name=f"dropev_{p.name}{v}") for v in range(vcs)] for p in ports]
        for p in ports:
            link = None if p is Port.L else self.link(p, incoming=True)
            for v in range(vcs):
                b = bufs[p][v]
                if link is None:
                    inject = self.inject[v]
                    flit = inject.payload
                    m.d.comb += inject.ready.eq(b["count"] != depth)
                    arrives = inject.valid & inject.ready
                    route = self._route(m, flit, v, f"inL_vc{v}")
                else:
                    flit = link.flit
                    arrives = link.valid & (link.flit.vc == v)
                    # Only the outputs this input can need (never back where it came
                    # from): any other route is dropped whole, not wedged.
                    needed = self._route(m, flit, v, f"in{p.name}_vc{v}")
                    allowed = sum(1 << o for o in self.outputs_of[p])
                    # (masked as well, so that synthesis sees the route bits of the
                    # outputs not built as constant zeros and removes them)
                    route = Mux((needed & ~allowed) == 0, needed & allowed, 0)
                m.d.comb += [b["w_data"].flit.eq(flit), b["w_data"].flit.vc.eq(v),
                             b["w_data"].route.eq(Mux(is_open[p][v], open_route[p][v], route)),
                             b["w_data"].start.eq(~is_open[p][v])]
                with m.If(arrives):
                    with m.If(is_open[p][v]):  # the rest of an open packet
                        with m.If(open_route[p][v] != 0):
                            m.d.comb += b["w_en"].eq(1)
                        with m.Else():
                            m.d.comb += discard[p][v].eq(1)
                        with m.If(flit.tail):
                            m.d.sync += is_open[p][v].eq(0)
                    with m.Elif(flit.head & (route != 0)):
                        m.d.comb += b["w_en"].eq(1)
                        m.d.sync += [is_open[p][v].eq(~flit.tail), open_route[p][v].eq(route)]
                    with m.Else():  # unroutable head, or a body/tail flit of no packet
                        m.d.comb += [discard[p][v].eq(1), drop_event[p][v].eq(1)]
                        m.d.sync += [is_open[p][v].eq(flit.head & ~flit.tail),
                                     open_route[p][v].eq(0)]
        st.__dict__.update(bufs=bufs, is_open=is_open, open_route=open_route,
                           discard=discard, drop_event=drop_event)

    def _output_state(self, m: Module, st: SimpleNamespace) -> None:
        """Output state: credits (links) or ejection buffer room (local), VC holders."""
        cfg, ports = self.config, list(Port)
        vcs, depth = cfg.vcs, cfg.depth
        credit = {o: [Signal(range(depth + 1), init=depth, name=f"credit_{o.name}{v}")
                      for v in range(vcs)] for o in LINK_PORTS}
        busy = [[Signal(name=f"busy_{o.name}{v}") for v in range(vcs)] for o in ports]
        ejects = [self._buffer(m, cfg.flit, f"eject_vc{v}") for v in range(vcs)]
        # A credit coming back this cycle counts at once (it arrives from a register).
        has_credit = [[(ejects[v]["count"] != depth) if o is Port.L
                       else (credit[o][v] != 0) | self.link(o, incoming=False).credit[v]
                       for v in range(vcs)] for o in ports]
        st.__dict__.update(credit=credit, busy=busy, ejects=ejects, has_credit=has_credit)

    def _allocate(self, m: Module, st: SimpleNamespace) -> None:
        """Switch allocation: separable, input first, one round (the comment below)."""
        ports, vcs = list(Port), self.config.vcs
        bufs, busy, has_credit = st.bufs, st.busy, st.has_credit
        # Output o is open to
        # input VC (p, v) when the oldest flit there has a credit and, if it starts a
        # packet, the output's VC is free (the other flits follow their head: the flits one
        # input VC sends through one output leave in order, and a flit that arrives inside
        # an open packet belongs to it, head bit or not). Each read port of an input VC
        # offers its oldest flit to one open output of its group (round-robin), and every
        # output grants one of the offers it gets (round-robin). An arbiter's priority
        # moves only on a grant, so offers that collide spread out over the next cycles
        # (as in iSLIP).
        sources = [(p, v) for p in ports for v in range(vcs)]
        outputs_of = self.outputs_of
        inputs_of = {o: [(p, v) for p, v in sources if o in outputs_of[p]] for o in ports}
        want = {}  # (o, p, v) -> input VC (p, v) offers a flit to output o
        grant = {}  # (o, p, v) -> the grant of input VC (p, v)'s offer at output o
        for p, v in sources:
            b = bufs[p][v]
            for r, group in enumerate(READ_PORTS):
                outputs = [o for o in group if o in outputs_of[p]]
                if not outputs:
                    continue
                arbiter = RoundRobin(m, len(outputs), f"in_{p.name}{v}_r{r}")
                offers = arbiter.pick([b["oldest"][o].any() & has_credit[o][v]
                                       & (~b["start"][o] | ~busy[o][v]) for o in outputs])
                for o, offer in zip(outputs, offers, strict=True):
                    grant[o, p, v] = Signal(name=f"grant_{p.name}{v}_{o.name}")
                    want[o, p, v] = offer
                arbiter.advance([grant[o, p, v] for o in outputs])
                # The port reads for its offer while the outputs arbitrate (off the
                # output arbiters' path); a grant implies the offer.
                m.d.comb += b["offer"][r].eq(Cat(*[offers[outputs.index(o)] if o in outputs
                                                   else C(0, 1) for o in ports]))
        # An output no input can need (the mesh's edge) is never built.
        built = [o for o in ports if inputs_of[o]]
        for o in built:
            arbiter = RoundRobin(m, len(inputs_of[o]), f"sw_{o.name}")
            wins = arbiter.pick([want[o, p, v] for p, v in inputs_of[o]])
            m.d.comb += [grant[o, p, v].eq(win)
                         for (p, v), win in zip(inputs_of[o], wins, strict=True)]
            arbiter.advance(wins)
        st.__dict__.update(sources=sources, inputs_of=inputs_of, grant=grant, built=built)

    def _crossbar(self, m: Module, st: SimpleNamespace) -> None:
        """The granted flits through the crossbar to the links (registered) and the
        ejection buffers; output VC holders and link credits follow the grants."""
        cfg, vcs, here = self.config, self.config.vcs, (self.x, self.y)
        bufs, busy, credit, ejects = st.bufs, st.busy, st.credit, st.ejects
        sources, inputs_of, grant, built = st.sources, st.inputs_of, st.grant, st.built
        out_valid = {o: Signal(name=f"out_valid_{o.name}") for o in LINK_PORTS}
        out_flit = {o: Signal(cfg.flit, name=f"out_flit_{o.name}") for o in LINK_PORTS}
        out_src = {o: Signal(range(len(sources)), name=f"out_src_{o.name}") for o in LINK_PORTS}
        for o in built:
            chosen = [((p, v), grant[o, p, v]) for p, v in inputs_of[o]]
            grants = [g for _, g in chosen]
            # The crossbar: grants are one-hot, so an AND-OR tree (no priority chain).
            flit = Signal(cfg.flit, name=f"xbar_{o.name}")
            src = Signal(range(len(sources)), name=f"xbar_src_{o.name}")
            port = READ_PORT_OF[o]
            picked = [Mux(g, bufs[p][v]["flit"][port].as_value(), 0) for (p, v), g in chosen]
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
        st.__dict__.update(out_valid=out_valid, out_src=out_src)

    def _free_slots(self, m: Module, st: SimpleNamespace) -> None:
        """Granted flits leave their slots; freed slots become credits, one per cycle per
        VC on the link (the rest wait in ``pending``); ``holding``."""
        cfg, ports = self.config, list(Port)
        vcs, depth = cfg.vcs, cfg.depth
        bufs, grant, discard, ejects = st.bufs, st.grant, st.discard, st.ejects
        out_valid, built = st.out_valid, st.built
        pending = [[Signal(range(depth + 1), name=f"pending_{p.name}{v}") for v in range(vcs)]
                   for p in ports]
        for p in ports:
            for v in range(vcs):
                b = bufs[p][v]
                won = [grant.get((o, p, v), C(0, 1)) for o in ports]
                for i in range(depth):
                    m.d.comb += b["clear"][i].eq(Cat(*[won[o] & b["oldest"][o][i]
                                                        for o in ports]))
            if p is not Port.L:
                link = self.link(p, incoming=True)
                for v in range(vcs):
                    total = pending[p][v] + bufs[p][v]["freed"] + discard[p][v]
                    m.d.sync += [link.credit[v].eq(total != 0),
                                 pending[p][v].eq(total - (total != 0))]

        m.d.comb += self.holding.eq(Cat(
            *[bufs[p][v]["used"].any() for p in ports for v in range(vcs)],
            *[ejects[v]["count"] != 0 for v in range(vcs)],
            *[out_valid[o] for o in built if o is not Port.L],
            *[self.link(p, incoming=True).credit[v] | (pending[p][v] != 0)
              for p in LINK_PORTS for v in range(vcs)]).any())
        st.pending = pending

    def _drops(self, m: Module, st: SimpleNamespace) -> None:
        """The saturating drop counter and the sticky error."""
        ports, vcs, drop_event = list(Port), self.config.vcs, st.drop_event
        limit = (1 << COUNTER_BITS) - 1
        total = sum(drop_event[p][v] for p in ports for v in range(vcs))
        m.d.sync += self.dropped.eq(Mux(self.dropped + total >= limit, limit,
                                        self.dropped + total))
        with m.If(total != 0):
            m.d.sync += self.error.eq(1)
