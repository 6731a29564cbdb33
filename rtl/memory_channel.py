"""An off-chip memory channel at a mesh node: MEM_WRITE and MEM_READ packets served in
arrival order at a modelled bandwidth and access latency, reads answered with WRITE
packets into the requester's scratchpad (docs/memory_channel.md)."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.network_interface import NetPayload, PacketKind, check_max_packet, payload_bits
from spec.isa import ADDR_BITS
from spec.memory import (
    DEFAULT_LATENCY,
    MAX_LATENCY,
    MAX_MEMORY_ADDR_BITS,
    MemRead,
    check_bandwidth,
    machine_balance_bandwidth,
)
from spec.noc import COORD_BITS, DEFAULT_DEPTH, MessageClass, NocConfig
from spec.params import check_array_size, check_int

__all__ = ["MIN_LATENCY", "HostWrite", "MemoryChannel", "MemoryPort"]

#: Width of the channel's counters (saturating).
COUNTER_BITS = 32
#: Flits the reply queue holds (a word read from the store lands there a cycle later).
REPLY_QUEUE = 4
#: Cycles of the channel's own pipeline between a request taken and its first reply flit
#: (queued, read out, the word read, the flit queued): the latency's part that is not
#: waiting, and with two more (the request queue's read-out) its least value.
PIPELINE = 3
MIN_LATENCY = PIPELINE + 2


class _Op(data.StructLayout):
    """A queued request: a word to write, or a read (``data`` holds its MemRead)."""

    def __init__(self, n: int, addr_bits: int):
        super().__init__({"read": 1, "addr": unsigned(addr_bits), "data": unsigned(8 * n),
                          "signal": 1, "semaphore": unsigned(4), "due": unsigned(32)})


class HostWrite(data.StructLayout):
    """A word the host writes into a channel's store (the memory image, before a run)."""

    def __init__(self, n: int, addr_bits: int):
        super().__init__({"addr": unsigned(addr_bits), "data": unsigned(8 * n)})


class _Reply(data.StructLayout):
    """A reply flit's fields that vary besides its data (the rest are the response
    class's)."""

    def __init__(self):
        super().__init__({"head": 1, "tail": 1, "x": unsigned(COORD_BITS),
                          "y": unsigned(COORD_BITS), "kind": PacketKind,
                          "addr": unsigned(ADDR_BITS), "signal": 1, "semaphore": unsigned(4)})


class MemoryChannel(wiring.Component):
    """One memory channel: a store of ``words`` words of N bytes behind a request queue.

    Requests (``req``: the request-class flits ejected at the channel's node, whole
    packets):

    - ``MEM_WRITE``: every flit's ``data`` is a word for the store, from the head's
      ``addr`` on; a word past the store is dropped and counted (the packet's other
      words are written).
    - ``MEM_READ``: one flit; its ``data`` is a :class:`spec.memory.MemRead`:
      ``length`` words from ``addr`` on are sent to scratchpad address ``spad_addr`` of
      tile (``x``, ``y``) as WRITE packets of at most ``max_packet`` flits on the
      response class, the last carrying the request's ``signal``/``semaphore``. Length 0:
      a single SIGNAL flit, once every earlier request has been served (a fence).
      A read past the store, into words past a scratchpad's 2^16, or to a tile outside
      the ``k`` x ``k`` mesh, is dropped and counted, unanswered.
    - Anything else (another kind, a read longer than one flit, a flit outside a
      packet) is dropped and counted (``dropped``, sticky ``error``); the channel keeps
      taking flits.

    The host writes the store through ``host`` (the memory image, before the programs
    run): a word a cycle whenever the channel is not writing one itself, outside the
    modelled bandwidth; a word past the store is dropped and counted.

    Timing: a request is queued (``queue`` entries; ``req`` waits while it is full) and
    served in arrival order; at zero load a read's first reply flit is on ``resp``
    ``latency`` cycles (at least :data:`MIN_LATENCY`) after the request was taken. The
    store moves a word (written or read) when a credit counter that gains the
    bandwidth's numerator every cycle holds a word's worth (N bytes x its denominator):
    ``bytes_per_cycle`` on long transfers, at most one word after an idle spell. A read
    word is issued only while the reply queue has room (``resp`` may stall). Default
    bandwidth: the machine balance of
    :func:`spec.memory.machine_balance_bandwidth` for a 2 x 2 chip at this N.

    Ports
    -----
    req : stream in of :class:`spec.noc.Flit` (payload :class:`NetPayload` with
        ``addr_bits`` address bits)
    host : stream in of :class:`HostWrite`
    resp : stream out of :class:`spec.noc.Flit`, response class
    reads, writes : out, words read from and written to the store by requests
        (saturating; the host's words are not counted)
    requests : out, read requests accepted (fences included)
    dropped : out, requests, words (the host's too) and flits refused (saturating;
        the counters count a cycle after the event)
    error : out, sticky: something was dropped
    """

    def __init__(self, n: int = 8, *, k: int = 2, vcs: int = 2, depth: int = DEFAULT_DEPTH,
                 words: int = 1 << 16, addr_bits: int | None = None,
                 bytes_per_cycle=None, latency: int = DEFAULT_LATENCY, queue: int = 16,
                 max_packet: int = 8):
        self.n = check_array_size("n", n)
        self.read_layout = MemRead(n)  # refuses N < 4
        if addr_bits is None:
            addr_bits = max(ADDR_BITS, (check_int("words", words, 1, 1 << MAX_MEMORY_ADDR_BITS)
                                        - 1).bit_length())
        self.addr_bits = check_int("addr_bits", addr_bits, ADDR_BITS, MAX_MEMORY_ADDR_BITS)
        self.words = check_int("words", words, 1, 1 << addr_bits)
        self.config = NocConfig(k=k, payload_bits=payload_bits(n, addr_bits), vcs=vcs,
                                depth=depth)
        if bytes_per_cycle is None:
            bytes_per_cycle = machine_balance_bandwidth(n, 4)
        self.bandwidth = check_bandwidth(bytes_per_cycle, n)
        self.latency = check_int("latency", latency, MIN_LATENCY, MAX_LATENCY)
        self.queue = check_int("queue", queue, 2, 256)
        check_max_packet(max_packet)
        self.max_packet = max_packet
        self.payload_layout = NetPayload(n, addr_bits)
        flit = self.config.flit
        super().__init__({
            "req": In(stream.Signature(flit)),
            "resp": Out(stream.Signature(flit)),
            "host": In(stream.Signature(HostWrite(n, addr_bits))),
            "reads": Out(COUNTER_BITS), "writes": Out(COUNTER_BITS),
            "requests": Out(COUNTER_BITS), "dropped": Out(COUNTER_BITS),
            "error": Out(1),
        })

    @property
    def word_cost(self) -> int:
        """Credits one word takes: N bytes in units of 1/denominator byte."""
        return self.n * self.bandwidth.denominator

    def elaborate(self, platform):
        m = Module()
        n, k = self.n, self.config.k
        op_layout = _Op(n, self.addr_bits)
        now = Signal(32)
        m.d.sync += now.eq(now + 1)

        m.submodules.store = store = memory.Memory(shape=8 * n, depth=self.words, init=[])
        write, read = store.write_port(), store.read_port()
        m.submodules.ops = ops = fifo.SyncFIFOBuffered(width=op_layout.size, depth=self.queue)
        reply_bits = _Reply().size
        m.submodules.replies = replies = fifo.SyncFIFOBuffered(width=reply_bits + 8 * n,
                                                               depth=REPLY_QUEUE)
        dropped = Signal()  # a request, word or flit refused this cycle
        unended = Signal()  # and the packet before it had no tail

        # Ingress: flits into queued operations.
        flit = self.req.payload
        p = self.payload_layout(flit.payload)
        request = self.read_layout(p.data[:self.read_layout.size])
        writing = Signal()  # a MEM_WRITE packet is open
        skipping = Signal()  # the rest of a refused packet is dropped
        next_addr = Signal(self.addr_bits + 1)
        new = Signal(op_layout)
        take = self.req.valid & self.req.ready
        address = Mux(flit.head, p.addr, next_addr)
        read_fits = ((p.addr + request.length <= self.words) & (request.x < k)
                     & (request.y < k)
                     & (request.spad_addr + request.length <= 1 << ADDR_BITS))
        m.d.comb += [
            self.req.ready.eq(ops.w_rdy),
            new.addr.eq(address), new.data.eq(p.data), new.signal.eq(p.signal),
            new.semaphore.eq(p.semaphore), new.due.eq(now + (self.latency - PIPELINE)),
            ops.w_data.eq(new),
        ]
        with m.If(take):
            with m.If(flit.head):
                m.d.sync += [writing.eq(0), skipping.eq(0)]
                with m.If(writing | skipping):  # the open packet never got its tail
                    m.d.comb += unended.eq(1)
                with m.If(p.kind == PacketKind.MEM_WRITE):
                    m.d.sync += [writing.eq(~flit.tail), next_addr.eq(p.addr + 1)]
                    with m.If(p.addr < self.words):
                        m.d.comb += ops.w_en.eq(1)
                    with m.Else():
                        m.d.comb += dropped.eq(1)
                with m.Elif((p.kind == PacketKind.MEM_READ) & flit.tail & read_fits):
                    m.d.comb += [new.read.eq(1), ops.w_en.eq(1)]
                with m.Else():
                    m.d.comb += dropped.eq(1)
                    m.d.sync += skipping.eq(~flit.tail)
            with m.Elif(writing):
                m.d.sync += [writing.eq(~flit.tail), next_addr.eq(next_addr + 1)]
                with m.If(next_addr < self.words):
                    m.d.comb += ops.w_en.eq(1)
                with m.Else():
                    m.d.comb += dropped.eq(1)
            with m.Elif(skipping):
                m.d.sync += skipping.eq(~flit.tail)
            with m.Else():  # a body or tail flit outside any packet
                m.d.comb += dropped.eq(1)

        # The store's bandwidth: credits in 1/denominator bytes, a word costs N bytes.
        gain, cost = self.bandwidth.numerator, self.word_cost
        ceiling = cost + gain
        credit = Signal(range(ceiling + 1), init=cost)
        spend = Signal()
        after = Signal(range(ceiling + 1))
        m.d.comb += after.eq(credit + gain - Mux(spend, cost, 0))
        m.d.sync += credit.eq(Mux(after > ceiling, ceiling, after))
        funded = credit >= cost

        # Service, in queue order.
        op = op_layout(ops.r_data)
        job = self.read_layout(op.data[:self.read_layout.size])
        waited = Signal(32)  # cycles since the request became due, mod 2^32
        m.d.comb += waited.eq(now - op.due)
        due = ops.r_rdy & ~waited[31]
        index = Signal(range(1 << job.length.shape().width))  # word of the read
        in_packet = Signal(range(self.max_packet))
        staged = Signal()  # a reply flit goes into the queue next cycle
        staged_reply = Signal(_Reply())
        staged_data = Signal()  # its data comes from the store's read port
        room = replies.w_level + staged < REPLY_QUEUE
        last = index == job.length - 1
        reply = Signal(_Reply())
        m.d.comb += [
            reply.x.eq(job.x), reply.y.eq(job.y), reply.semaphore.eq(op.semaphore),
            reply.addr.eq(job.spad_addr + index),
            read.addr.eq(op.addr + index), read.en.eq(0),
            write.addr.eq(op.addr), write.data.eq(op.data),
        ]
        m.d.sync += staged.eq(0)
        serving_write = due & ~op.read & funded
        with m.If(serving_write):
            m.d.comb += [write.en.eq(1), spend.eq(1), ops.r_en.eq(1)]
        with m.Elif(due & op.read & (job.length == 0) & room):
            m.d.comb += [reply.head.eq(1), reply.tail.eq(1), ops.r_en.eq(1),
                         reply.kind.eq(PacketKind.SIGNAL), reply.signal.eq(op.signal)]
            m.d.sync += [staged.eq(1), staged_reply.eq(reply), staged_data.eq(0)]
        with m.Elif(due & op.read & (job.length != 0) & room & funded):
            tail = (in_packet == self.max_packet - 1) | last
            m.d.comb += [reply.head.eq(in_packet == 0), reply.tail.eq(tail),
                         reply.kind.eq(PacketKind.WRITE), reply.signal.eq(op.signal & last),
                         read.en.eq(1), spend.eq(1)]
            m.d.sync += [staged.eq(1), staged_reply.eq(reply), staged_data.eq(1),
                         in_packet.eq(Mux(tail, 0, in_packet + 1)), index.eq(index + 1)]
            with m.If(last):
                m.d.comb += ops.r_en.eq(1)
                m.d.sync += index.eq(0)
        # The host's words, in cycles the service writes none.
        host = self.host.payload
        host_dropped = Signal()
        m.d.comb += self.host.ready.eq(~serving_write)
        with m.If(self.host.valid & ~serving_write):
            with m.If(host.addr < self.words if self.words < 1 << self.addr_bits else 1):
                m.d.comb += [write.en.eq(1), write.addr.eq(host.addr),
                             write.data.eq(host.data)]
            with m.Else():
                m.d.comb += host_dropped.eq(1)
        m.d.comb += [replies.w_en.eq(staged),  # with the word read last cycle
                     replies.w_data.eq(Cat(staged_reply, Mux(staged_data, read.data, 0)))]

        # The reply queue onto the response class.
        out, flit_out = _Reply()(replies.r_data[:reply_bits]), self.resp.payload
        payload_out = self.payload_layout(flit_out.payload)
        m.d.comb += [
            self.resp.valid.eq(replies.r_rdy), replies.r_en.eq(self.resp.ready),
            flit_out.head.eq(out.head), flit_out.tail.eq(out.tail),
            flit_out.vc.eq(self.config.vcs_per_class), flit_out.cls.eq(MessageClass.RESPONSE),
            flit_out.dst.x.eq(out.x), flit_out.dst.y.eq(out.y),
            payload_out.data.eq(replies.r_data[reply_bits:]), payload_out.addr.eq(out.addr),
            payload_out.kind.eq(out.kind), payload_out.signal.eq(out.signal),
            payload_out.semaphore.eq(out.semaphore),
        ]

        # Counters, a cycle behind their events (off the service's timing path).
        def count(counter, events):
            seen = Signal(range(4))
            total = counter + seen
            m.d.sync += [seen.eq(events),
                         counter.eq(Mux(total >> COUNTER_BITS, (1 << COUNTER_BITS) - 1, total))]
        count(self.writes, serving_write)
        count(self.reads, read.en)
        count(self.requests, ops.w_en & new.read)
        count(self.dropped, dropped + unended + host_dropped)
        with m.If(dropped | unended | host_dropped):
            m.d.sync += self.error.eq(1)
        return m


class MemoryPort(wiring.Component):
    """The request side of a node that hosts a memory channel besides its tile: each
    request-class VC ejected at the node (``eject``) goes on to the network interface
    (``tile``, one stream per VC), except packets of kind MEM_READ or MEM_WRITE, which
    go whole to the channel (``req``). A packet's head decides where the packet goes;
    while a packet to the channel is open on one VC, the channel takes only that VC's
    flits; then the VCs with a memory packet waiting take turns (round robin from the
    one after the last served). A flit outside any packet goes to the interface, which
    drops it and counts it."""

    def __init__(self, config: NocConfig, payload_layout: data.StructLayout):
        self.config, self.payload_layout = config, payload_layout
        vcs = len(config.class_vcs(MessageClass.REQUEST))
        flit = config.flit
        super().__init__({
            "eject": In(stream.Signature(flit)).array(vcs),
            "tile": Out(stream.Signature(flit)).array(vcs),
            "req": Out(stream.Signature(flit)),
        })

    def elaborate(self, platform):
        m = Module()
        vcs = len(self.eject)
        owner = Signal(range(max(vcs, 2)))  # the VC whose memory packet is open
        locked = Signal()
        wants = []
        for v in range(vcs):
            eject, tile = self.eject[v], self.tile[v]
            flit = eject.payload
            kind = self.payload_layout(flit.payload).kind
            memory = (kind == PacketKind.MEM_READ) | (kind == PacketKind.MEM_WRITE)
            routing = Signal(name=f"vc{v}_to_channel")  # a memory packet is open on VC v
            to_channel = Mux(flit.head, memory, routing)
            want = Signal(name=f"vc{v}_wants_channel")
            m.d.comb += [want.eq(eject.valid & to_channel), tile.payload.eq(flit),
                         tile.valid.eq(eject.valid & ~to_channel)]
            wants.append(want)
            with m.If(~to_channel):
                m.d.comb += eject.ready.eq(tile.ready)
            with m.If(eject.valid & eject.ready & to_channel):
                m.d.sync += routing.eq(~flit.tail)
        grant = Signal(range(max(vcs, 2)))
        with m.If(locked):
            m.d.comb += grant.eq(owner)
        with m.Else():
            # The first VC after the last served (owner) that wants the channel.
            for offset in reversed(range(1, vcs + 1)):
                for v in range(vcs):
                    with m.If((owner == (v - offset) % vcs) & wants[v]):
                        m.d.comb += grant.eq(v)
        for v in range(vcs):
            with m.If(grant == v):
                m.d.comb += [self.req.valid.eq(wants[v]),
                             self.req.payload.eq(self.eject[v].payload)]
                with m.If(wants[v]):
                    m.d.comb += self.eject[v].ready.eq(self.req.ready)
        with m.If(self.req.valid & self.req.ready):
            m.d.sync += [locked.eq(~self.req.payload.tail), owner.eq(grant)]
        return m
