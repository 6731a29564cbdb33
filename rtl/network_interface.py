"""The network interface: a tile's DMA words into packets on its router, and packets from
the router back into words for its scratchpad (see docs/noc.md, "Network interface")."""

from __future__ import annotations

from amaranth import Cat, Const, DomainRenamer, Module, Mux, Signal, unsigned
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.dma_engine import NetWord
from rtl.sim_gate import gated
from spec.isa import (
    ADDR_BITS,
    CHANNEL_BITS,
    MASK_COLUMNS,
    MEM_ADDR_BITS,
    TILE_MASK_BITS,
    DmaTarget,
)
from spec.noc import DEFAULT_DEPTH, MAX_PACKET, MessageClass, NocConfig
from spec.params import check_bool, check_coord

__all__ = ["MAX_PACKET", "NetPayload", "NetworkInterface", "PacketKind", "check_max_packet",
           "check_memory_nodes", "payload_bits"]

#: Width of the traffic and drop counters (saturating).
COUNTER_BITS = 32


class PacketKind(enum.Enum, shape=2):
    """What a packet does at its destination. A tile takes WRITE and SIGNAL packets; a
    memory channel (:mod:`rtl.memory_channel`) takes MEM_READ and MEM_WRITE."""

    WRITE = 0  # every flit's ``data`` into the scratchpad, from the head's ``addr`` on
    SIGNAL = 1  # no data: a single flit whose tail fields raise a semaphore
    MEM_READ = 2  # a single flit: ``data`` is a spec.memory.MemRead, ``addr`` in memory
    MEM_WRITE = 3  # every flit's ``data`` into memory, from the head's ``addr`` on


class NetPayload(data.StructLayout):
    """The payload of every flit of a packet. ``data`` is one scratchpad word per flit.
    The destination takes ``kind`` and ``addr`` (the first word's address) from the head
    flit and ``signal``/``semaphore`` (raise that semaphore once the packet's words are
    written) from the tail flit; a flit of the middle carries them unused. ``addr_bits``:
    wider than a scratchpad address on a network that also reaches memory channels."""

    def __init__(self, n: int, addr_bits: int = ADDR_BITS):
        super().__init__({
            "data": unsigned(8 * n), "addr": unsigned(addr_bits), "kind": PacketKind,
            "signal": 1, "semaphore": unsigned(4),
        })


def payload_bits(n: int, addr_bits: int = ADDR_BITS) -> int:
    """Flit payload width of the network that carries :class:`NetPayload` for size N."""
    return NetPayload(n, addr_bits).size


def check_memory_nodes(nodes, k: int) -> tuple[tuple[int, int], ...]:
    """``nodes`` as a tuple of (x, y) mesh positions, channel c at ``nodes[c]``, if each
    lies in the ``k`` x ``k`` mesh and there are at most 2^CHANNEL_BITS; else a
    ValueError."""
    nodes = tuple(tuple(node) if isinstance(node, tuple | list) else node for node in nodes)
    if len(nodes) > 1 << CHANNEL_BITS:
        raise ValueError(f"at most {1 << CHANNEL_BITS} memory channels, not {len(nodes)}")
    return tuple(check_coord(f"memory channel {c}", node, (k, k))
                 for c, node in enumerate(nodes))


def check_max_packet(max_packet: int) -> None:
    """Refuse a packet length the network interface cannot reassemble."""
    if not isinstance(max_packet, int) or isinstance(max_packet, bool) \
            or not 1 <= max_packet <= MAX_PACKET:
        raise ValueError(f"max_packet must be 1..{MAX_PACKET} flits, not {max_packet!r}")


class NetworkInterface(wiring.Component):
    """Packets out of a tile's DMA words and back (the tile at (``x``, ``y``) of a
    ``k`` x ``k`` mesh).

    Egress (``tile_out`` → ``inject``): the words of one DMA (same tile mask, consecutive
    addresses, ``last`` on the final one) become packets:

    - one destination: WRITE packets of at most ``max_packet`` flits (one word each, the
      head carrying the address); the packet holding the DMA's last word carries its
      signal. One flit is held back until the next word (or ``last``) shows whether it
      ends its packet, so a tile mask or address that changes without ``last`` closes
      the packet instead of delivering a word to the wrong place.
    - several destinations: one single-flit multicast packet per word (the router
      copies it along the XY tree; a multicast packet is one flit).
    - a DMA of length 0 (``write = 0``): a single-flit SIGNAL packet.

    - a memory word (``target`` STORE or LOAD): to the node of its ``channel``
      (``memory_nodes[channel]``), as MEM_WRITE packets like a unicast DMA's or, for a
      LOAD's request, one MEM_READ flit; a channel not in ``memory_nodes`` is dropped
      and counted. With ``memory_nodes`` the flits' ``addr`` is 24 bits wide.

    Words are sent on the REQUEST class, on VC ``dst mod vcs/2`` of it for a unicast
    destination (so one source reaches one destination in order) and on the class's
    first VC for multicast. A word whose tile mask is empty or names a tile outside the
    mesh is dropped and counted (``dropped_out``), never sent.

    Ingress (``eject`` → ``tile_in``): per VC, flits are collected in a word FIFO of
    ``2 * max_packet`` words and a packet is passed on only once its tail has arrived
    and it is well formed; a malformed packet — more than ``max_packet`` flits, a head
    arriving inside an open packet (the open one is malformed), a SIGNAL packet longer
    than one flit, an unknown kind, or words past the scratchpad's ``spad_words`` — is
    dropped whole and counted (``dropped_in``): none of its words reach the tile, and
    the network keeps moving (the ejection streams are always drained). Complete packets
    go to ``tile_in`` one at a time (round-robin over the VCs), as words at consecutive
    addresses with ``last`` and the tail's signal on the final one.

    Ports
    -----
    tile_out : stream in of :class:`rtl.dma_engine.NetWord` (the tile's ``net_out``)
    tile_in : stream out of :class:`rtl.dma_engine.NetWord` (the tile's ``net_in``)
    inject : ``vcs`` stream sources of :class:`spec.noc.Flit` (the router's ``inject``)
    eject : ``vcs`` stream sinks of :class:`spec.noc.Flit` (the router's ``eject``)
    sent, received : out, flits injected and packets delivered to the tile (saturating)
    dropped_out, dropped_in : out, words dropped at egress, packets dropped at ingress
    error : out, sticky: something was dropped

    Timing: egress one flit per cycle after one cycle of hold-back; ingress one word
    per cycle into the FIFO and one per cycle out of it, a packet delivered from the
    cycle after its tail.

    ``holding`` (not a port): a flit is held, or a complete packet waits or is delivered;
    while it is not and nothing is offered, no register changes. ``sim_gating``, for
    simulation only: the interface's clock ticks only then (:mod:`rtl.sim_gate`), so
    Verilator skips an idle interface; cycle for cycle the same.
    """

    def __init__(self, n: int = 8, x: int = 0, y: int = 0, *, k: int = 2, vcs: int = 2,
                 depth: int = DEFAULT_DEPTH, max_packet: int = 8, spad_words: int = 1 << ADDR_BITS,
                 memory_nodes: tuple = (), sim_gating: bool = False):
        if n not in (2, 4, 8, 16, 32):
            raise ValueError(f"word size N must be a power of two from 2 to 32, not {n!r}")
        self.memory_nodes = check_memory_nodes(memory_nodes, k)
        if self.memory_nodes and n < 4:
            raise ValueError(f"memory requests need N ≥ 4, not {n}")
        # Flits carry memory addresses when the network reaches memory channels.
        self.addr_bits = MEM_ADDR_BITS if self.memory_nodes else ADDR_BITS
        self.config = NocConfig(k=k, payload_bits=payload_bits(n, self.addr_bits), vcs=vcs,
                                depth=depth)
        if k > MASK_COLUMNS:
            raise ValueError(f"the tile mask has {MASK_COLUMNS} columns; k = {k} is too large")
        for name, value in (("x", x), ("y", y)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < k:
                raise ValueError(f"{name} must be an integer in [0, {k}), not {value!r}")
        check_max_packet(max_packet)
        if not isinstance(spad_words, int) or not 1 <= spad_words <= 1 << ADDR_BITS:
            raise ValueError(f"spad_words must be 1..{1 << ADDR_BITS}, not {spad_words!r}")
        self.n, self.x, self.y, self.k = n, x, y, k
        self.max_packet, self.spad_words = max_packet, spad_words
        self.sim_gating = check_bool("sim_gating", sim_gating)
        self.holding = Signal()
        flit = self.config.flit
        super().__init__({
            "tile_out": In(stream.Signature(NetWord(n))),
            "tile_in": Out(stream.Signature(NetWord(n))),
            "inject": Out(stream.Signature(flit)).array(vcs),
            "eject": In(stream.Signature(flit)).array(vcs),
            "sent": Out(COUNTER_BITS), "received": Out(COUNTER_BITS),
            "dropped_out": Out(COUNTER_BITS), "dropped_in": Out(COUNTER_BITS),
            "error": Out(1),
        })

    # --- egress -------------------------------------------------------------------------

    def _mesh_mask(self, m: Module, tiles) -> tuple[Signal, Signal, Signal]:
        """(the k*k multicast mask, the mask is one node, the mask is routable)."""
        k = self.k
        mask = Signal(k * k)
        m.d.comb += mask.eq(Cat(tiles[y * MASK_COLUMNS + x] for y in range(k) for x in range(k)))
        inside = Const(sum(1 << (y * MASK_COLUMNS + x) for y in range(k) for x in range(k)),
                       TILE_MASK_BITS)
        single = Signal()
        m.d.comb += single.eq((mask & (mask - 1)) == 0)
        routable = Signal()
        m.d.comb += routable.eq((tiles != 0) & ((tiles & ~inside) == 0))
        return mask, single, routable

    def _egress(self, m: Module) -> Signal:
        """Words into flits; returns the flag that a flit is held."""
        cfg, n, k = self.config, self.n, self.k
        word = self.tile_out.payload
        mask, single, routable = self._mesh_mask(m, word.tiles)
        # The destination of a one-node mask. Every packet of this NI, unicast or
        # multicast, takes one request VC, chosen by the source: a multicast follows the
        # XY routes of its destinations, so each destination sees this tile's packets in
        # the order they were sent (different sources spread over the class's VCs).
        dst = Signal.like(self.inject[0].payload.dst)
        request_vcs = cfg.class_vcs(MessageClass.REQUEST)
        vc = Signal(range(cfg.vcs))
        m.d.comb += vc.eq(request_vcs.start + (self.y * k + self.x) % cfg.vcs_per_class)
        for y in range(k):
            for x in range(k):
                with m.If(single & mask[y * k + x]):
                    m.d.comb += [dst.x.eq(x), dst.y.eq(y)]
        # A memory word goes to its channel's node, alone or in MEM_WRITE packets.
        memory = word.target != DmaTarget.TILES
        kind = Signal(PacketKind)
        m.d.comb += kind.eq(Mux(word.write, PacketKind.WRITE, PacketKind.SIGNAL))
        if self.memory_nodes:
            with m.If(memory):
                m.d.comb += [single.eq(1), routable.eq(0),
                             kind.eq(Mux(word.target == DmaTarget.STORE, PacketKind.MEM_WRITE,
                                         PacketKind.MEM_READ))]
                for channel, (x, y) in enumerate(self.memory_nodes):
                    with m.If(word.channel == channel):
                        m.d.comb += [dst.x.eq(x), dst.y.eq(y),
                                     routable.eq((word.target == DmaTarget.STORE)
                                                 | (word.target == DmaTarget.LOAD))]
        else:
            with m.If(memory):
                m.d.comb += routable.eq(0)

        # The held flit: sent once the next word (or its own `last`) decides its tail.
        held = Signal(cfg.flit)
        held_valid = Signal()
        held_vc = Signal(range(cfg.vcs))
        held_destination = Signal(TILE_MASK_BITS + DmaTarget.as_shape().width + CHANNEL_BITS)
        held_addr = Signal(self.addr_bits)
        held_final = Signal()  # the held flit ends its packet whatever comes next
        flits = Signal(range(self.max_packet + 1))  # flits of the open packet, held included

        destination = Cat(word.tiles, word.target, word.channel)
        continues = (word.write & (destination == held_destination)
                     & (word.addr[:self.addr_bits] == held_addr + 1)
                     & (flits != self.max_packet))
        release = held_valid & (held_final | self.tile_out.valid)
        tail = held_final | ~continues
        out_ready = Signal()
        for v in range(cfg.vcs):
            inject = self.inject[v]
            m.d.comb += [inject.payload.eq(held), inject.payload.tail.eq(tail),
                         inject.payload.vc.eq(v), inject.valid.eq(release & (held_vc == v))]
            with m.If(held_vc == v):
                m.d.comb += out_ready.eq(inject.ready)
        sent_now = release & out_ready

        # A word is taken when the held slot is empty or being sent; an unroutable word
        # is taken and dropped.
        m.d.comb += self.tile_out.ready.eq(~held_valid | sent_now)
        accepted = self.tile_out.valid & self.tile_out.ready
        with m.If(sent_now):
            m.d.sync += held_valid.eq(0)
        with m.If(accepted & routable):
            payload = Signal(NetPayload(n, self.addr_bits))
            new = Signal(cfg.flit)
            head = ~held_valid | tail
            m.d.comb += [
                payload.data.eq(word.data), payload.addr.eq(word.addr),
                payload.kind.eq(kind),
                payload.signal.eq(word.signal & word.last),
                payload.semaphore.eq(word.semaphore),
                new.payload.eq(payload), new.head.eq(head),
                new.tail.eq(0), new.vc.eq(vc),  # (the tail is decided when it is sent)
                new.cls.eq(MessageClass.REQUEST), new.multicast.eq(~single), new.mask.eq(mask),
                new.dst.eq(dst),
            ]
            m.d.sync += [held.eq(new), held_valid.eq(1), held_vc.eq(vc),
                         held_destination.eq(destination), held_addr.eq(word.addr),
                         held_final.eq(word.last | ~word.write | ~single),
                         flits.eq(Mux(head, 1, flits + 1))]
        dropped = Signal(COUNTER_BITS)
        with m.If(accepted & ~routable & ~dropped.all()):
            m.d.sync += dropped.eq(dropped + 1)
        sent = Signal(COUNTER_BITS)
        with m.If(sent_now & ~sent.all()):
            m.d.sync += sent.eq(sent + 1)
        m.d.comb += [self.dropped_out.eq(dropped), self.sent.eq(sent)]
        return held_valid

    # --- ingress ------------------------------------------------------------------------

    def _ingress(self, m: Module):
        """Flits into packets; returns the flag that a complete packet waits or is being
        delivered (the words of an open one wait for its next flit: they change nothing)."""
        mp = self.max_packet
        desc_layout = data.StructLayout({
            "addr": unsigned(ADDR_BITS), "count": range(mp + 1), "good": 1,
            "write": 1, "signal": 1, "semaphore": unsigned(4),
        })
        words, descs, orphans = [], [], []
        for v in range(self.config.vcs):
            word_q, desc_q, orphan = self._assemble(m, v, desc_layout)
            words.append(word_q)
            descs.append(desc_q)
            orphans.append(orphan)
        return self._deliver(m, words, descs, orphans, desc_layout)

    def _assemble(self, m: Module, v: int, desc_layout):
        """VC ``v``'s flits into its word and descriptor queues, a descriptor per packet
        (good or not: a head inside an open packet, an unknown kind, too many words, a
        write past the scratchpad); returns the queues and the strobe of a flit that
        belongs to no packet."""
        n, mp = self.n, self.max_packet
        eject = self.eject[v]
        flit, payload = eject.payload, NetPayload(n, self.addr_bits)(eject.payload.payload)
        word_q = fifo.SyncFIFOBuffered(width=8 * n, depth=2 * mp)
        desc_q = fifo.SyncFIFOBuffered(width=desc_layout.size, depth=2 * mp)
        m.submodules[f"words{v}"], m.submodules[f"descs{v}"] = word_q, desc_q

        open_ = Signal(name=f"vc{v}_open")  # a packet's head arrived, not its tail
        addr = Signal(self.addr_bits, name=f"vc{v}_addr")
        stored = Signal(range(mp + 1), name=f"vc{v}_stored")  # its words in word_q
        bad = Signal(name=f"vc{v}_bad")
        write = Signal(name=f"vc{v}_write")

        head_in_open = eject.valid & flit.head & open_
        fresh = flit.head  # this flit opens a packet (open ones were closed first)
        kind_write = payload.kind == PacketKind.WRITE
        kind_known = kind_write | (payload.kind == PacketKind.SIGNAL)
        p_write = Mux(fresh, kind_write, write)
        p_stored = Mux(fresh, 0, stored)
        p_addr = Mux(fresh, payload.addr, addr)
        p_bad = Mux(fresh, ~kind_known, bad)
        in_packet = fresh | open_
        store = in_packet & p_write & (p_stored != mp)
        overflow = in_packet & p_write & (p_stored == mp)
        count = p_stored + store
        # A SIGNAL packet is one flit; a WRITE packet stays inside the scratchpad.
        bad_now = (p_bad | overflow | (~p_write & ~(fresh & flit.tail))
                   | (p_write & (p_addr + count > self.spad_words)))

        desc = Signal(desc_layout, name=f"vc{v}_desc")
        m.d.comb += [
            eject.ready.eq(~head_in_open & word_q.w_rdy & desc_q.w_rdy),
            word_q.w_data.eq(payload.data),
            desc_q.w_data.eq(desc),
        ]
        take = eject.valid & eject.ready
        with m.If(head_in_open & desc_q.w_rdy):  # the open packet had no tail: malformed
            m.d.comb += [desc.addr.eq(addr), desc.count.eq(stored), desc.good.eq(0),
                         desc.write.eq(write), desc_q.w_en.eq(1)]
            m.d.sync += open_.eq(0)
        with m.Elif(take & in_packet):
            m.d.comb += word_q.w_en.eq(store)
            m.d.sync += [addr.eq(p_addr), stored.eq(count), bad.eq(bad_now),
                         write.eq(p_write), open_.eq(~flit.tail)]
            with m.If(flit.tail):
                m.d.comb += [desc.addr.eq(p_addr), desc.count.eq(count),
                             desc.good.eq(~bad_now), desc.write.eq(p_write),
                             desc.signal.eq(payload.signal),
                             desc.semaphore.eq(payload.semaphore), desc_q.w_en.eq(1)]
        return word_q, desc_q, take & ~in_packet & flit.tail  # the router drops orphans

    def _deliver(self, m: Module, words: list, descs: list, orphans: list, desc_layout):
        """Complete packets to the tile one at a time, round-robin over the VCs; the
        received and dropped counters. Returns the flag that a packet waits."""
        cfg, n, mp = self.config, self.n, self.max_packet
        cur = Signal(range(cfg.vcs))
        busy = Signal()
        index = Signal(range(mp + 1))
        desc = Signal(desc_layout)
        word_data = Signal(8 * n)
        word_rdy = Signal()
        for v in range(cfg.vcs):
            with m.If(cur == v):
                m.d.comb += [desc.eq(descs[v].r_data), word_data.eq(words[v].r_data),
                             word_rdy.eq(words[v].r_rdy)]
        with m.If(~busy):
            ready = Cat(q.r_rdy for q in descs)
            # The next VC after `cur` with a complete packet (`cur` itself last).
            for step in reversed(range(1, cfg.vcs + 1)):
                for v in range(cfg.vcs):
                    with m.If((cur == v) & ready[(v + step) % cfg.vcs]):
                        m.d.sync += [cur.eq((v + step) % cfg.vcs), busy.eq(1), index.eq(0)]

        # A good packet: its words (or, for SIGNAL, one word with write = 0) to the tile.
        out = self.tile_in.payload
        total = Mux(desc.write, desc.count, 1)
        last = index + 1 == total
        m.d.comb += [
            out.tiles.eq(1 << (self.y * MASK_COLUMNS + self.x)),
            out.addr.eq(desc.addr + index), out.data.eq(word_data), out.write.eq(desc.write),
            out.last.eq(last), out.signal.eq(desc.signal & last),
            out.semaphore.eq(desc.semaphore),
            self.tile_in.valid.eq(busy & desc.good & (~desc.write | word_rdy)),
        ]
        delivered = self.tile_in.valid & self.tile_in.ready
        # A bad packet: its stored words are discarded.
        discard = busy & ~desc.good & (index != desc.count) & word_rdy
        finish = (delivered & last) | (busy & ~desc.good & (index == desc.count))
        for v in range(cfg.vcs):
            with m.If(cur == v):
                m.d.comb += [words[v].r_en.eq((delivered & desc.write) | discard),
                             descs[v].r_en.eq(finish)]
        with m.If(delivered | discard):
            m.d.sync += index.eq(index + 1)
        with m.If(finish):
            m.d.sync += busy.eq(0)

        received, dropped = Signal(COUNTER_BITS), Signal(COUNTER_BITS)
        with m.If(finish & desc.good & ~received.all()):
            m.d.sync += received.eq(received + 1)
        drops = (finish & ~desc.good) + sum(orphans)
        with m.If(dropped < (1 << COUNTER_BITS) - 1 - cfg.vcs):
            m.d.sync += dropped.eq(dropped + drops)
        m.d.comb += [self.received.eq(received), self.dropped_in.eq(dropped)]
        return Cat(q.w_level != 0 for q in descs).any()  # (delivery pops one at its end)

    def elaborate(self, platform):
        m = Module()
        logic = Module() if self.sim_gating else m
        holding = self._egress(logic) | self._ingress(logic)
        m.d.comb += self.holding.eq(holding)
        with logic.If((self.dropped_out != 0) | (self.dropped_in != 0)):
            logic.d.sync += self.error.eq(1)
        if self.sim_gating:
            offered = self.tile_out.valid | Cat(e.valid for e in self.eject).any()
            gated(m, "interface", holding | offered)
            m.submodules.logic = DomainRenamer("interface")(logic)
        return m
