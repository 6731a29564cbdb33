"""The GEMM engine: runs GEMM instructions on the tensor core, operands from the
scratchpad, results into the accumulator memory (see :class:`spec.isa.GemmArgs`)."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, DomainRenamer, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from rtl.accumulator import AccWrite, Entry
from rtl.scratchpad import Request, Response, failed
from rtl.sim_gate import gated
from rtl.tensor_core import OperandBeat, TensorCore
from spec.isa import ACC_ADDR_BITS, ADDR_BITS, COUNT_FIELD_BITS, SIGNAL, GemmArgs
from spec.numerics import NUMERICS
from spec.params import check_array_size, check_bool, check_int

__all__ = ["GemmEngine", "OperandFetch", "OperandStreamer"]

#: Width of a GEMM dimension field (m, k, p).
DIM_BITS = 12


class OperandFetch(data.StructLayout):
    """Fetch one operand block of k beats: block ``block`` of an operand at ``base``,
    starting at word ``start`` (the fetcher's caller keeps it as a running sum, so no
    multiply sits on the address path).

    ``rows = 0``: k consecutive words from ``start = base + block * k`` (with a
    ``stride`` s > 0, k words s apart from ``start = base + block``). ``rows = 1``:
    the block's N rows (row ``block * N + i``, zero when ``>= extent``) of ⌈k/N⌉ chunks,
    word ``start + chunk * extent + i`` with ``start = base + block * N``, transposed
    into k beats; with ``row_major`` as well, word ``start + i * ⌈k/N⌉ + chunk`` with
    ``start = base + block * N * ⌈k/N⌉`` (rows of consecutive words).

    With ``limbs`` (a fetch layout for a streamer built with ``limbs``): the values are
    joined from two int8 limbs, the high limbs from ``start`` on, the low ones at the
    same offsets from ``start_lo``: value = hi·2⁷ + lo.
    """

    def __init__(self, addr_bits: int, limbs: bool = False):
        fields = {
            "start": unsigned(addr_bits), "block": unsigned(DIM_BITS), "k": unsigned(DIM_BITS),
            "extent": unsigned(DIM_BITS), "rows": 1, "row_major": 1,
            "stride": unsigned(COUNT_FIELD_BITS),
        }
        if limbs:
            fields.update(start_lo=unsigned(addr_bits), limbs=1)
        super().__init__(fields)


class OperandStreamer(wiring.Component):
    """Turns :class:`OperandFetch` requests into tensor-core beats read from one
    scratchpad port, transposing row-major operands through a double-buffered N x N
    value buffer (one chunk fills while the previous one drains, so a row-major operand
    streams at one beat per cycle like a block-layout one). A draining chunk is read
    by a value index, not shifted, so a beat's handshake fans out to a few counters
    rather than to every buffer flip-flop.

    Built with ``limbs``, the streamer has a second port (``req_lo``/``resp_lo``) and
    beats of :attr:`spec.numerics.Numerics.joined_operand_bits`-bit values: a fetch
    with its ``limbs`` flag reads each word and its low-limb word in the same step (one
    request on each port) and joins them lane by lane, ``hi·2⁷ + lo``; other fetches
    give their int8 values sign-extended. Both ports issue at one word per cycle, so a
    joined operand streams as fast as a plain one.

    ``error`` (sticky) is set when a response carries an error status (the data, zero
    for an uncorrectable word, is still used, so the beat count never changes); a
    corrected word is good data.
    """

    #: Words issued but not yet consumed (tag FIFO depth); covers the scratchpad latency.
    IN_FLIGHT = 16

    def __init__(self, n: int, addr_bits: int = 16, limbs: bool = False):
        check_array_size("n", n)
        check_int("addr_bits", addr_bits, 1, ADDR_BITS)
        self.n, self.addr_bits, self.limbs = n, addr_bits, limbs
        #: Width of a beat's value.
        self.bits = NUMERICS.joined_operand_bits if limbs else NUMERICS.operand_bits
        ports = {
            "fetch": In(stream.Signature(OperandFetch(addr_bits, limbs))),
            "beats": Out(stream.Signature(OperandBeat(n, self.bits))),
            "req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "resp": In(stream.Signature(Response(8 * n))),
            "error": Out(1),
        }
        if limbs:
            ports.update(req_lo=Out(stream.Signature(Request(addr_bits, 8 * n))),
                         resp_lo=In(stream.Signature(Response(8 * n))))
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        st = SimpleNamespace()
        for stage in (self._issue, self._next_fetch, self._words, self._transpose):
            stage(m, st)
        return m

    def _issue(self, m: Module, st: SimpleNamespace) -> None:
        """Issue side: the current fetch's addresses (or zero words) in order, a tag per
        word for the consume side."""
        n, log_n = self.n, ceil_log2(self.n)
        # --- issue side: addresses (or zero words) in order ------------------------
        # Per word a tag says whether a response will come (bit 0; else the word is
        # zero) and whether a low-limb response comes with it (bit 1).
        m.submodules.tags = tags = fifo.SyncFIFOBuffered(width=2, depth=self.IN_FLIGHT)
        # Per fetch, for the consume side: k and the layout.
        desc_layout = data.StructLayout({"k": unsigned(DIM_BITS), "rows": 1})
        m.submodules.descs = descs = fifo.SyncFIFOBuffered(width=desc_layout.size, depth=4)

        f = Signal(OperandFetch(self.addr_bits, self.limbs))
        addr = Signal(self.addr_bits + DIM_BITS + 1)  # next word (wide: bounds were checked)
        chunk_base = Signal.like(addr)
        row = Signal(DIM_BITS + log_n + 1)  # rows layout: the row the next word belongs to
        lane = Signal(range(n))  # rows layout: i within the chunk
        remaining = Signal(DIM_BITS + 1)  # words (normal) or chunks (rows) left to issue
        issuing = Signal()

        zero_word = f.rows & (row >= f.extent)
        asking = issuing & ~zero_word & tags.w_rdy
        m.d.comb += [
            self.req.payload.addr.eq(addr),
            self.req.payload.write.eq(0),
        ]
        step = Signal()
        if self.limbs:
            # The two requests of a word may be accepted in different cycles; each port
            # asks until it has, and the word's step waits for both.
            lo_delta = Signal(self.addr_bits)  # start_lo - start: the low limbs' offset
            hi_sent, lo_sent = Signal(), Signal()
            m.d.comb += [
                self.req.valid.eq(asking & ~hi_sent),
                self.req_lo.valid.eq(asking & f.limbs & ~lo_sent),
                self.req_lo.payload.addr.eq(addr + lo_delta),
                self.req_lo.payload.write.eq(0),
                tags.w_data.eq(Cat(~zero_word, ~zero_word & f.limbs)),
                step.eq(issuing & tags.w_rdy & (
                    zero_word | (hi_sent | self.req.ready)
                    & (~f.limbs | lo_sent | self.req_lo.ready))),
            ]
            with m.If(step):
                m.d.sync += [hi_sent.eq(0), lo_sent.eq(0)]
            with m.Else():
                with m.If(self.req.valid & self.req.ready):
                    m.d.sync += hi_sent.eq(1)
                with m.If(self.req_lo.valid & self.req_lo.ready):
                    m.d.sync += lo_sent.eq(1)
        else:
            m.d.comb += [
                self.req.valid.eq(asking),
                tags.w_data.eq(~zero_word),
                step.eq(issuing & tags.w_rdy & (zero_word | self.req.ready)),
            ]
        m.d.comb += tags.w_en.eq(step)
        # Rows layout: the step from a row's word to the next row's, and from a chunk to
        # the next (chunk-major: 1 and extent; row-major: ⌈k/N⌉ and 1).
        row_step = Mux(f.row_major, (f.k + (n - 1)) >> log_n, 1)
        chunk_step = Mux(f.row_major, 1, f.extent)
        with m.If(step):
            with m.If(~f.rows):
                m.d.sync += addr.eq(addr + Mux(f.stride != 0, f.stride, 1))
                m.d.sync += remaining.eq(remaining - 1)
                with m.If(remaining == 1):
                    m.d.sync += issuing.eq(0)
            with m.Elif(lane == n - 1):  # next chunk: rows block*N.. of chunk + 1
                m.d.sync += [lane.eq(0), row.eq(f.block << log_n),
                             chunk_base.eq(chunk_base + chunk_step),
                             addr.eq(chunk_base + chunk_step),
                             remaining.eq(remaining - 1)]
                with m.If(remaining == 1):
                    m.d.sync += issuing.eq(0)
            with m.Else():
                m.d.sync += [lane.eq(lane + 1), row.eq(row + 1), addr.eq(addr + row_step)]
        st.__dict__.update(tags=tags, descs=descs, desc_layout=desc_layout, f=f, addr=addr,
                           chunk_base=chunk_base, row=row, lane=lane, remaining=remaining,
                           issuing=issuing, step=step,
                           lo_delta=lo_delta if self.limbs else None)

    def _next_fetch(self, m: Module, st: SimpleNamespace) -> None:
        """Take the next fetch (its descriptor to the consume side)."""
        n, log_n = self.n, ceil_log2(self.n)
        f, step, remaining, lane, issuing = st.f, st.step, st.remaining, st.lane, st.issuing
        descs = st.descs
        # The next fetch is taken in the cycle the current one issues its last word, so
        # fetches follow each other without a bubble (these assignments win over the
        # step's above).
        last_word = step & (remaining == 1) & (~f.rows | (lane == n - 1))
        m.d.comb += [
            self.fetch.ready.eq((~issuing | last_word) & descs.w_rdy),
            descs.w_en.eq(self.fetch.valid & self.fetch.ready),
            descs.w_data.eq(Cat(self.fetch.payload.k, self.fetch.payload.rows)),
        ]
        with m.If(self.fetch.valid & self.fetch.ready):
            p = self.fetch.payload
            m.d.sync += [
                f.eq(p),
                issuing.eq(1),
                st.addr.eq(p.start),
                st.chunk_base.eq(p.start),
                st.row.eq(p.block << log_n),
                lane.eq(0),
                remaining.eq(Mux(p.rows, (p.k + n - 1) >> log_n, p.k)),
            ]
            if self.limbs:
                m.d.sync += st.lo_delta.eq(p.start_lo - p.start)

    def _words(self, m: Module, st: SimpleNamespace) -> None:
        """Consume side: a word is complete when its responses (none for a zero word,
        two for joined limbs) have come; its values sign-extended to ``bits``."""
        n, bits, tags, descs = self.n, self.bits, st.tags, st.descs
        desc = Signal(st.desc_layout)
        m.d.comb += desc.eq(descs.r_data)
        tag_resp, tag_lo = tags.r_data[0], tags.r_data[1]
        responses = [(self.resp, tag_resp)]
        if self.limbs:
            responses.append((self.resp_lo, tag_lo))
        have_word = tags.r_rdy & (~tag_resp | self.resp.valid)
        if self.limbs:
            have_word &= ~tag_lo | self.resp_lo.valid
        pop_word = Signal()
        m.d.comb += tags.r_en.eq(pop_word)
        for resp, tagged in responses:
            m.d.comb += resp.ready.eq(pop_word & tagged)
            with m.If(resp.valid & resp.ready & failed(resp.payload.status)):
                m.d.sync += self.error.eq(1)
        # The word's values (sign-extended bytes, or joined limbs), `bits` wide each.
        word = Signal(bits * n)
        hi_word = Mux(tag_resp, self.resp.payload.data, 0)
        for i in range(n):
            hi = hi_word.word_select(i, 8).as_signed()
            value = hi
            if self.limbs:
                lo = self.resp_lo.payload.data.word_select(i, 8).as_signed()
                value = Mux(tag_lo, (hi << NUMERICS.limb_bits) + lo, hi)
            m.d.comb += word.word_select(i, bits).eq(value)
        st.__dict__.update(desc=desc, have_word=have_word, pop_word=pop_word, word=word)

    def _transpose(self, m: Module, st: SimpleNamespace) -> None:
        """Beats out: a block-layout word passed straight through, rows-layout words
        transposed through two buffers (filled by :meth:`_fill`) and drained a beat per
        cycle."""
        n, bits, desc_layout = self.n, self.bits, st.desc_layout
        have_word, pop_word, word = st.have_word, st.pop_word, st.word
        # Transpose buffers: two chunks of N words; a chunk drains one value of every word
        # per beat (value `drain_pos`), `count` beats, the last one `final` when it ends a
        # fetch.
        bufs = [[Signal(bits * n, name=f"t{b}_row{i}") for i in range(n)] for b in range(2)]
        full = Signal(2)
        count = [Signal(range(n + 1), name=f"t{b}_count") for b in range(2)]
        final = Signal(2)
        fill_sel, drain_sel = Signal(), Signal()
        drain_pos = Signal(range(n))  # the value of each row the next beat takes
        fill_row = Signal(range(n))
        words_left = Signal(DIM_BITS + 1)  # this fetch: words (normal) or values (rows)
        consuming = Signal()  # a descriptor is being consumed
        latched = Signal(desc_layout)  # the descriptor being consumed

        ending = Signal()  # the descriptor being consumed takes its last word


        drain_beat = Signal(OperandBeat(n, bits))
        drain_valid = Signal()
        sel_rows = [Mux(drain_sel, bufs[1][i], bufs[0][i]) for i in range(n)]
        sel_count = Mux(drain_sel, count[1], count[0])
        sel_final = Mux(drain_sel, final[1], final[0])
        m.d.comb += [
            drain_valid.eq(full.bit_select(drain_sel, 1)),
            drain_beat.last.eq(sel_final & (sel_count == 1)),
        ]
        for i in range(n):
            m.d.comb += drain_beat.data[i].eq(sel_rows[i].word_select(drain_pos, bits))

        # Block layout: each word is a beat, passed straight through once no transposed
        # chunk is waiting to drain (so the order of fetches is kept).
        passthrough = consuming & ~latched.rows & ~full.any()
        with m.If(passthrough):
            m.d.comb += [
                self.beats.valid.eq(have_word),
                self.beats.payload.data.eq(word),
                self.beats.payload.last.eq(words_left == 1),
                pop_word.eq(have_word & self.beats.ready),
            ]
            with m.If(have_word & self.beats.ready):
                m.d.sync += words_left.eq(words_left - 1)
                with m.If(words_left == 1):
                    m.d.comb += ending.eq(1)
                    m.d.sync += consuming.eq(0)
        with m.Else():
            m.d.comb += [self.beats.valid.eq(drain_valid), self.beats.payload.eq(drain_beat)]

        # Drain: one beat per cycle from the selected full buffer.
        with m.If(drain_valid & self.beats.ready & ~passthrough):
            m.d.sync += drain_pos.eq(drain_pos + 1)
            for b in range(2):
                with m.If(drain_sel == b):
                    m.d.sync += count[b].eq(count[b] - 1)
                    with m.If(count[b] == 1):
                        m.d.sync += [full[b].eq(0), drain_sel.eq(~drain_sel),
                                     drain_pos.eq(0)]
        st.__dict__.update(bufs=bufs, full=full, count=count, final=final, fill_sel=fill_sel,
                           fill_row=fill_row, words_left=words_left, consuming=consuming,
                           latched=latched, ending=ending)
        self._fill(m, st)

    def _fill(self, m: Module, st: SimpleNamespace) -> None:
        """Rows layout: N words (rows) per chunk into the free buffer; then the next
        descriptor."""
        n, descs, desc, have_word, word = self.n, st.descs, st.desc, st.have_word, st.word
        bufs, full, count, final, fill_sel = st.bufs, st.full, st.count, st.final, st.fill_sel
        fill_row, words_left, consuming = st.fill_row, st.words_left, st.consuming
        latched, ending, pop_word = st.latched, st.ending, st.pop_word
        rows_mode = consuming & latched.rows
        free = ~full.bit_select(fill_sel, 1)
        with m.If(rows_mode & free & have_word):
            m.d.comb += pop_word.eq(1)
            for b in range(2):
                with m.If(fill_sel == b):
                    for i in range(n):
                        with m.If(fill_row == i):
                            m.d.sync += bufs[b][i].eq(word)
            m.d.sync += fill_row.eq(fill_row + 1)
            with m.If(fill_row == n - 1):
                last_chunk = words_left <= n
                for b in range(2):
                    with m.If(fill_sel == b):
                        m.d.sync += [full[b].eq(1),
                                     count[b].eq(Mux(last_chunk, words_left, n)),
                                     final[b].eq(last_chunk)]
                m.d.sync += [fill_sel.eq(~fill_sel), fill_row.eq(0),
                             words_left.eq(Mux(last_chunk, 0, words_left - n))]
                with m.If(last_chunk):
                    m.d.comb += ending.eq(1)
                    m.d.sync += consuming.eq(0)

        # The next descriptor is latched when none is being consumed, or in the cycle the
        # current one ends, so fetches stream back to back (after the blocks above, so
        # these assignments win).
        with m.If((~consuming | ending) & descs.r_rdy):
            m.d.comb += descs.r_en.eq(1)
            m.d.sync += [consuming.eq(1), latched.eq(desc), words_left.eq(desc.k),
                         fill_row.eq(0)]


class GemmEngine(wiring.Component):
    """Runs GEMM instructions: A and B fetched on two scratchpad ports, the tensor core
    multiplies tile after tile, and each result row is written (or accumulated, shifted)
    into the accumulator memory.

    Output tiles are computed in row-tile-major order, k beats each; their rows land in
    consecutive entries from ``c`` (the C-tile layout of :class:`spec.isa.GemmArgs`), so
    the writeback only counts. A row past ``m`` (the last row tile's padding) takes its
    turn with no lane enabled, so its entry keeps its value and the GEMM its cycles.
    Commands wait in a queue of ``queue`` (so the sequencer dispatches past them); one
    starts while the previous one is still writing back (the feeder moves on at once),
    so GEMMs follow each other without a bubble in the tensor core. Each finished GEMM
    is reported on ``done`` (its ``signal``) after its last row is written, in order.

    Accumulating GEMMs read the old entry a cycle before writing it, the next row's
    entry while a row is written (rows of one GEMM are distinct entries): one row per
    cycle, plus a cycle at the start of each GEMM, whose first read comes after the
    previous GEMM's last write (so a GEMM accumulating onto the one before it reads
    that one's results).

    A GEMM with ``a_limbs`` reads A's high limbs on the A port and its low limbs on the
    A-low port in step, and multiplies the joined values (the tensor core's A operand is
    :attr:`spec.numerics.Numerics.joined_operand_bits` wide): P·V in one pass.

    Ports
    -----
    cmd : stream in of :class:`GemmArgs` (checked by the sequencer)
    done : stream out of :data:`spec.isa.SIGNAL`
    a_req/a_resp, a_lo_req/a_lo_resp, b_req/b_resp : scratchpad ports (reads only)
    acc_addr, acc_data : an accumulator read port (data the cycle after the address)
    acc_w : stream out of :class:`rtl.accumulator.AccWrite`
    busy : out, a GEMM is in the engine, queued or running (for utilisation counters)
    beat : out, the tensor core takes an operand beat this cycle (N² MACs)
    acc_read : out, a result row accumulating into its entry is written this cycle (the
        entry was read for it: a read-modify-write, for the tile's ``acc_reads``)
    error : out, sticky: a scratchpad error status or a tensor-core operand mismatch

    ``gate_core_clock`` (simulation only, see :mod:`rtl.sim_gate`): the tensor core's
    clock is gated while it is quiet (:attr:`TensorCore.active`), which Verilator skips.
    """

    def __init__(self, n: int = 8, acc_depth: int = 256, addr_bits: int = 16, queue: int = 4,
                 gate_core_clock: bool = False):
        check_array_size("GEMM engine size", n)
        self.queue = check_int("queue", queue, 1, 64)
        self.gate_core_clock = check_bool("gate_core_clock", gate_core_clock)
        check_int("acc_depth", acc_depth, 2, 1 << ACC_ADDR_BITS, power_of_two=True)
        check_int("addr_bits", addr_bits, 1, ADDR_BITS)
        self.n, self.acc_depth, self.addr_bits = n, acc_depth, addr_bits
        super().__init__({
            "cmd": In(stream.Signature(GemmArgs())),
            "done": Out(stream.Signature(SIGNAL)),
            "a_req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "a_resp": In(stream.Signature(Response(8 * n))),
            "a_lo_req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "a_lo_resp": In(stream.Signature(Response(8 * n))),
            "b_req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "b_resp": In(stream.Signature(Response(8 * n))),
            "acc_addr": Out(range(acc_depth)),
            "acc_data": In(Entry(n)),
            "acc_w": Out(stream.Signature(AccWrite(n, acc_depth))),
            "busy": Out(1),
            "beat": Out(1),
            "acc_read": Out(1),
            "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.n
        core = TensorCore(n, a_bits=NUMERICS.joined_operand_bits)
        if self.gate_core_clock:
            # For simulation only: the core's clock ticks only in cycles it can change
            # (TensorCore.active, a beat offered, reset), which Verilator then skips.
            # Cycle for cycle the same as the free-running core; not for synthesis.
            gated(m, "tensor", core.active | core.a.valid | core.b.valid)
            m.submodules.core = DomainRenamer("tensor")(core)
        else:
            m.submodules.core = core
        m.submodules.fetch_a = fetch_a = OperandStreamer(n, self.addr_bits, limbs=True)
        m.submodules.fetch_b = fetch_b = OperandStreamer(n, self.addr_bits)
        wiring.connect(m, fetch_a.beats, core.a)
        wiring.connect(m, fetch_b.beats, core.b)
        for source, sink, req, resp in (
                (fetch_a.req, fetch_a.resp, self.a_req, self.a_resp),
                (fetch_a.req_lo, fetch_a.resp_lo, self.a_lo_req, self.a_lo_resp),
                (fetch_b.req, fetch_b.resp, self.b_req, self.b_resp)):
            wiring.connect(m, source, wiring.flipped(req))
            wiring.connect(m, wiring.flipped(resp), sink)

        # --- writeback queue: what the result rows of each GEMM become -------------
        wb_layout = data.StructLayout({
            "c": unsigned(ACC_ADDR_BITS), "rows": unsigned(2 * DIM_BITS + 1),
            "last_tile": unsigned(2 * DIM_BITS + 1), "tail": unsigned(ceil_log2(self.n)),
            "accumulate": 1, "acc_shift": unsigned(4), "signal": SIGNAL,
        })
        m.submodules.wbq = wbq = fifo.SyncFIFOBuffered(width=wb_layout.size, depth=2)

        cmdq, feeding, setup = self._feeder(m, fetch_a, fetch_b, wbq, wb_layout)
        self._writeback(m, core, wbq, wb_layout)
        m.d.comb += [self.busy.eq(cmdq.r_rdy | feeding | setup | wbq.r_rdy),
                     self.beat.eq(core.a.valid & core.a.ready)]
        with m.If(core.error | fetch_a.error | fetch_b.error):
            m.d.sync += self.error.eq(1)
        return m

    def _feeder(self, m: Module, fetch_a, fetch_b, wbq, wb_layout):
        """Commands from their queue; per output tile one A fetch and one B fetch; per
        command its writeback entry. Returns the command queue and the ``feeding`` and
        ``setup`` states (for ``busy``)."""
        n, log_n = self.n, ceil_log2(self.n)
        cmd = Signal(GemmArgs())
        row_tiles, col_tiles = Signal(DIM_BITS), Signal(DIM_BITS)
        # First word of the current A and B blocks: running sums, advanced by k (block
        # layout), N (row layout) or N rows of ⌈k/N⌉ words (row-major) as the tiles
        # advance.
        a_start, b_start = Signal(self.addr_bits), Signal(self.addr_bits)
        a_lo_start = Signal(self.addr_bits)

        ti, tj = Signal(DIM_BITS), Signal(DIM_BITS)
        a_sent, b_sent = Signal(), Signal()
        feeding = Signal()
        setup = Signal()  # the cycle after taking a command: tile counts are registered

        def blocks(size):
            return (size + (n - 1)) >> log_n

        a_step = Mux(cmd.a_rows, Mux(cmd.a_row_major, blocks(cmd.k) << log_n, n), cmd.k)
        b_step = Mux(cmd.b_rows, n, Mux(cmd.b_stride != 0, 1, cmd.k))

        # Commands wait in a queue, so the sequencer can dispatch past a GEMM that waits
        # for the one before it (to the vector engine, say).
        m.submodules.cmdq = cmdq = fifo.SyncFIFOBuffered(width=GemmArgs().size,
                                                         depth=self.queue)
        m.d.comb += [cmdq.w_data.eq(self.cmd.payload), cmdq.w_en.eq(self.cmd.valid),
                     self.cmd.ready.eq(cmdq.w_rdy)]
        queued = Signal(GemmArgs())
        m.d.comb += [queued.eq(cmdq.r_data),
                     cmdq.r_en.eq(cmdq.r_rdy & ~feeding & ~setup & wbq.w_rdy)]
        with m.If(cmdq.r_en):
            p = queued
            m.d.sync += [cmd.eq(p), setup.eq(1), ti.eq(0), tj.eq(0),
                         row_tiles.eq(blocks(p.m)), col_tiles.eq(blocks(p.p))]
        wb_entry = Signal(wb_layout)
        tiles = row_tiles * col_tiles
        m.d.comb += [
            wb_entry.c.eq(cmd.c),
            wb_entry.rows.eq(tiles << log_n),
            # The last row tile's first row, and its live rows (0: all N are).
            wb_entry.last_tile.eq((tiles - col_tiles) << log_n),
            wb_entry.tail.eq(cmd.m[:log_n]),
            wb_entry.accumulate.eq(cmd.accumulate),
            wb_entry.acc_shift.eq(cmd.acc_shift),
            wb_entry.signal.eq(cmd.signal),
            wbq.w_data.eq(wb_entry),
            wbq.w_en.eq(setup),
        ]
        with m.If(setup):
            m.d.sync += [setup.eq(0), feeding.eq(1), a_sent.eq(0), b_sent.eq(0),
                         a_start.eq(cmd.a), a_lo_start.eq(cmd.a_lo), b_start.eq(cmd.b)]

        for streamer, sent, layout in ((fetch_a, a_sent, "a"), (fetch_b, b_sent, "b")):
            f = streamer.fetch.payload
            if layout == "a":
                m.d.comb += [f.start.eq(a_start), f.block.eq(ti), f.extent.eq(cmd.m),
                             f.rows.eq(cmd.a_rows), f.row_major.eq(cmd.a_rows & cmd.a_row_major),
                             f.start_lo.eq(a_lo_start),
                             f.limbs.eq(cmd.a_limbs)]
            else:
                m.d.comb += [f.start.eq(b_start), f.block.eq(tj), f.extent.eq(cmd.p),
                             f.rows.eq(cmd.b_rows),
                             f.stride.eq(Mux(cmd.b_rows, 0, cmd.b_stride))]
            m.d.comb += [f.k.eq(cmd.k), streamer.fetch.valid.eq(feeding & ~sent)]
        a_now = fetch_a.fetch.valid & fetch_a.fetch.ready
        b_now = fetch_b.fetch.valid & fetch_b.fetch.ready
        with m.If(feeding & (a_sent | a_now) & (b_sent | b_now)):  # this tile is fetched
            m.d.sync += [a_sent.eq(0), b_sent.eq(0)]
            with m.If(tj == col_tiles - 1):
                m.d.sync += [tj.eq(0), b_start.eq(cmd.b)]
                with m.If(ti == row_tiles - 1):
                    m.d.sync += feeding.eq(0)
                with m.Else():
                    m.d.sync += [ti.eq(ti + 1), a_start.eq(a_start + a_step),
                                 a_lo_start.eq(a_lo_start + a_step)]
            with m.Else():
                m.d.sync += [tj.eq(tj + 1), b_start.eq(b_start + b_step)]
        with m.Else():
            with m.If(a_now):
                m.d.sync += a_sent.eq(1)
            with m.If(b_now):
                m.d.sync += b_sent.eq(1)
        return cmdq, feeding, setup

    def _writeback(self, m: Module, core, wbq, wb_layout) -> None:
        """Result rows into consecutive accumulator entries (added to the shifted old
        value when accumulating), then the GEMM's done. A row past ``m`` (in the last row
        tile) is taken in its turn with no lane enabled: its entry keeps its value."""
        n, log_n = self.n, ceil_log2(self.n)
        wb = Signal(wb_layout)
        m.d.comb += wb.eq(wbq.r_data)
        row_count = Signal(2 * DIM_BITS + 1)
        addr = Signal(range(self.acc_depth))
        m.d.comb += addr.eq(wb.c + row_count)
        primed = Signal()  # accumulate: acc_data holds entry `addr` (read last cycle)
        done_valid = Signal()
        last_row = Signal()
        m.d.comb += last_row.eq(row_count == wb.rows - 1)
        padding = Signal()  # a row past m: nothing written
        m.d.comb += padding.eq((wb.tail != 0) & (row_count >= wb.last_tile)
                               & (row_count[:log_n] >= wb.tail))
        # While a row is written, the next row's entry is read (a different entry), so an
        # accumulating GEMM writes a row per cycle; the first row of a GEMM is read a
        # cycle ahead of its write, after the previous GEMM's last write.
        m.d.comb += [self.acc_addr.eq(Mux(core.c.ready & ~last_row, addr + 1, addr)),
                     self.done.valid.eq(done_valid)]
        with m.If(self.done.ready):
            m.d.sync += done_valid.eq(0)

        result = core.c.payload
        extended = Signal(Entry(n))
        for i in range(n):
            old = self.acc_data[i]
            m.d.comb += extended[i].eq(Mux(wb.accumulate, (old << wb.acc_shift) + result.data[i],
                                           result.data[i]))
        can_write = wbq.r_rdy & core.c.valid & (~done_valid | self.done.ready)
        m.d.comb += [
            self.acc_w.payload.addr.eq(addr),
            self.acc_w.payload.data.eq(extended),
            self.acc_w.payload.lanes.eq(Mux(padding, 0, (1 << n) - 1)),
            self.acc_w.valid.eq(can_write & (~wb.accumulate | primed)),
            core.c.ready.eq(self.acc_w.valid & self.acc_w.ready),
            self.acc_read.eq(core.c.ready & wb.accumulate),
        ]
        with m.If(wbq.r_rdy & core.c.valid & wb.accumulate & ~primed):
            m.d.sync += primed.eq(1)
        with m.If(core.c.ready):
            m.d.sync += [primed.eq(wb.accumulate & ~last_row), row_count.eq(row_count + 1)]
            with m.If(last_row):
                m.d.comb += wbq.r_en.eq(1)
                m.d.sync += [row_count.eq(0), done_valid.eq(1),
                             self.done.payload.eq(wb.signal)]
