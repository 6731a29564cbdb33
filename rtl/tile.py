"""A tile: sequencer, scratchpad, accumulator memory, GEMM engine (tensor core), VEC
engine (vector unit) and DMA engine, with a host port and a network port."""

from __future__ import annotations

from amaranth import Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from rtl.accumulator import AccumulatorMemory
from rtl.dma_engine import DmaEngine, NetWord
from rtl.gemm_engine import GemmEngine
from rtl.scratchpad import COUNTER_BITS as ECC_COUNTER_BITS
from rtl.scratchpad import Scratchpad
from rtl.sequencer import ProgramWrite, Sequencer, SequencerStatus
from rtl.vec_engine import VecEngine
from spec.isa import DIM_BITS, TILE_MASK_BITS
from spec.params import check_array_size, check_bool, check_coord, check_grid

__all__ = ["Counters", "Tile"]

#: Width of a performance counter.
COUNTER_BITS = 32


#: The accumulator memory's read ports: the GEMM engine's and the vector engine's a, b
#: and c operands (one copy of the memory each, ``spec.energy.ACC_COPIES``).
ACC_READ_PORTS = ("gemm", "vec_a", "vec_b", "vec_c")


class Counters(data.StructLayout):
    """Cycle counts from ``go`` until the program halts: every running cycle, split
    into exclusive phases by which engines are busy (``stall``: none is, the sequencer
    is fetching or waiting), of those stall cycles the ones a WAIT holds (``wait``:
    with no engine busy, only words arriving from the network release it), the tensor
    core's accepted operand beats, and the MACs of the GEMMs dispatched (m·k·p of each
    as the GEMM engine takes it, registers added: the work a program does at run time,
    modulo 2^32), the scratchpad's word accesses (``spad``: reads and writes of its
    banks by the engines, the sequencer and arriving network words), the instructions
    the sequencer fetched (``fetches``: one read of the instruction memory each, a
    loop's body once per pass) and the accumulator memory's entry accesses
    (``acc_reads``: the entries a VEC beat reads, one per operand its op uses, a
    GEMM's accumulating result rows, the sequencer's accumulator LOADs;
    ``acc_writes``: the entries the GEMM (a result's rows up to m) and vector engines
    write; each write goes into every copy of the memory, one per read port)."""

    def __init__(self):
        super().__init__({name: unsigned(COUNTER_BITS) for name in (
            "cycles", "gemm", "vec", "gemm_vec", "dma", "stall", "wait", "tc_beats",
            "macs", "spad", "fetches", "acc_reads", "acc_writes")})


def _join(m: Module, source, sink) -> None:
    """Connect two request/response streams whose payloads share field names (a sink
    field the source lacks, the fault-injection ``flip`` or the write and data of the
    sequencer's reads, is tied to 0)."""
    m.d.comb += [sink.valid.eq(source.valid), source.ready.eq(sink.ready)]
    src_fields = dict(source.payload.shape())
    for name, _ in sink.payload.shape():
        if name in src_fields:
            m.d.comb += sink.payload[name].eq(source.payload[name])


class Tile(wiring.Component):
    """One tile of the chip; its network port is raw words (``rtl.chip`` adds the network
    interface and the router).

    The host loads the program (``program``), fills and reads the scratchpad through the
    ``host`` port, appends KV tokens and maps pages through the ``kv`` port, pulses
    ``go`` (the sequencer's ``start``) and watches ``status``. The sequencer dispatches
    GEMM, VEC and DMA instructions to their engines, which run in parallel and share the
    scratchpad (ports ``ga``/``gal``/``gb`` for the GEMM operands — ``gal`` reads the low
    limbs of a joined A — ``vec``, ``dma``, ``net`` for arriving words, ``seq`` for the
    sequencer's LOADs, ``host``, ``kv``) and the accumulator memory (GEMM and VEC write, the VEC
    engine writing first when both do).

    ``net_out`` carries the DMA words bound for other tiles; ``net_in`` takes words
    from other tiles (written at their address; the last word of a signalling DMA adds
    one to its semaphore once the write is done).

    Parameters: ``n`` (tensor core and vector unit size), ``position`` and ``mesh``
    (x, y and columns, rows; ``position`` None: the ``mask_bit`` input names the tile),
    ``banks`` x ``depth`` scratchpad words, the KV geometry (``page_size``,
    ``token_words``, ``num_pages``, ``sequences``, ``max_pages``, see
    :class:`rtl.scratchpad.Scratchpad`), ``acc_depth`` accumulator entries, ``slots``
    vector-unit slots, ``program_depth`` instructions, ``fault_injection`` (the host
    port can flip stored bits, a test hook), ``sim_gating`` (for simulation: the vector
    unit's, the tensor core's and the scratchpad's clocks are gated while they are idle,
    which Verilator skips; see :class:`rtl.vec_engine.VecEngine`,
    :class:`rtl.gemm_engine.GemmEngine` and :class:`rtl.scratchpad.Scratchpad`),
    ``memory_channels`` and ``channel_words`` (the chip's memory channels a STORE or LOAD
    DMA may name and the words of each; none by default).
    """

    def __init__(self, *, n: int = 8, position: tuple[int, int] | None = (0, 0),
                 mesh: tuple[int, int] = (1, 1), banks: int = 8, depth: int = 2048,
                 page_size: int = 16, token_words: int = 4, num_pages: int = 64,
                 sequences: int = 4, max_pages: int = 64, acc_depth: int = 256,
                 slots: int = 8, program_depth: int = 4096, fault_injection: bool = False,
                 sim_gating: bool = False, memory_channels: int = 0, channel_words: int = 0):
        check_array_size("n", n)
        mesh = check_grid("mesh", mesh, 8)
        if position is not None:
            position = check_coord("tile position", position, mesh)
        self.n, self.position, self.mesh = n, position, mesh
        self.sim_gating = check_bool("sim_gating", sim_gating)
        self.scratchpad = Scratchpad(
            banks, depth, 8 * n, ports=("ga", "gal", "gb", "vec", "dma", "net", "seq", "host",
                                      "kv"),
            kv_port="kv", page_size=page_size, token_words=token_words, num_pages=num_pages,
            sequences=sequences, max_pages=max_pages, fault_injection=fault_injection,
            gate_clock=self.sim_gating)
        sp = self.scratchpad
        self.sequencer = Sequencer(array_size=n, scratchpad_words=sp.words,
                                   acc_depth=acc_depth, slots=slots, mesh=mesh,
                                   program_depth=program_depth,
                                   memory_channels=memory_channels,
                                   channel_words=channel_words)
        self.acc_depth, self.slots, self.program_depth = acc_depth, slots, program_depth
        pc_bits = ceil_log2(program_depth)
        # Without a position, the tile's mask bit (y * 8 + x) is an input: every tile of
        # a chip is then the same design (rtl.chip builds it once for simulation).
        ports = {} if position is not None else {"mask_bit": In(range(TILE_MASK_BITS))}
        super().__init__({**ports,
            "program": In(stream.Signature(ProgramWrite(pc_bits))),
            "go": In(1),
            "status": Out(SequencerStatus(pc_bits)),
            "host_req": In(stream.Signature(sp.request_layout)),
            "host_resp": Out(stream.Signature(sp.response_layout)),
            "kv_req": In(stream.Signature(sp.kv_request_layout)),
            "kv_resp": Out(stream.Signature(sp.response_layout)),
            "net_out": Out(stream.Signature(NetWord(n))),
            "net_in": In(stream.Signature(NetWord(n))),
            "counters": Out(Counters()),
            "engine_error": Out(3),  # sticky: GEMM, VEC, DMA engine saw an error status
            "corrected_count": Out(ECC_COUNTER_BITS),
            "uncorrectable_count": Out(ECC_COUNTER_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        n, sp = self.n, self.scratchpad
        m.submodules.scratchpad = sp
        m.submodules.sequencer = seq = self.sequencer
        m.submodules.acc = acc = AccumulatorMemory(
            n, self.acc_depth, read_ports=ACC_READ_PORTS,
            writers=("vec", "gemm"), banks=2)
        m.submodules.gemm = gemm = GemmEngine(n, acc_depth=self.acc_depth,
                                                gate_core_clock=self.sim_gating)
        m.submodules.vec = vec = VecEngine(n, slots=self.slots, acc_depth=self.acc_depth,
                                                   gate_unit_clock=self.sim_gating)
        # (The DMA engine's read addresses need only the scratchpad's address bits.)
        m.submodules.dma = dma = DmaEngine(n, position=self.position, mesh=self.mesh,
                                           addr_bits=ceil_log2(sp.words),
                                           memory=self.sequencer.memory_channels > 0)
        if self.position is None:
            m.d.comb += dma.mask_bit.eq(self.mask_bit)

        # Host side.
        wiring.connect(m, wiring.flipped(self.program), seq.program)
        m.d.comb += [seq.start.eq(self.go), self.status.eq(seq.status),
                     self.corrected_count.eq(sp.corrected_count),
                     self.uncorrectable_count.eq(sp.uncorrectable_count)]
        wiring.connect(m, wiring.flipped(self.host_req), sp.host_req)
        wiring.connect(m, sp.host_resp, wiring.flipped(self.host_resp))
        wiring.connect(m, wiring.flipped(self.kv_req), sp.kv_req)
        wiring.connect(m, sp.kv_resp, wiring.flipped(self.kv_resp))

        # Sequencer to engines.
        for name, engine in (("gemm", gemm), ("vec", vec), ("dma", dma)):
            wiring.connect(m, getattr(seq, name), engine.cmd)
            wiring.connect(m, engine.done, getattr(seq, f"{name}_done"))

        # Engines to the scratchpad.
        for req, resp, port in ((gemm.a_req, gemm.a_resp, "ga"),
                                (gemm.a_lo_req, gemm.a_lo_resp, "gal"),
                                (gemm.b_req, gemm.b_resp, "gb"),
                                (vec.spad_req, vec.spad_resp, "vec"),
                                (dma.req, dma.resp, "dma"),
                                (seq.spad_req, seq.spad_resp, "seq")):
            _join(m, req, getattr(sp, f"{port}_req"))
            _join(m, getattr(sp, f"{port}_resp"), resp)

        # Engines to the accumulator memory.
        wiring.connect(m, gemm.acc_w, acc.gemm)
        wiring.connect(m, vec.acc_w, acc.vec)
        m.d.comb += [acc.gemm_addr.eq(gemm.acc_addr), gemm.acc_data.eq(acc.gemm_data)]
        for operand in "ab":
            m.d.comb += [getattr(acc, f"vec_{operand}_{end}").eq(getattr(vec, f"{operand}_{end}"))
                         for end in ("addr", "en")]
            m.d.comb += getattr(vec, f"{operand}_data").eq(getattr(acc, f"vec_{operand}_data"))
        # The c port is lent to the sequencer's LOAD while the vector engine is idle.
        m.d.comb += [acc.vec_c_addr.eq(Mux(seq.acc_read, seq.acc_addr, vec.c_addr)),
                     acc.vec_c_en.eq(seq.acc_read | vec.c_en),
                     vec.c_data.eq(acc.vec_c_data), seq.acc_data.eq(acc.vec_c_data)]

        # Network: DMA words out; arriving words written, their signal after the write.
        wiring.connect(m, dma.net_out, wiring.flipped(self.net_out))
        self._receive(m, sp, seq, dma)

        # Errors and counters.
        for bit, engine in enumerate((gemm, vec, dma)):
            with m.If(engine.error):
                m.d.sync += self.engine_error[bit].eq(1)
        c = self.counters
        running = seq.status.running | ~seq.status.halted & (gemm.busy | vec.busy | dma.busy)
        g, v, d = gemm.busy, vec.busy, dma.busy
        # A dispatched GEMM's m·k, then its product with p a cycle later (GEMMs are
        # dispatched at most one per instruction, five cycles apart).
        taken = gemm.cmd.valid & gemm.cmd.ready
        mk, gemm_p, product_due = Signal(2 * DIM_BITS), Signal(DIM_BITS), Signal()
        m.d.sync += [mk.eq(gemm.cmd.payload.m * gemm.cmd.payload.k),
                     gemm_p.eq(gemm.cmd.payload.p), product_due.eq(taken)]
        with m.If(self.go & ~seq.status.running):
            m.d.sync += c.eq(0)
        with m.Elif(running):
            m.d.sync += [
                c.cycles.eq(c.cycles + 1),
                c.gemm.eq(c.gemm + (g & ~v)),
                c.vec.eq(c.vec + (v & ~g)),
                c.gemm_vec.eq(c.gemm_vec + (g & v)),
                c.dma.eq(c.dma + (d & ~g & ~v)),
                c.stall.eq(c.stall + ~(g | v | d)),
                c.wait.eq(c.wait + (~(g | v | d) & seq.waiting)),
                c.tc_beats.eq(c.tc_beats + gemm.beat),
                c.macs.eq(c.macs + Mux(product_due, mk * gemm_p, 0)),
                c.spad.eq(c.spad + sp.accesses),
                c.fetches.eq(c.fetches + seq.fetching),
                c.acc_reads.eq(c.acc_reads + vec.a_en + vec.b_en + vec.c_en + gemm.acc_read
                               + seq.acc_read),
                c.acc_writes.eq(c.acc_writes + (gemm.acc_w.valid & gemm.acc_w.ready
                                                 & gemm.acc_w.payload.lanes.any())
                                + (vec.acc_w.valid & vec.acc_w.ready)),
            ]
        return m

    def _receive(self, m: Module, sp, seq, dma) -> None:
        """``net_in`` words into the scratchpad (``net`` port); the signal of a last word
        waits for every write before it; arrivals merge with the DMA engine's local one."""
        word = self.net_in.payload
        req = sp.net_req
        outstanding = Signal(range(64))
        pending_signal = Signal()  # a last word's signal, raised once the writes are done
        pending_semaphore = Signal(4)
        m.d.comb += [req.payload.addr.eq(word.addr), req.payload.write.eq(1),
                     req.payload.data.eq(word.data)]
        can_take = ~pending_signal & (outstanding < 63)
        with m.If(word.write):
            m.d.comb += [req.valid.eq(self.net_in.valid & can_take),
                         self.net_in.ready.eq(req.ready & can_take)]
        with m.Else():
            m.d.comb += self.net_in.ready.eq(can_take)
        taken = self.net_in.valid & self.net_in.ready
        m.d.comb += sp.net_resp.ready.eq(1)
        m.d.sync += outstanding.eq(outstanding + (taken & word.write) - sp.net_resp.valid)
        with m.If(taken & word.last & word.signal):
            m.d.sync += [pending_signal.eq(1), pending_semaphore.eq(word.semaphore)]

        # Arrivals: the network's (once its writes are acknowledged) before the DMA's.
        net_arrival = pending_signal & (outstanding == 0)
        with m.If(net_arrival):
            m.d.comb += [seq.arrival.valid.eq(1), seq.arrival.payload.eq(pending_semaphore)]
            m.d.sync += pending_signal.eq(0)
        with m.Else():
            m.d.comb += [seq.arrival.valid.eq(dma.arrival.valid),
                         seq.arrival.payload.eq(dma.arrival.payload)]
        m.d.comb += dma.arrival.ready.eq(~net_arrival)
