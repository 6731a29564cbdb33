"""The chip: a k x k mesh of tiles, each joined to its router by a network interface, and
one host port that reaches every tile (programs, scratchpad words, KV requests, go).

Node (x, y) is tile ``y * k + x``: :class:`rtl.tile.Tile` at that position, its
:class:`rtl.network_interface.NetworkInterface`, and router ``(x, y)`` of the
:class:`rtl.mesh.Mesh`. A DMA instruction naming other tiles leaves through the tile's
``net_out``, becomes packets in the NI, crosses the mesh and lands in the destination
tiles' scratchpads through their ``net_in`` (raising the named semaphore there).
"""

from __future__ import annotations

from fractions import Fraction

from amaranth import Cat, ClockSignal, Instance, Module, ResetSignal, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from rtl.memory_channel import HostWrite, MemoryChannel, MemoryPort
from rtl.mesh import Mesh
from rtl.network_interface import NetworkInterface, check_max_packet, check_memory_nodes
from rtl.scratchpad import COUNTER_BITS
from rtl.sequencer import ProgramWrite, SequencerStatus
from rtl.tile import Counters, Tile
from spec.isa import ADDR_BITS, CHANNEL_BITS, tile_index
from spec.memory import DEFAULT_LATENCY, DEFAULT_MEMORY_WORDS, machine_balance_bandwidth
from spec.noc import DEFAULT_DEPTH, MIN_K, MessageClass, NocConfig
from spec.params import check_bool

__all__ = ["TILE_MODULE", "Chip", "EccCounters", "MemoryCounters", "NetCounters", "with_tile"]

#: Verilog module name of the tile when the chip shares one tile design (``shared_tile``).
TILE_MODULE = "serrano_tile"

#: Host requests (per port) in flight before their responses return.
HOST_OUTSTANDING = 16


class EccCounters(data.StructLayout):
    """A tile scratchpad's saturating counts of corrected and uncorrectable reads since
    reset (:class:`rtl.scratchpad.Scratchpad`)."""

    def __init__(self):
        super().__init__({"corrected": unsigned(COUNTER_BITS),
                          "uncorrectable": unsigned(COUNTER_BITS)})


def with_tile(layout: data.StructLayout, tile_bits: int) -> data.StructLayout:
    """``layout``'s fields and a ``tile`` index: a host-port beat addressed to one tile."""
    return data.StructLayout({"tile": unsigned(tile_bits),
                             **{name: field.shape for name, field in layout}})


class MemoryCounters(data.StructLayout):
    """One memory channel's counters (see :class:`rtl.memory_channel.MemoryChannel`)."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in
                          ("reads", "writes", "requests", "dropped")})


class NetCounters(data.StructLayout):
    """One node's network counters: its interface's (see :class:`NetworkInterface`)
    and the flits its router sent over links to its neighbours (``links``,
    :attr:`rtl.mesh.Mesh.link_flits`)."""

    def __init__(self):
        super().__init__({name: unsigned(32) for name in
                          ("sent", "received", "dropped_out", "dropped_in", "links")})


class Chip(wiring.Component):
    """``k`` x ``k`` tiles on a mesh, built from one tile description.

    Parameters: ``k`` (mesh side, 1…8), ``tile`` (keyword arguments of
    :class:`rtl.tile.Tile` except ``position`` and ``mesh``), ``vcs``, ``depth``
    (router virtual channels and flit buffer depth) and ``max_packet`` (flits per packet
    of the network interfaces). ``shared_tile``: every tile is an instance of one
    Verilog module :data:`TILE_MODULE` (the tile without a fixed position, its
    ``mask_bit`` tied per instance) whose design is :attr:`tile_design`, to be
    elaborated once beside the chip (``sim.runner.build(..., modules=...)``): the
    simulator then compiles one tile instead of k * k. ``sim_gating`` (simulation only):
    the clocks of the mesh and of each network interface stop while they are idle
    (:class:`rtl.mesh.Mesh`, :class:`rtl.network_interface.NetworkInterface`); give the
    tiles theirs with ``tile={"sim_gating": True}``.

    Host port (every beat names its ``tile``):

    - ``program``: instruction words into a tile's program memory;
    - ``host_req`` → ``host_resp``, ``kv_req`` → ``kv_resp``: scratchpad and KV
      requests; responses return in request order across tiles;
    - ``go``: one bit per tile, a pulse starts that tile's program;
    - ``status``, ``counters``, ``engine_error``, ``ecc`` (:class:`EccCounters`): one
      entry per tile;
    - ``memory_write``: words into a memory channel's store (the memory image; a word
      for a channel the chip lacks is consumed and flagged in ``error``);
    - ``net``: each network interface's counters; ``memory``: each memory channel's
      (:class:`MemoryCounters`); ``error`` (sticky): a router, an interface or a memory
      channel dropped something, or a host beat named a tile outside the mesh (such a
      beat is consumed and, for a request, answered with ``bad_address``).

    Memory (:mod:`rtl.memory_channel`): channel c sits at node ``memory_nodes[c]``
    beside its tile (the node's memory requests go to it, its replies leave on the
    response class), with a store of ``memory_words`` words, ``memory_latency`` cycles
    of access latency and ``memory_bandwidth`` bytes per cycle shared equally by the
    channels (default: the machine balance of :func:`spec.memory.machine_balance_bandwidth`
    for this chip). The tiles' STORE and LOAD DMAs name the channels by index.
    """

    def __init__(self, k: int = 2, *, tile: dict | None = None, vcs: int = 2,
                 depth: int = DEFAULT_DEPTH, max_packet: int = 8, shared_tile: bool = False,
                 sim_gating: bool = False, memory_nodes: tuple = (),
                 memory_words: int = DEFAULT_MEMORY_WORDS, memory_bandwidth=None,
                 memory_latency: int = DEFAULT_LATENCY):
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 8:
            raise ValueError(f"the mesh side k must be an integer 1..8, not {k!r}")
        # Checked even when k = 1 builds no network (no interface or router to check them).
        NocConfig(k=max(k, MIN_K), vcs=vcs, depth=depth)
        check_max_packet(max_packet)
        if not isinstance(tile, dict | None):
            raise ValueError(f"tile must be a dict of rtl.tile.Tile parameters, not {tile!r}")
        tile = dict(tile or {})
        for key in ("position", "mesh", "memory_channels", "channel_words"):
            if key in tile:
                raise ValueError(f"the chip places its tiles itself: drop {key!r}")
        self.memory_nodes = check_memory_nodes(memory_nodes, k)
        if self.memory_nodes and k == 1:
            raise ValueError("a 1 x 1 chip has no network to reach memory channels")
        if self.memory_nodes:
            tile |= {"memory_channels": len(self.memory_nodes), "channel_words": memory_words}
        self.k, self.shared_tile = k, check_bool("shared_tile", shared_tile)
        if shared_tile:
            self.tile_design = Tile(position=None, mesh=(k, k), **tile)
            self.tiles = [self.tile_design.signature.create(path=(f"tile_{x}_{y}",))
                          for y in range(k) for x in range(k)]
        else:
            self.tiles = [Tile(position=(x, y), mesh=(k, k), **tile)
                          for y in range(k) for x in range(k)]
            self.tile_design = self.tiles[0]
        first = self.tile_design
        self.n = n = first.n
        spad_words = first.scratchpad.words
        # A 1 x 1 chip has no network (no interfaces, no mesh): its tile's network ports
        # are tied off.
        self.nis = [NetworkInterface(n, x, y, k=k, vcs=vcs, depth=depth, max_packet=max_packet,
                                     spad_words=spad_words, memory_nodes=self.memory_nodes,
                                     sim_gating=sim_gating)
                    for y in range(k) for x in range(k)] if k > 1 else []
        self.mesh = Mesh(k, payload_bits=self.nis[0].config.payload_bits, vcs=vcs, depth=depth,
                         sim_gating=sim_gating) if k > 1 else None
        channels = len(self.memory_nodes)
        if channels:
            total = (machine_balance_bandwidth(n, k * k) if memory_bandwidth is None
                     else Fraction(memory_bandwidth))
            self.memory_bandwidth = total
            self.channels = [MemoryChannel(n, k=k, vcs=vcs, depth=depth, words=memory_words,
                                           addr_bits=self.nis[0].addr_bits,
                                           bytes_per_cycle=total / channels,
                                           latency=memory_latency, max_packet=max_packet)
                             for _ in self.memory_nodes]
        else:
            self.memory_bandwidth, self.channels = None, []
        tiles = k * k
        self.tile_bits = tile_bits = max(1, ceil_log2(tiles))
        sp = first.scratchpad
        pc_bits = ceil_log2(first.program_depth)
        super().__init__({
            "program": In(stream.Signature(with_tile(ProgramWrite(pc_bits), tile_bits))),
            "go": In(tiles),
            "status": Out(data.ArrayLayout(SequencerStatus(pc_bits), tiles)),
            "counters": Out(data.ArrayLayout(Counters(), tiles)),
            "engine_error": Out(data.ArrayLayout(3, tiles)),
            "ecc": Out(data.ArrayLayout(EccCounters(), tiles)),
            "net": Out(data.ArrayLayout(NetCounters(), tiles)),
            "memory": Out(data.ArrayLayout(MemoryCounters(), max(channels, 1))),
            "host_req": In(stream.Signature(with_tile(sp.request_layout, tile_bits))),
            "host_resp": Out(stream.Signature(sp.response_layout)),
            "kv_req": In(stream.Signature(with_tile(sp.kv_request_layout, tile_bits))),
            "kv_resp": Out(stream.Signature(sp.response_layout)),
            "memory_write": In(stream.Signature(data.StructLayout({
                "channel": unsigned(CHANNEL_BITS),
                **{name: field.shape for name, field in
                   HostWrite(n, self.nis[0].addr_bits if self.nis else ADDR_BITS)}}))),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        if self.mesh is not None:
            m.submodules.mesh = self.mesh
        bad_tile = Signal()
        for index, tile in enumerate(self.tiles):
            x, y = index % self.k, index // self.k
            if self.shared_tile:
                m.submodules[f"tile_{x}_{y}"] = self._instance(tile)
                m.d.comb += tile.mask_bit.eq(tile_index(x, y))
            else:
                m.submodules[f"tile_{x}_{y}"] = tile
            m.d.comb += [
                tile.go.eq(self.go[index]),
                self.status[index].eq(tile.status),
                self.counters[index].eq(tile.counters),
                self.engine_error[index].eq(tile.engine_error),
                self.ecc[index].corrected.eq(tile.corrected_count),
                self.ecc[index].uncorrectable.eq(tile.uncorrectable_count),
            ]
            if self.mesh is None:
                m.d.comb += [tile.net_out.ready.eq(1), tile.net_in.valid.eq(0)]
                continue
            m.submodules[f"ni_{x}_{y}"] = ni = self.nis[index]
            wiring.connect(m, tile.net_out, ni.tile_out)
            wiring.connect(m, ni.tile_in, tile.net_in)
            if (x, y) in self.memory_nodes:
                self._memory_node(m, index, self.memory_nodes.index((x, y)))
            else:
                for v in range(len(ni.inject)):
                    wiring.connect(m, ni.inject[v], self.mesh.inject[index][v])
                    wiring.connect(m, self.mesh.eject[index][v], ni.eject[v])
            counters = self.net[index]
            m.d.comb += [counters.sent.eq(ni.sent), counters.received.eq(ni.received),
                         counters.dropped_out.eq(ni.dropped_out),
                         counters.dropped_in.eq(ni.dropped_in),
                         counters.links.eq(self.mesh.link_flits[index])]

        # Program words to the tile they name, host words into the channel they name.
        self._route(m, self.program, "tile", [tile.program for tile in self.tiles], bad_tile)
        bad_channel = Signal()
        self._route(m, self.memory_write, "channel", [c.host for c in self.channels],
                    bad_channel)
        bad_host = self._fan_out(m, "host")
        bad_kv = self._fan_out(m, "kv")
        net_error = Cat(ni.error for ni in self.nis).any() if self.mesh is not None else 0
        mesh_error = self.mesh.error if self.mesh is not None else 0
        memory_error = Cat(c.error for c in self.channels).any() if self.channels else 0
        with m.If(bad_tile | bad_host | bad_kv | bad_channel | net_error | mesh_error
                  | memory_error):
            m.d.sync += self.error.eq(1)
        return m

    def _memory_node(self, m: Module, index: int, channel: int) -> None:
        """Node ``index`` with memory channel ``channel`` beside its tile: the request
        VCs through a :class:`MemoryPort` (memory packets to the channel), the channel's
        replies on the first response VC (the interface injects only requests)."""
        ni, mesh, memory = self.nis[index], self.mesh, self.channels[channel]
        config = ni.config
        m.submodules[f"memory_{channel}"] = memory
        m.submodules[f"memory_port_{channel}"] = port = MemoryPort(config, memory.payload_layout)
        requests = config.class_vcs(MessageClass.REQUEST)
        responses = config.class_vcs(MessageClass.RESPONSE)
        for i, v in enumerate(requests):
            wiring.connect(m, ni.inject[v], mesh.inject[index][v])
            wiring.connect(m, mesh.eject[index][v], port.eject[i])
            wiring.connect(m, port.tile[i], ni.eject[v])
        for v in responses:
            wiring.connect(m, mesh.eject[index][v], ni.eject[v])
            if v == responses.start:
                m.d.comb += ni.inject[v].ready.eq(0)
            else:
                wiring.connect(m, ni.inject[v], mesh.inject[index][v])
        wiring.connect(m, memory.resp, mesh.inject[index][responses.start])
        wiring.connect(m, port.req, memory.req)
        counters = self.memory[channel]
        m.d.comb += [counters[name].eq(getattr(memory, name)) for name, _ in counters.shape()]

    @staticmethod
    def _route(m: Module, source, key: str, sinks: list, bad: Signal) -> None:
        """Beats of the stream ``source`` to the stream of ``sinks`` its field ``key``
        names (the payload's other fields copied by name); a beat naming none is
        consumed and flags ``bad``."""
        beat = source.payload
        if len(sinks) < 1 << len(beat[key]):
            m.d.comb += bad.eq(source.valid & (beat[key] >= len(sinks)))
            with m.If(bad):
                m.d.comb += source.ready.eq(1)
        for index, sink in enumerate(sinks):
            m.d.comb += [sink.payload[name].eq(beat[name]) for name, _ in sink.payload.shape()]
            with m.If(beat[key] == index):
                m.d.comb += [sink.valid.eq(source.valid), source.ready.eq(sink.ready)]

    def _instance(self, tile) -> Instance:
        """An instance of :data:`TILE_MODULE` bound to the interface object ``tile``
        (ports named as Amaranth names a top-level component's: the member path joined
        by ``__``)."""
        ports = {}
        for path, member, value in self.tile_design.signature.flatten(tile):
            name = "__".join(str(part) for part in path)
            ports[("i_" if member.flow == In else "o_") + name] = value
        return Instance(TILE_MODULE, i_clk=ClockSignal(), i_rst=ResetSignal(), **ports)

    def _fan_out(self, m: Module, port: str) -> Signal:
        """``{port}_req`` beats to the tile they name; responses back in request order
        (a FIFO of tile indices picks whose response comes next). A beat for a tile
        outside the mesh gets a ``bad_address`` response of its own; returns the flag
        that one was taken."""
        req, resp = getattr(self, f"{port}_req"), getattr(self, f"{port}_resp")
        tiles = len(self.tiles)
        order = fifo.SyncFIFOBuffered(width=self.tile_bits + 1, depth=HOST_OUTSTANDING)
        m.submodules[f"{port}_order"] = order
        beat = req.payload
        outside = Signal(name=f"{port}_outside")
        m.d.comb += outside.eq(beat.tile >= tiles)
        accepted = Signal(name=f"{port}_accepted")
        m.d.comb += [order.w_data.eq(Cat(beat.tile, outside)),
                     order.w_en.eq(accepted)]
        for index, tile in enumerate(self.tiles):
            tile_req = getattr(tile, f"{port}_req")
            for name, _ in tile_req.payload.shape():
                m.d.comb += tile_req.payload[name].eq(beat[name])
            with m.If(~outside & (beat.tile == index)):
                m.d.comb += [tile_req.valid.eq(req.valid & order.w_rdy),
                             req.ready.eq(tile_req.ready & order.w_rdy)]
        with m.If(outside):
            m.d.comb += req.ready.eq(order.w_rdy)
        m.d.comb += accepted.eq(req.valid & req.ready)

        head_tile, head_outside = order.r_data[:self.tile_bits], order.r_data[-1]
        with m.If(order.r_rdy & head_outside):
            m.d.comb += [resp.valid.eq(1), resp.payload.status.bad_address.eq(1),
                         order.r_en.eq(resp.ready)]
        for index, tile in enumerate(self.tiles):
            tile_resp = getattr(tile, f"{port}_resp")
            m.d.comb += tile_resp.ready.eq(0)
            with m.If(order.r_rdy & ~head_outside & (head_tile == index)):
                m.d.comb += [resp.valid.eq(tile_resp.valid), resp.payload.eq(tile_resp.payload),
                             tile_resp.ready.eq(resp.ready),
                             order.r_en.eq(tile_resp.valid & resp.ready)]
        return accepted & outside
