"""The DMA engine: copies a scratchpad region to this tile and/or other tiles (see
:class:`spec.isa.DmaArgs`), and the network word it sends."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from rtl.scratchpad import Request, Response, failed
from spec.isa import (
    ADDR_BITS,
    CHANNEL_BITS,
    MAX_DMA_LENGTH,
    MEM_ADDR_BITS,
    SIGNAL,
    TILE_MASK_BITS,
    DmaArgs,
    DmaTarget,
    mesh_mask,
    tile_bit,
)
from spec.memory import MemRead
from spec.params import check_array_size, check_bool, check_coord, check_grid, check_int

__all__ = ["DmaEngine", "NetWord"]


class NetWord(data.StructLayout):
    """One word on the tile's network port: store ``data`` at ``addr`` on every tile of
    ``tiles`` (when ``write``); on ``last``, add one to semaphore ``semaphore`` there
    (when ``signal``). A DMA of length 0 is one word with ``write = 0``, ``last = 1``.

    ``target`` STORE: ``data`` goes to word ``addr`` of memory channel ``channel``
    (``tiles`` 0); LOAD: a read request to that channel, ``addr`` its first word and
    ``data`` a :class:`spec.memory.MemRead` (``last`` 1, ``write`` 0)."""

    def __init__(self, n: int):
        super().__init__({
            "tiles": unsigned(TILE_MASK_BITS), "addr": unsigned(MEM_ADDR_BITS),
            "data": unsigned(8 * n), "write": 1, "last": 1, "signal": 1,
            "semaphore": unsigned(4), "target": DmaTarget, "channel": unsigned(CHANNEL_BITS),
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

    A STORE (``memory``) reads its words likewise and sends each to its memory channel
    (``target`` STORE words); a LOAD reads nothing and sends one LOAD word, the read
    request, whose reply raises ``remote_semaphore`` here through the network. Without
    ``memory`` (the default; a memory DMA needs N ≥ 4 for its request) the engine is
    never given one: the sequencer refuses them.

    ``position`` = (x, y) of the tile, or None: then the port ``mask_bit`` gives the
    tile's bit of a tile mask (y * 8 + x), so one design serves every tile of a chip.
    ``mesh`` = (columns, rows): a command's tile-mask bits of tiles outside it are
    dropped (the sequencer refuses such a DMA before it gets here). ``addr_bits``: the
    width of the scratchpad port's addresses (the sequencer has checked every region
    fits the scratchpad); network words carry full 16-bit addresses.
    """

    #: Words read ahead of their write/send.
    BUFFER = 8

    def __init__(self, n: int = 8, position: tuple[int, int] | None = (0, 0),
                 addr_bits: int = 16, mesh: tuple[int, int] = (8, 8), memory: bool = False):
        check_array_size("n", n)
        self.memory = check_bool("memory", memory)
        self.read_layout = MemRead(n) if memory else None  # refuses N < 4
        check_int("addr_bits", addr_bits, 1, ADDR_BITS)
        mesh = check_grid("mesh", mesh, 8)
        if position is not None:
            position = check_coord("tile position", position, mesh)
        self.n, self.position, self.addr_bits, self.mesh = n, position, addr_bits, mesh
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
        st = self._state(m)
        for stage in (self._accept, self._requests, self._responses, self._network, self._advance):
            stage(m, st)
        return m

    def _state(self, m: Module) -> SimpleNamespace:
        """The command being run, its counters and the word buffer (head word first)."""
        st = SimpleNamespace()
        st.cmd = Signal(DmaArgs())
        st.active = Signal()
        if self.position is None:
            own_bit = Signal(TILE_MASK_BITS)
            m.d.comb += own_bit.eq(Const(1, TILE_MASK_BITS) << self.mask_bit)
        else:
            x, y = self.position
            own_bit = tile_bit(x, y)
        st.local = (st.cmd.tiles & own_bit).any()
        st.remote = st.cmd.tiles & ~own_bit
        if self.memory:
            st.store = st.cmd.target == DmaTarget.STORE
            st.load = st.cmd.target == DmaTarget.LOAD
            st.own_x, st.own_y = ((self.mask_bit[:3], self.mask_bit[3:6])
                                  if self.position is None else self.position)
        else:
            st.store = st.load = Const(0)
        # Words leave on the network: to other tiles, or to a memory channel.
        st.outward = st.remote.any() | st.store
        m.d.comb += self.busy.eq(st.active)

        # Reads issued, responses expected: a tag per request (1 = read, 0 = write ack).
        m.submodules.tags = st.tags = fifo.SyncFIFOBuffered(width=1, depth=2 * self.BUFFER)
        m.submodules.words = st.words = fifo.SyncFIFOBuffered(width=8 * self.n,
                                                              depth=self.BUFFER)
        st.to_read = Signal(range(MAX_DMA_LENGTH + 1))  # words not yet requested
        st.in_flight = Signal(range(self.BUFFER + 1))  # reads requested, not yet buffered
        st.index = Signal(range(MAX_DMA_LENGTH + 1))  # the buffered word being written/sent
        st.written, st.sent = Signal(name="written"), Signal(name="sent")  # the head word's
        # Write acknowledgements still to come (each write holds a tag until its ack).
        st.acks = Signal(range(2 * self.BUFFER + 1))
        st.finishing = Signal()  # every word handled; waiting for acks, then done
        st.done_valid = Signal()
        st.arrival_valid = Signal()
        return st

    def _accept(self, m: Module, st: SimpleNamespace) -> None:
        """A new command while idle and nothing is left to report."""
        m.d.comb += [self.done.valid.eq(st.done_valid), self.arrival.valid.eq(st.arrival_valid),
                     self.arrival.payload.eq(st.cmd.remote_semaphore)]
        with m.If(self.done.ready):
            m.d.sync += st.done_valid.eq(0)
        with m.If(self.arrival.ready):
            m.d.sync += st.arrival_valid.eq(0)

        m.d.comb += self.cmd.ready.eq(~st.active & ~st.done_valid & ~st.arrival_valid)
        with m.If(self.cmd.valid & self.cmd.ready):
            p = self.cmd.payload
            tiles = p.target == DmaTarget.TILES
            m.d.sync += [st.cmd.eq(p), st.cmd.tiles.eq(Mux(tiles, p.tiles & mesh_mask(self.mesh),
                                                           0)),
                         st.active.eq(1),
                         st.to_read.eq(Mux(p.target == DmaTarget.LOAD, 0, p.length)),
                         st.index.eq(0), st.written.eq(0), st.sent.eq(0), st.acks.eq(0),
                         st.finishing.eq(0)]

    def _requests(self, m: Module, st: SimpleNamespace) -> None:
        """The request mux: the head word's write first, else the next read."""
        cmd, words, tags = st.cmd, st.words, st.tags
        st.head = head = words.r_rdy
        want_write = st.active & head & st.local & ~st.written
        room = (st.in_flight + words.level) < self.BUFFER
        want_read = st.active & (st.to_read != 0) & room
        m.d.comb += self.req.payload.write.eq(want_write)
        with m.If(want_write):
            m.d.comb += [self.req.payload.addr.eq(cmd.dst + st.index),
                         self.req.payload.data.eq(words.r_data),
                         self.req.valid.eq(tags.w_rdy)]
        with m.Else():
            m.d.comb += [self.req.payload.addr.eq(cmd.src + (cmd.length - st.to_read)),
                         self.req.valid.eq(want_read & tags.w_rdy)]
        issued = self.req.valid & self.req.ready
        m.d.comb += [tags.w_en.eq(issued), tags.w_data.eq(~want_write)]
        st.read_issued = issued & ~want_write
        st.write_issued = issued & want_write

    def _responses(self, m: Module, st: SimpleNamespace) -> None:
        """Read data into the buffer, write acks counted; an error status is sticky."""
        tags, words = st.tags, st.words
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
            st.in_flight.eq(st.in_flight + st.read_issued - read_back),
            st.acks.eq(st.acks + st.write_issued - ack_back),
        ]
        with m.If(st.read_issued):
            m.d.sync += st.to_read.eq(st.to_read - 1)

    def _network(self, m: Module, st: SimpleNamespace) -> None:
        """The head word to the other tiles or the memory channel; a length-0 DMA sends
        one bare word, a LOAD its one request word."""
        cmd, remote = st.cmd, st.remote
        st.last_word = last_word = st.index == cmd.length - 1
        bare = st.active & (cmd.length == 0) & remote.any() & ~st.sent
        request = st.active & st.load & ~st.sent
        net = self.net_out.payload
        data = Mux(bare, 0, st.words.r_data)
        if self.memory:
            read = Signal(self.read_layout)
            m.d.comb += [read.spad_addr.eq(cmd.dst), read.x.eq(st.own_x), read.y.eq(st.own_y),
                         read.length.eq(cmd.length)]
            data = Mux(request, read.as_value(), data)
        m.d.comb += [
            net.tiles.eq(remote),
            net.addr.eq(Mux(st.store | st.load, cmd.mem_addr, cmd.dst) + st.index),
            net.data.eq(data), net.target.eq(cmd.target), net.channel.eq(cmd.channel),
            net.write.eq(~bare & ~request), net.last.eq(bare | request | last_word),
            net.signal.eq(cmd.remote_signal & ~st.store), net.semaphore.eq(cmd.remote_semaphore),
            self.net_out.valid.eq(bare | request
                                  | (st.active & st.head & st.outward & ~st.sent)),
        ]
        with m.If(self.net_out.valid & self.net_out.ready):
            m.d.sync += st.sent.eq(1)

    def _advance(self, m: Module, st: SimpleNamespace) -> None:
        """The head word is finished when written (if local) and sent (if remote); the
        command when every word is and every write acknowledged: report it, and the
        local arrival if asked."""
        cmd, remote = st.cmd, st.remote
        head_written = st.written | st.write_issued | ~st.local
        head_sent = st.sent | (self.net_out.valid & self.net_out.ready) | ~st.outward
        with m.If(st.active & st.head & head_written & head_sent & ~st.finishing):
            m.d.comb += st.words.r_en.eq(1)
            m.d.sync += [st.index.eq(st.index + 1), st.written.eq(0), st.sent.eq(0)]
            with m.If(st.last_word):
                m.d.sync += st.finishing.eq(1)
        with m.Elif(st.write_issued):
            m.d.sync += st.written.eq(1)
        with m.If(st.active & ((cmd.length == 0) | st.load) & ~st.finishing
                  & (~(remote.any() | st.load) | st.sent)):
            m.d.sync += st.finishing.eq(1)

        with m.If(st.finishing & (st.acks == 0)):
            m.d.sync += [st.active.eq(0), st.finishing.eq(0), st.done_valid.eq(1),
                         self.done.payload.eq(cmd.signal),
                         st.arrival_valid.eq(st.local & cmd.remote_signal)]
