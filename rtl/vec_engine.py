"""The vector engine: runs VEC instructions on the vector unit over accumulator entries."""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import (
    Array,
    Cat,
    DomainRenamer,
    Module,
    Mux,
    Signal,
    signed,
    unsigned,
)
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from rtl.accumulator import AccWrite, Entry
from rtl.scratchpad import Request, Response, failed
from rtl.sim_gate import gated
from rtl.vector_unit import VectorOpcode, VectorUnit
from spec.isa import ACC_ADDR_BITS, ADDR_BITS, COUNT_FIELD_BITS, SIGNAL, VecArgs, VecDst, VecPack
from spec.params import check_bool
from spec.vector import USES_B, USES_C

__all__ = ["VecEngine"]

#: Width of the beat counters' derived offsets: a tile offset is below
#: ceil(rows / N) * beats * N <= 2**14 for 7-bit counts, plus a step of slack.
OFFSET_BITS = 2 * COUNT_FIELD_BITS + 2
#: Width of the lane-mask bounds after adding r * causal and subtracting j * N.
BOUND_WORK_BITS = 16
#: Width of an accumulator range end (base + a region's size) in the hazard check.
RANGE_BITS = OFFSET_BITS


def operands_used(args) -> dict:
    """Per operand (``a``, ``b``, ``c``), whether the instruction ``args``
    (:class:`spec.isa.VecArgs`) reads it: a unless RECIP, b for ``spec.vector.USES_B``,
    c for ``USES_C`` unless ``c_imm``."""
    def one_of(codes):
        return Cat(*(args.op == code.value for code in codes)).any()

    return {"a": args.op != VectorOpcode.RECIP.value, "b": one_of(USES_B),
            "c": one_of(USES_C) & ~args.c_imm}


class _Flight(data.StructLayout):
    """What the write-back and completion sides keep of an in-flight instruction."""

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "dst": unsigned(ADDR_BITS),
            "dst_kind": VecDst,
            "pack": VecPack,
            "total": unsigned(ACC_ADDR_BITS),
            "total_write": 1,
            "rows": unsigned(COUNT_FIELD_BITS),
            "beats": unsigned(COUNT_FIELD_BITS),
            "dst_stride": unsigned(COUNT_FIELD_BITS),
        })


class VecEngine(wiring.Component):
    """Runs VEC instructions (:class:`spec.isa.VecArgs`) on a :class:`VectorUnit`.

    For row r in 0..rows-1 and beat j in 0..beats-1 (row-major), the engine reads the
    operands from three accumulator read ports (``a``, ``b``, ``c``; the C-tile layout
    ``base + (r // N)·beats·N + j·N + r mod N``, or one lane of entry ``base + r // N``
    for a scalar operand), builds one :class:`rtl.vector_unit.VectorOp` (lane mask from
    the key bounds ``lo``/``hi`` + r·``causal``; slot ``slot + r``; ``first`` on j = 0)
    and writes the result as ``dst_kind`` says: a whole tile entry, one lane of a
    scalar entry, or a packed scratchpad word ``dst + j·rows + r`` (``dst + r·s + j``
    with a ``dst_stride`` s); at the last beat of
    a row, the row's total into lane r mod N of entry ``total + r // N`` (the totals of
    the N rows sharing an entry are written together, after those rows' results). It
    is the hardware of :meth:`golden.tile_model.TileModel._vec`.

    Instructions overlap: up to ``in_flight`` of them are in the engine at once. Commands
    are queued (``queue`` of them, so the sequencer can dispatch ahead, e.g. to the GEMM
    engine), then wait in a pending register; a pending instruction starts issuing beats
    as soon as the previous one has issued its last, unless it depends on an
    instruction still in flight. Results are written in program order (one write-back side), and
    each instruction's ``done`` beat comes once its writes are complete, in order.

    Hazards
    -------
    - Between instructions, a conservative check on accumulator ranges: the pending
      instruction waits while one of the ranges its opcode reads (``a`` unless RECIP,
      ``b`` for RESCALE/ADD/MUL/SWIGLU, ``c`` for LOGIT/MAX/EXP/RESCALE/RECIP/SILU_LOAD/
      TOPK/TOPK_INDEX unless ``c_imm``; a tile or a scalar region as the operand is)
      overlaps a range an in-flight instruction has not finished writing (its TILE or
      SCALAR destination, its row totals). Scratchpad destinations never conflict (the
      engine reads only accumulator entries). An instruction's writes are finished when
      its last result and its last totals were taken by ``acc_w``. The verdict (3 x 2
      range compares per in-flight record) is registered; when no instruction is
      unfinished there is nothing to check and the command starts at once.
      Write-after-read and write-after-write need no check: every read of an earlier
      instruction is issued before any beat of a later one, and writes are in order.
    - The vector unit's state (running max and sums, 1/l, the top-k list, the SiLU
      table) needs none either: the unit processes ops strictly in order and most
      state is read and updated at one pipeline stage (totals in the last stage, the
      SiLU table at stage 0, which its read addresses too), so an op sees every earlier
      op's update exactly as consecutive beats of one row already do; the reciprocal
      and the top-k list are the exceptions, and the unit interlocks them (no DIV is
      taken while a RECIP is in its pipeline; a list-reading top-k beat waits a cycle
      right after another).
    - Inside an instruction, operands are read about ``unit.latency`` beats before
      their results are written: a beat must not read what an earlier beat of the same
      instruction writes, and a TILE destination must not overlap the total entries
      (the model refuses both); a beat reading and writing the same entry (in place) is
      fine.

    Parameters
    ----------
    n : int
        Lanes: 2 to 32, a power of two (the tensor core size).
    slots, max_top_k :
        Of the vector unit (:class:`rtl.vector_unit.VectorUnit`).
    acc_depth : int
        Accumulator entries, a power of two up to ``2**ACC_ADDR_BITS``.
    addr_bits : int
        Scratchpad word address width.
    in_flight : int
        Instructions in the engine at once (issuing, in the vector unit, writing or
        waiting for scratchpad acknowledgements): 2 to 16, a power of two.
    queue : int
        Commands queued ahead of the pending one: 2 to 64.

    Ports
    -----
    cmd : stream in of :class:`VecArgs` (range-checked by the sequencer)
    done : stream out of :data:`spec.isa.SIGNAL`, the instruction's ``signal``, one beat
        per finished instruction, in order
    a_addr/a_en/a_data, b_addr/b_en/b_data, c_addr/c_en/c_data : accumulator read
        ports (data the cycle after the address). A beat reads only the operands its
        op uses (:func:`operands_used`): the others' ``en`` stay low, as they do while
        a beat waits, whose operands stay on the ports
    acc_w : stream out of :class:`rtl.accumulator.AccWrite`
    spad_req/spad_resp : a scratchpad port, writes only; every write's response is
        counted
    busy : out, an instruction is in the engine (queued, pending or in flight)
    error : out, sticky: a scratchpad response with an error status

    Timing
    ------
    One beat per cycle in steady state, across instructions too, stalling on the vector
    unit's ``ops`` (RECIP interlock, results backing up), on ``acc_w``/``spad_req``
    backpressure and on a dependency. Row totals are gathered per block of N rows (they
    share an entry) and written in one ``acc_w`` cycle after the block's last result,
    which holds the next result for that cycle. Into an idle engine, from taking a
    command to its ``done`` beat: ``rows·beats + overhead`` cycles without stalls
    (``overhead`` = the vector unit's latency + 6: two cycles through the queue),
    plus ceil(rows / N) with totals and the scratchpad's write latency (minus one) for
    SPAD destinations. Commands are taken while the queue has room; an independent
    instruction issues its first beat the cycle after the previous one's last (once it
    has been pending two cycles), a dependent one starts the cycle after its producer's
    last write was taken (two cycles after, if other instructions are still in
    flight).
    """

    def __init__(self, n: int = 8, slots: int = 4, acc_depth: int = 256,
                 addr_bits: int = ADDR_BITS, max_top_k: int | None = None,
                 in_flight: int = 4, queue: int = 8, gate_unit_clock: bool = False):
        if n not in (2, 4, 8, 16, 32):
            raise ValueError(f"vector engine lanes must be a power of two from 2 to 32, not {n}")
        if not (isinstance(acc_depth, int) and 2 <= acc_depth <= 1 << ACC_ADDR_BITS
                and not acc_depth & (acc_depth - 1)):
            raise ValueError(f"acc_depth must be a power of two, 2..{1 << ACC_ADDR_BITS}, "
                             f"not {acc_depth}")
        if not (isinstance(addr_bits, int) and 1 <= addr_bits <= ADDR_BITS):
            raise ValueError(f"addr_bits must be 1..{ADDR_BITS}, not {addr_bits}")
        if in_flight not in (2, 4, 8, 16):
            raise ValueError(f"in_flight must be a power of two from 2 to 16, not {in_flight}")
        self.n, self.slots, self.acc_depth, self.addr_bits = n, slots, acc_depth, addr_bits
        if not (isinstance(queue, int) and 2 <= queue <= 64):
            raise ValueError(f"queue must be 2..64 commands, not {queue}")
        self.in_flight, self.queue = in_flight, queue
        self.gate_unit_clock = check_bool("gate_unit_clock", gate_unit_clock)
        #: The vector unit inside (its parameters are checked here).
        self.unit = VectorUnit(n, slots, max_top_k)
        #: Cycles from taking a command into an idle engine to its done beat, without
        #: stalls: the command is pending two cycles after it is taken (the queue) and
        #: starts the next; its last beat issues rows·beats cycles later; then the
        #: unit's latency, the write, and the done beat.
        self.overhead = self.unit.latency + 6
        members = {
            "cmd": In(stream.Signature(VecArgs())),
            "done": Out(stream.Signature(SIGNAL)),
        }
        for port in ("a", "b", "c"):
            members[f"{port}_addr"] = Out(range(acc_depth))
            members[f"{port}_en"] = Out(1)
            members[f"{port}_data"] = In(Entry(n))
        members.update({
            "acc_w": Out(stream.Signature(AccWrite(n, acc_depth))),
            "spad_req": Out(stream.Signature(Request(addr_bits, 8 * n))),
            "spad_resp": In(stream.Signature(Response(8 * n))),
            "busy": Out(1),
            "error": Out(1),
        })
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        n, log_n = self.n, exact_log2(self.n)
        flights, log_f = self.in_flight, exact_log2(self.in_flight)
        unit = self.unit
        if self.gate_unit_clock:
            # For simulation only: the unit's clock ticks only in cycles it can change
            # (VectorUnit.active, an op offered, reset), sampled on the falling edge as a
            # clock gate does; Verilator then skips the unit's logic in idle cycles.
            # Cycle for cycle the same as the ungated unit; not for synthesis.
            gated(m, "unit", unit.active | unit.ops.valid)
            m.submodules.unit = DomainRenamer("unit")(unit)
        else:
            m.submodules.unit = unit
        ops, results = unit.ops, unit.results
        st = SimpleNamespace()
        st.__dict__.update(flights=flights, log_f=log_f, log_n=log_n, n=n, ops=ops,
                           results=results)
        for stage in (self._intake, self._in_flight, self._issue, self._lane_bounds, self._stage1,
                      self._write_back, self._row_totals, self._completion):
            stage(m, st)
        return m

    def _intake(self, m: Module, st: SimpleNamespace) -> None:
        """Intake: the command queue, the pending command, its accumulator ranges."""
        log_n, n = st.log_n, st.n
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(width=VecArgs().size,
                                                           depth=self.queue)
        m.d.comb += [self.cmd.ready.eq(queue.w_rdy), queue.w_en.eq(self.cmd.valid),
                     queue.w_data.eq(self.cmd.payload)]
        cmd = Signal(VecArgs(), name="queued")
        m.d.comb += cmd.eq(queue.r_data)
        pend = Signal(VecArgs(), name="pend")
        pend_valid = Signal()
        start = Signal()  # the pending command starts issuing (and is in flight)
        load = Signal()
        m.d.comb += [load.eq(queue.r_rdy & (~pend_valid | start)), queue.r_en.eq(load)]
        with m.If(load):
            m.d.sync += [pend.eq(cmd), pend_valid.eq(1)]
        with m.Elif(start):
            m.d.sync += pend_valid.eq(0)

        # Ranges [lo, hi) of accumulator entries, registered at load: what the pending
        # instruction reads (only the operands its opcode uses) and writes. An unused
        # range is [0, 0), which overlaps nothing.
        blocks = (cmd.rows + (n - 1)) >> log_n
        tile_size = Signal(RANGE_BITS)
        m.d.comb += tile_size.eq((blocks * cmd.beats) << log_n)

        def range_reg(name, base, size, used):
            """[lo, hi) = [base, base + size), or [0, 0) if not ``used``, registered."""
            lo = Signal(RANGE_BITS, name=f"pend_{name}_lo")
            hi = Signal(RANGE_BITS, name=f"pend_{name}_hi")
            with m.If(load):
                m.d.sync += [lo.eq(Mux(used, base, 0)), hi.eq(Mux(used, base + size, 0))]
            return lo, hi

        blocks_or_tile = {name: Mux(cmd[f"{name}_scalar"], blocks, tile_size) for name in "ab"}
        used = operands_used(cmd)
        pend_reads = [
            range_reg("a", cmd.a, blocks_or_tile["a"], used["a"]),
            range_reg("b", cmd.b, blocks_or_tile["b"], used["b"]),
            range_reg("c", cmd.c, blocks, used["c"]),
        ]
        to_entries = (cmd.dst_kind == VecDst.TILE) | (cmd.dst_kind == VecDst.SCALAR)
        pend_writes = [
            range_reg("dst", cmd.dst, Mux(cmd.dst_kind == VecDst.TILE, tile_size, blocks),
                      to_entries),
            range_reg("total", cmd.total, blocks, cmd.total_write),
        ]
        st.__dict__.update(load=load, pend=pend, pend_reads=pend_reads, pend_valid=pend_valid,
                           pend_writes=pend_writes, queue=queue, start=start)

    def _in_flight(self, m: Module, st: SimpleNamespace) -> None:
        """In-flight instructions: a ring of records, started .. done in order. tail: the
        next record to start; wptr: the next to write back; dptr: the oldest (next done).
        fin: its writes are finished (1 for a free record); acked: and its scratchpad
        writes acknowledged (its done beat may go)."""
        flights, load, log_f, pend_reads = st.flights, st.load, st.log_f, st.pend_reads
        pend_valid, start = st.pend_valid, st.start
        tail, wptr, dptr = (Signal(log_f, name=x) for x in ("tail", "wptr", "dptr"))
        count = Signal(range(flights + 1))  # records started, not yet done
        queued = Signal(range(flights + 1))  # records started, not yet written back
        flight = Array(Signal(_Flight(), name=f"flight{i}") for i in range(flights))
        fin = Signal(flights, init=(1 << flights) - 1)
        acked = Signal(flights)
        remaining = [Signal(2 * COUNT_FIELD_BITS + 1, name=f"remaining{i}")
                     for i in range(flights)]
        flight_writes = [[Signal(RANGE_BITS, name=f"flight{i}_write{k}") for k in range(4)]
                         for i in range(flights)]  # dst lo, hi, total lo, hi

        # The hazard verdict on the pending command, registered: it reads a range that
        # an unfinished in-flight record writes. ``checked``: the verdict was computed
        # last cycle for this pending command with these records (records are added
        # only by ``start``; finishing or leaving only clears a hazard).
        hazard = Signal()
        terms = []
        for i in range(flights):
            for r_lo, r_hi in pend_reads:
                for w_lo, w_hi in (flight_writes[i][:2], flight_writes[i][2:]):
                    terms.append(~fin[i] & (r_lo < w_hi) & (w_lo < r_hi))
        m.d.comb += hazard.eq(Cat(*terms).any())
        blocked, checked = Signal(), Signal()
        m.d.sync += [blocked.eq(hazard), checked.eq(pend_valid & ~start & ~load)]
        # Nothing unfinished in flight: no hazard, no need to wait for the verdict.
        quiet = fin.all()
        st.__dict__.update(acked=acked, blocked=blocked, checked=checked, count=count, dptr=dptr,
                           fin=fin, flight=flight, flight_writes=flight_writes, queued=queued,
                           quiet=quiet, remaining=remaining, tail=tail, wptr=wptr)

    def _issue(self, m: Module, st: SimpleNamespace) -> None:
        """Issue: stage 0 (counters, read addresses) -> stage 1 (operands) -> ops."""
        blocked, checked, count, flights = st.blocked, st.checked, st.count, st.flights
        log_n, n, ops, pend, pend_valid = st.log_n, st.n, st.ops, st.pend, st.pend_valid
        quiet, start = st.quiet, st.start
        ins = Signal(VecArgs(), name="ins")
        s0_valid, s1_valid = Signal(), Signal()
        s0_go, s0_last = Signal(), Signal()
        m.d.comb += s0_go.eq(s0_valid & (~s1_valid | ops.ready))
        room = count != flights
        m.d.comb += start.eq(pend_valid & (quiet | (checked & ~blocked)) & room
                             & (~s0_valid | s0_last))
        with m.If(start):
            m.d.sync += ins.eq(pend)

        def walker(prefix: str, args, restart, advance, beats):
            """Row-major (r, j) counters of one side (issue or write) over the rows x
            beats of ``args``: lane = r mod N, entry = r // N, tile = the C-tile
            offset; they restart on ``restart`` (with ``beats``, the instruction's,
            for the block step) and step on ``advance``. Returns a dict of the
            registers and ``last_*`` flags."""
            w = {
                "r": Signal(COUNT_FIELD_BITS, name=f"{prefix}_r"),
                "j": Signal(COUNT_FIELD_BITS, name=f"{prefix}_j"),
                "lane": Signal(log_n, name=f"{prefix}_lane"),
                "entry": Signal(COUNT_FIELD_BITS, name=f"{prefix}_entry"),
                "tile": Signal(OFFSET_BITS, name=f"{prefix}_tile"),
                "row_start": Signal(OFFSET_BITS, name=f"{prefix}_row_start"),
                "last_beat": Signal(name=f"{prefix}_last_beat"),
                "last_row": Signal(name=f"{prefix}_last_row"),
            }
            # (beats - 1)·N: the extra tile-offset step from the last row of a block of
            # N rows to the first of the next (C-tile layout).
            block_step = Signal(OFFSET_BITS, name=f"{prefix}_block_step")
            m.d.comb += [w["last_beat"].eq(w["j"] == args.beats - 1),
                         w["last_row"].eq(w["r"] == args.rows - 1)]
            end_of_block = w["lane"] == n - 1
            next_row_start = w["row_start"] + 1 + Mux(end_of_block, block_step, 0)
            with m.If(restart):
                m.d.sync += [w[k].eq(0) for k in ("r", "j", "lane", "entry", "tile",
                                                  "row_start")]
                m.d.sync += block_step.eq((beats - 1) << log_n)
            with m.Elif(advance):
                with m.If(w["last_beat"]):
                    m.d.sync += [
                        w["j"].eq(0), w["r"].eq(w["r"] + 1), w["lane"].eq(w["lane"] + 1),
                        w["entry"].eq(w["entry"] + end_of_block),
                        w["row_start"].eq(next_row_start), w["tile"].eq(next_row_start),
                    ]
                with m.Else():
                    m.d.sync += [w["j"].eq(w["j"] + 1), w["tile"].eq(w["tile"] + n)]
            return w

        rd = walker("rd", ins, start, s0_go, pend.beats)
        m.d.comb += s0_last.eq(s0_go & rd["last_beat"] & rd["last_row"])
        with m.If(start):
            m.d.sync += s0_valid.eq(1)
        with m.Elif(s0_last):
            m.d.sync += s0_valid.eq(0)
        st.__dict__.update(ins=ins, rd=rd, s0_go=s0_go, s1_valid=s1_valid, walker=walker)

    def _lane_bounds(self, m: Module, st: SimpleNamespace) -> None:
        """Lane bounds relative to this beat: lane i is enabled iff lo_j <= i < hi_j (lo_j = lo
        + r·causal - j·N); stepped, so the mask is compares with constants."""
        ins, log_n, n, pend, rd, s0_go = st.ins, st.log_n, st.n, st.pend, st.rd, st.s0_go
        start, = st.start
        lo_r, hi_r = Signal(signed(BOUND_WORK_BITS)), Signal(signed(BOUND_WORK_BITS))
        lo_j, hi_j = Signal(signed(BOUND_WORK_BITS)), Signal(signed(BOUND_WORK_BITS))
        slot_r = Signal(COUNT_FIELD_BITS)
        with m.If(start):
            m.d.sync += [lo_r.eq(pend.lo), hi_r.eq(pend.hi), lo_j.eq(pend.lo),
                         hi_j.eq(pend.hi), slot_r.eq(pend.slot)]
        with m.Elif(s0_go):
            with m.If(rd["last_beat"]):
                m.d.sync += [lo_r.eq(lo_r + ins.causal), hi_r.eq(hi_r + ins.causal),
                             lo_j.eq(lo_r + ins.causal), hi_j.eq(hi_r + ins.causal),
                             slot_r.eq(slot_r + 1)]
            with m.Else():
                m.d.sync += [lo_j.eq(lo_j - n), hi_j.eq(hi_j - n)]
        mask = Signal(n)
        for i in range(n):
            enabled = (lo_j <= i) & (i < hi_j)
            m.d.comb += mask[i].eq(enabled & (~ins.a_scalar if i else 1))

        def operand_addr(base, scalar):
            return Mux(scalar, base + rd["entry"], base + rd["tile"])[:ACC_ADDR_BITS]

        s0_addr = {"a": operand_addr(ins.a, ins.a_scalar),
                   "b": operand_addr(ins.b, ins.b_scalar),
                   "c": (ins.c + rd["entry"])[:ACC_ADDR_BITS]}
        s1_lane, s1_first, s1_mask = Signal(log_n), Signal(), Signal(n)
        s1_slot = Signal(COUNT_FIELD_BITS)
        st.__dict__.update(mask=mask, s0_addr=s0_addr, s1_first=s1_first, s1_lane=s1_lane,
                           s1_mask=s1_mask, s1_slot=s1_slot, slot_r=slot_r)

    def _stage1(self, m: Module, st: SimpleNamespace) -> None:
        """The op's fields travel with the beat: stage 0 may hold the next instruction."""
        fin, flight, flight_writes, flights = st.fin, st.flight, st.flight_writes, st.flights
        ins, mask, n, ops, pend = st.ins, st.mask, st.n, st.ops, st.pend
        pend_writes, rd, s0_addr, s0_go = st.pend_writes, st.rd, st.s0_addr, st.s0_go
        s1_first, s1_lane, s1_mask, s1_slot = st.s1_first, st.s1_lane, st.s1_mask, st.s1_slot
        s1_valid, slot_r, start, tail = st.s1_valid, st.slot_r, st.start, st.tail
        s1_ins = Signal(VecArgs(), name="s1_ins")
        with m.If(s0_go):
            m.d.sync += [s1_valid.eq(1), s1_lane.eq(rd["lane"]), s1_first.eq(rd["j"] == 0),
                         s1_mask.eq(mask), s1_slot.eq(slot_r)]
            m.d.sync += [s1_ins[name].eq(ins[name]) for name in (
                "op", "c_imm", "imm", "mult", "shift", "sat", "a_scalar", "b_scalar")]
        with m.Elif(ops.ready):
            m.d.sync += s1_valid.eq(0)
        # A beat reads the operands its op uses; while it waits in stage 1 the ports
        # read nothing, so its data stays on them.
        used = operands_used(ins)
        for name, addr in s0_addr.items():
            m.d.comb += [getattr(self, f"{name}_addr").eq(addr),
                         getattr(self, f"{name}_en").eq(s0_go & used[name])]

        op = ops.payload
        m.d.comb += [
            ops.valid.eq(s1_valid),
            op.opcode.eq(s1_ins.op),
            op.c.eq(Mux(s1_ins.c_imm, s1_ins.imm, self.c_data[s1_lane])),
            op.mult.eq(s1_ins.mult), op.shift.eq(s1_ins.shift), op.sat.eq(s1_ins.sat),
            op.mask.eq(s1_mask), op.slot.eq(s1_slot), op.first.eq(s1_first),
        ]
        for name, scalar in (("a", s1_ins.a_scalar), ("b", s1_ins.b_scalar)):
            entry = getattr(self, f"{name}_data")
            lanes = getattr(op, name)
            m.d.comb += lanes[0].eq(Mux(scalar, entry[s1_lane], entry[0]))
            for i in range(1, n):
                m.d.comb += lanes[i].eq(Mux(scalar, 0, entry[i]))

        # Starting records the instruction (at ``tail``) for the write and done sides.
        with m.If(start):
            m.d.sync += tail.eq(tail + 1)
            for i in range(flights):
                with m.If(tail == i):
                    m.d.sync += [flight[i][name].eq(pend[name]) for name, _ in _Flight()]
                    m.d.sync += fin[i].eq(0)
                    m.d.sync += [x.eq(v) for x, v in zip(
                        flight_writes[i], (*pend_writes[0], *pend_writes[1]), strict=True)]

    def _write_back(self, m: Module, st: SimpleNamespace) -> None:
        """Write-back: one result -> a data write and/or the row total. wins: the
        instruction being written back (loaded from its record when the previous one has
        written its last result); w_index: its record."""
        flight, log_f, n, queued, results = st.flight, st.log_f, st.n, st.queued, st.results
        start, walker, wptr = st.start, st.walker, st.wptr
        wins = Signal(_Flight(), name="wins")
        w_busy = Signal()
        w_index = Signal(log_f)
        wr_go, w_load = Signal(), Signal()
        nxt = flight[wptr]
        wr = walker("wr", wins, w_load, wr_go, nxt.beats)
        w_last = wr_go & wr["last_beat"] & wr["last_row"]
        m.d.comb += w_load.eq((~w_busy | w_last) & (queued != 0))
        m.d.sync += queued.eq(queued + start - w_load)
        with m.If(w_load):
            m.d.sync += [wins.eq(nxt), w_busy.eq(1), w_index.eq(wptr), wptr.eq(wptr + 1)]
        with m.Elif(w_last):
            m.d.sync += w_busy.eq(0)

        # Chunk-major (no stride): a beat steps by rows, a row by 1; with a stride s, a
        # beat steps by 1 and a row by s.
        spad_row = Signal(ADDR_BITS)  # dst + r (dst + r·s)
        spad_ptr = Signal(ADDR_BITS)  # dst + j·rows + r (dst + r·s + j)
        strided = wins.dst_stride != 0
        with m.If(w_load):
            m.d.sync += [spad_row.eq(nxt.dst), spad_ptr.eq(nxt.dst)]
        with m.Elif(wr_go):
            next_row = spad_row + Mux(strided, wins.dst_stride, 1)
            with m.If(wr["last_beat"]):
                m.d.sync += [spad_row.eq(next_row), spad_ptr.eq(next_row)]
            with m.Else():
                m.d.sync += spad_ptr.eq(spad_ptr + Mux(strided, 1, wins.rows))

        res = results.payload
        kind = wins.dst_kind
        to_acc = (kind == VecDst.TILE) | (kind == VecDst.SCALAR)
        to_spad = kind == VecDst.SPAD
        lane_bit = Signal(n)
        m.d.comb += [lane_bit[i].eq(wr["lane"] == i) for i in range(n)]
        st.__dict__.update(kind=kind, lane_bit=lane_bit, res=res, spad_ptr=spad_ptr, to_acc=to_acc,
                           to_spad=to_spad, w_index=w_index, w_last=w_last, wins=wins, wr=wr,
                           wr_go=wr_go)

    def _row_totals(self, m: Module, st: SimpleNamespace) -> None:
        """Row totals are gathered into one entry's lanes (N rows share a total entry) and
        written together, so a row end costs no extra acc_w cycle: the buffer is flushed
        after the last row of a block of N rows (or the instruction), ahead of the next data
        write (of this instruction or the next)."""
        kind, lane_bit, n, res, results = st.kind, st.lane_bit, st.n, st.res, st.results
        spad_ptr, to_acc, to_spad, wins, wr = st.spad_ptr, st.to_acc, st.to_spad, st.wins, st.wr
        wr_go, = st.wr_go
        tot_data = Signal(Entry(n), name="tot_data")
        tot_lanes = Signal(n, name="tot_lanes")
        tot_addr = Signal(range(self.acc_depth), name="tot_addr")
        flush = Signal(name="tot_flush")  # the buffer is complete, being written
        row_total = Signal(name="row_total")
        m.d.comb += row_total.eq(wins.total_write & wr["last_beat"])

        acc_data = results.valid & to_acc & ~flush
        write = self.acc_w.payload
        with m.If(flush):
            m.d.comb += [write.addr.eq(tot_addr), write.data.eq(tot_data),
                         write.lanes.eq(tot_lanes)]
        with m.Elif(kind == VecDst.TILE):
            m.d.comb += [write.addr.eq(wins.dst + wr["tile"]), write.data.eq(res.data),
                         write.lanes.eq((1 << n) - 1)]
        with m.Else():
            m.d.comb += [write.addr.eq(wins.dst + wr["entry"]),
                         write.data.eq(res.data[0].replicate(n)), write.lanes.eq(lane_bit)]
        m.d.comb += self.acc_w.valid.eq(flush | acc_data)

        packed = []
        for i in range(n):
            lane = res.data[i]
            packed.append(Mux(wins.pack == VecPack.LIMB_HI, Cat(lane[7:14], 0),
                              Mux(wins.pack == VecPack.LIMB_LO, Cat(lane[:7], 0), lane[:8])))
        req = self.spad_req.payload
        m.d.comb += [
            self.spad_req.valid.eq(results.valid & to_spad & ~flush),
            req.addr.eq(spad_ptr), req.write.eq(1), req.data.eq(Cat(*packed)),
        ]
        data_ok = ((to_acc & self.acc_w.ready) | (to_spad & self.spad_req.ready)
                   | (kind == VecDst.NONE))
        m.d.comb += [wr_go.eq(results.valid & ~flush & data_ok), results.ready.eq(wr_go)]
        flush_fire = flush & self.acc_w.ready
        with m.If(wr_go & row_total):  # (never while flushing: wr_go needs ~flush)
            for i in range(n):
                with m.If(lane_bit[i]):
                    m.d.sync += tot_data[i].eq(res.total)
            m.d.sync += [tot_lanes.eq(tot_lanes | lane_bit),
                         tot_addr.eq(wins.total + wr["entry"]),
                         flush.eq((wr["lane"] == n - 1) | wr["last_row"])]
        with m.Elif(flush_fire):
            m.d.sync += [flush.eq(0), tot_lanes.eq(0)]
        st.__dict__.update(flush_fire=flush_fire, row_total=row_total)

    def _completion(self, m: Module, st: SimpleNamespace) -> None:
        """Completion: writes finished, scratchpad writes acknowledged, in order."""
        acked, count, dptr, fin, flight = st.acked, st.count, st.dptr, st.fin, st.flight
        flights, flush_fire, log_f, pend_valid = st.flights, st.flush_fire, st.log_f, st.pend_valid
        queue, remaining, row_total, start = st.queue, st.remaining, st.row_total, st.start
        w_index, w_last = st.w_index, st.w_last
        outstanding = Signal(2 * COUNT_FIELD_BITS + 1)
        outstanding_next = Signal.like(outstanding)
        req_fire = self.spad_req.valid & self.spad_req.ready
        ack = self.spad_resp.valid
        m.d.comb += [self.spad_resp.ready.eq(1),
                     outstanding_next.eq(outstanding + req_fire - ack)]
        m.d.sync += outstanding.eq(outstanding_next)
        with m.If(ack & failed(self.spad_resp.payload.status)):
            m.d.sync += self.error.eq(1)

        # An instruction's writes finish with its last result, or with the flush of its
        # last totals after it (``fin_pending``, for record ``fin_index``). From then,
        # ``remaining`` counts the acknowledgements still due for it and everything
        # before it (responses come in order).
        fin_pending = Signal()
        fin_index = Signal(log_f)
        finish, finish_index = Signal(), Signal(log_f)
        with m.If(w_last & row_total):
            m.d.sync += [fin_pending.eq(1), fin_index.eq(w_index)]
        with m.Elif(flush_fire & fin_pending):
            m.d.sync += fin_pending.eq(0)
        m.d.comb += [finish.eq((w_last & ~row_total) | (flush_fire & fin_pending)),
                     finish_index.eq(Mux(fin_pending, fin_index, w_index))]

        done_fire = self.done.valid & self.done.ready
        m.d.comb += [self.done.valid.eq(acked.bit_select(dptr, 1)),
                     self.done.payload.eq(flight[dptr].signal)]
        for i in range(flights):
            with m.If(finish & (finish_index == i)):
                m.d.sync += [fin[i].eq(1), remaining[i].eq(outstanding_next),
                             acked[i].eq(outstanding_next == 0)]
            with m.Elif(ack & (remaining[i] != 0)):
                m.d.sync += remaining[i].eq(remaining[i] - 1)
                with m.If(fin[i] & (remaining[i] == 1)):
                    m.d.sync += acked[i].eq(1)
            with m.If(done_fire & (dptr == i)):
                m.d.sync += acked[i].eq(0)
        with m.If(done_fire):
            m.d.sync += dptr.eq(dptr + 1)
        m.d.sync += count.eq(count + start - done_fire)
        m.d.comb += self.busy.eq((queue.level != 0) | pend_valid | (count != 0))
