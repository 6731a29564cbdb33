"""The DMA engine: copies a scratchpad region to this tile and/or other tiles (see
:class:`spec.isa.DmaArgs`), and the network word it sends."""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.scratchpad import Request, Response, failed
from spec.isa import ADDR_BITS, SIGNAL, TILE_MASK_BITS, DmaArgs, tile_bit
from spec.params import check_array_size, check_coord, check_int

__all__ = ["DmaEngine", "NetWord"]


class NetWord(data.StructLayout):
    """One word on the tile's network port: store ``data`` at ``addr`` on every tile of
    ``tiles`` (when ``write``); on ``last``, add one to semaphore ``semaphore`` there
    (when ``signal``). A DMA of length 0 is one word with ``write = 0``, ``last = 1``."""

    def __init__(self, n: int):
        super().__init__({
            "tiles": unsigned(TILE_MASK_BITS), "addr": unsigned(ADDR_BITS),
            "data": unsigned(8 * n), "write": 1, "last": 1, "signal": 1,
            "semaphore": unsigned(4),
        })


class DmaEngine(wiring.Component):
    """Reads ``length`` words from ``src`` on one scratchpad port; each word is written
    back at ``dst + i`` on the same port when the instruction names this tile, and sent
    on ``net_out`` (``tiles`` without this tile) when it names others. A DMA to this
    tile with ``remote_signal`` raises ``arrival`` (one beat) when its last word is
    written; one to others carries the signal on its last network word.

    One instruction at a time; ``done`` (the instruction's ``signal``) after every word
    is written and sent. Reads run ahead of the writes by at most ``BUFFER`` words.
    ``error`` (sticky): a scratchpad response with an error status.

    ``position`` = (x, y) of the tile, or None: then the port ``mask_bit`` gives the
    tile's bit of a tile mask (y * 8 + x), so one design serves every tile of a chip.
    """

    #: Words read ahead of their write/send.
    BUFFER = 8

    def __init__(self, n: int = 8, position: tuple[int, int] | None = (0, 0),
                 addr_bits: int = 16):
        check_array_size("n", n)
        check_int("addr_bits", addr_bits, 1, ADDR_BITS)
        if position is not None:
            position = check_coord("tile position", position, (8, 8))
        self.n, self.position, self.addr_bits = n, position, addr_bits
        ports = {}
        if position is None:  # the tile's mask bit (y * 8 + x) arrives on a port
            ports["mask_bit"] = In(range(TILE_MASK_BITS))
        super().__init__({**ports,
            "cmd": In(stream.Signature(DmaArgs())),
            "done": Out(stream.Signature(SIGNAL)),
            "req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "resp": In(stream.Signature(Response(8 * n))),
            "net_out": Out(stream.Signature(NetWord(self.n))),
            "arrival": Out(stream.Signature(unsigned(4))),
            "busy": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cmd = Signal(DmaArgs())
        active = Signal()
        if self.position is None:
            own_bit = Signal(TILE_MASK_BITS)
            m.d.comb += own_bit.eq(Const(1, TILE_MASK_BITS) << self.mask_bit)
        else:
            x, y = self.position
            own_bit = tile_bit(x, y)
        local = (cmd.tiles & own_bit).any()
        remote = cmd.tiles & ~own_bit
        m.d.comb += self.busy.eq(active)

        # Reads issued, responses expected: a tag per request (1 = read, 0 = write ack).
        m.submodules.tags = tags = fifo.SyncFIFOBuffered(width=1, depth=2 * self.BUFFER)
        m.submodules.words = words = fifo.SyncFIFOBuffered(width=8 * self.n,
                                                           depth=self.BUFFER)
        to_read = Signal(13)  # words not yet requested
        in_flight = Signal(range(self.BUFFER + 1))  # reads requested, not yet buffered
        index = Signal(13)  # the buffered word being written/sent
        written, sent = Signal(), Signal()  # for the head word
        acks = Signal(13)  # write acknowledgements still to come
        finishing = Signal()  # every word handled; waiting for acks, then done
        done_valid = Signal()
        arrival_valid = Signal()
        m.d.comb += [self.done.valid.eq(done_valid), self.arrival.valid.eq(arrival_valid),
                     self.arrival.payload.eq(cmd.remote_semaphore)]
        with m.If(self.done.ready):
            m.d.sync += done_valid.eq(0)
        with m.If(self.arrival.ready):
            m.d.sync += arrival_valid.eq(0)

        m.d.comb += self.cmd.ready.eq(~active & ~done_valid & ~arrival_valid)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            m.d.sync += [cmd.eq(p), active.eq(1), to_read.eq(p.length), index.eq(0),
                         written.eq(0), sent.eq(0), acks.eq(0), finishing.eq(0)]

        # Request mux: the head word's write first, else the next read.
        head = words.r_rdy
        want_write = active & head & local & ~written
        room = (in_flight + words.level) < self.BUFFER
        want_read = active & (to_read != 0) & room
        m.d.comb += self.req.payload.write.eq(want_write)
        with m.If(want_write):
            m.d.comb += [self.req.payload.addr.eq(cmd.dst + index),
                         self.req.payload.data.eq(words.r_data),
                         self.req.valid.eq(tags.w_rdy)]
        with m.Else():
            m.d.comb += [self.req.payload.addr.eq(cmd.src + (cmd.length - to_read)),
                         self.req.valid.eq(want_read & tags.w_rdy)]
        issued = self.req.valid & self.req.ready
        m.d.comb += [tags.w_en.eq(issued), tags.w_data.eq(~want_write)]
        read_issued = issued & ~want_write
        write_issued = issued & want_write

        # Responses: read data into the buffer, write acks counted.
        is_read = tags.r_data
        m.d.comb += [
            self.resp.ready.eq(tags.r_rdy & (~is_read | words.w_rdy)),
            tags.r_en.eq(self.resp.valid & self.resp.ready),
            words.w_en.eq(self.resp.valid & self.resp.ready & is_read),
            words.w_data.eq(self.resp.payload.data),
        ]
        read_back = self.resp.valid & self.resp.ready & is_read
        ack_back = self.resp.valid & self.resp.ready & ~is_read
        with m.If(self.resp.valid & self.resp.ready & failed(self.resp.payload.status)):
            m.d.sync += self.error.eq(1)
        m.d.sync += [
            in_flight.eq(in_flight + read_issued - read_back),
            acks.eq(acks + write_issued - ack_back),
        ]
        with m.If(read_issued):
            m.d.sync += to_read.eq(to_read - 1)

        # Network: the head word to the other tiles; a length-0 DMA sends one bare word.
        last_word = index == cmd.length - 1
        bare = active & (cmd.length == 0) & remote.any() & ~sent
        net = self.net_out.payload
        m.d.comb += [
            net.tiles.eq(remote), net.addr.eq(cmd.dst + index),
            net.data.eq(Mux(bare, 0, words.r_data)),
            net.write.eq(~bare), net.last.eq(bare | last_word), net.signal.eq(cmd.remote_signal),
            net.semaphore.eq(cmd.remote_semaphore),
            self.net_out.valid.eq(bare | (active & head & remote.any() & ~sent)),
        ]
        with m.If(self.net_out.valid & self.net_out.ready):
            m.d.sync += sent.eq(1)

        # The head word is finished when written (if local) and sent (if remote).
        head_written = written | write_issued | ~local
        head_sent = sent | (self.net_out.valid & self.net_out.ready) | ~remote.any()
        with m.If(active & head & head_written & head_sent & ~finishing):
            m.d.comb += words.r_en.eq(1)
            m.d.sync += [index.eq(index + 1), written.eq(0), sent.eq(0)]
            with m.If(last_word):
                m.d.sync += finishing.eq(1)
        with m.Elif(write_issued):
            m.d.sync += written.eq(1)
        with m.If(active & (cmd.length == 0) & ~finishing & (~remote.any() | sent)):
            m.d.sync += finishing.eq(1)

        # Finished: every write acknowledged; report, and the local arrival if asked.
        with m.If(finishing & (acks == 0)):
            m.d.sync += [active.eq(0), finishing.eq(0), done_valid.eq(1),
                         self.done.payload.eq(cmd.signal),
                         arrival_valid.eq(local & cmd.remote_signal)]
        return m
