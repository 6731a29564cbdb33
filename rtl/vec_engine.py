"""The vector engine: runs VEC instructions on the vector unit over accumulator entries."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from rtl.accumulator import AccWrite, Entry
from rtl.isa import ACC_ADDR_BITS, ADDR_BITS, COUNT_FIELD_BITS, SIGNAL, VecArgs, VecDst, VecPack
from rtl.scratchpad import Request, Response, failed
from rtl.vector_unit import VectorUnit

__all__ = ["VecEngine"]

#: Width of the beat counters' derived offsets: a tile offset is below
#: ceil(rows / N) * beats * N <= 2**14 for 7-bit counts, plus a step of slack.
OFFSET_BITS = 2 * COUNT_FIELD_BITS + 2
#: Width of the lane-mask bounds after adding r * causal and subtracting j * N.
BOUND_WORK_BITS = 16


class VecEngine(wiring.Component):
    """Runs VEC instructions (:class:`rtl.isa.VecArgs`) on a :class:`VectorUnit`.

    For row r in 0..rows-1 and beat j in 0..beats-1 (row-major), the engine reads the
    operands from three accumulator read ports (``a``, ``b``, ``c``; the C-tile layout
    ``base + (r // N)·beats·N + j·N + r mod N``, or one lane of entry ``base + r // N``
    for a scalar operand), builds one :class:`rtl.vector_unit.VectorOp` (lane mask from
    the key bounds ``lo``/``hi`` + r·``causal``; slot ``slot + r``; ``first`` on j = 0)
    and writes the result as ``dst_kind`` says: a whole tile entry, one lane of a
    scalar entry, or a packed scratchpad word ``dst + j·rows + r``; at the last beat of
    a row, the row's total into lane r mod N of entry ``total + r // N`` (the totals of
    the N rows sharing an entry are written together, after those rows' results). It
    is the hardware of :meth:`golden.tile_model.TileModel._vec`.

    Hazards: a command is taken only when the previous instruction has completely
    finished (its ``done`` beat taken, so every accumulator write accepted and every
    scratchpad write acknowledged). No hazard between instructions can exist, by
    construction. Inside an instruction, operands are read about ``unit.latency`` beats
    before their results are written: a beat must not read what an earlier beat of the
    same instruction writes, and a TILE destination must not overlap the total entries
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

    Ports
    -----
    cmd : stream in of :class:`VecArgs` (range-checked by the sequencer)
    done : stream out of :data:`rtl.isa.SIGNAL`, the instruction's ``signal``, one beat
        per finished instruction
    a_addr/a_data, b_addr/b_data, c_addr/c_data : accumulator read ports (data the
        cycle after the address)
    acc_w : stream out of :class:`rtl.accumulator.AccWrite`
    spad_req/spad_resp : a scratchpad port, writes only; every write's response is
        counted
    busy : out, an instruction is in the engine
    error : out, sticky: a scratchpad response with an error status

    Timing
    ------
    One beat per cycle in steady state, stalling on the vector unit's ``ops`` (RECIP
    interlock, results backing up) and on ``acc_w``/``spad_req`` backpressure. Row
    totals are gathered per block of N rows (they share an entry) and written in one
    ``acc_w`` cycle after the block's last result, which holds the next result for that
    cycle. From taking a command to its ``done`` beat: ``rows·beats + overhead``
    cycles without stalls (``overhead`` = the vector unit's latency + 3), plus
    ceil(rows / N) with totals and the scratchpad's write latency (minus one) for SPAD
    destinations; the next command is taken the cycle after ``done``.
    """

    def __init__(self, n: int = 8, slots: int = 4, acc_depth: int = 256,
                 addr_bits: int = ADDR_BITS, max_top_k: int | None = None):
        if n not in (2, 4, 8, 16, 32):
            raise ValueError(f"vector engine lanes must be a power of two from 2 to 32, not {n}")
        if not (isinstance(acc_depth, int) and 2 <= acc_depth <= 1 << ACC_ADDR_BITS
                and not acc_depth & (acc_depth - 1)):
            raise ValueError(f"acc_depth must be a power of two, 2..{1 << ACC_ADDR_BITS}, "
                             f"not {acc_depth}")
        if not (isinstance(addr_bits, int) and 1 <= addr_bits <= ADDR_BITS):
            raise ValueError(f"addr_bits must be 1..{ADDR_BITS}, not {addr_bits}")
        self.n, self.slots, self.acc_depth, self.addr_bits = n, slots, acc_depth, addr_bits
        #: The vector unit inside (its parameters are checked here).
        self.unit = VectorUnit(n, slots, max_top_k)
        #: Cycles from taking a command to its done beat, without stalls: the last beat
        #: issues rows·beats cycles after the command; then the unit's latency, the
        #: write, and the done beat.
        self.overhead = self.unit.latency + 3
        members = {
            "cmd": In(stream.Signature(VecArgs())),
            "done": Out(stream.Signature(SIGNAL)),
        }
        for port in ("a", "b", "c"):
            members[f"{port}_addr"] = Out(range(acc_depth))
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
        m.submodules.unit = unit = self.unit
        ops, results = unit.ops, unit.results

        ins = Signal(VecArgs(), name="ins")
        busy = Signal()
        accept = Signal()
        m.d.comb += [
            self.cmd.ready.eq(~busy),
            accept.eq(self.cmd.valid & ~busy),
            self.busy.eq(busy),
        ]
        cmd = self.cmd.payload
        with m.If(accept):
            m.d.sync += [ins.eq(cmd), busy.eq(1)]
        # (beats - 1)·N: the extra tile-offset step from the last row of a block of N
        # rows to the first of the next (C-tile layout).
        block_step = Signal(OFFSET_BITS)
        with m.If(accept):
            m.d.sync += block_step.eq((cmd.beats - 1) << log_n)

        def walker(prefix: str, advance):
            """Row-major (r, j) counters of one side (issue or write): lane = r mod N,
            entry = r // N, tile = the C-tile offset; they restart on ``accept`` and
            step on ``advance``. Returns a dict of the registers and ``last_*`` flags."""
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
            m.d.comb += [w["last_beat"].eq(w["j"] == ins.beats - 1),
                         w["last_row"].eq(w["r"] == ins.rows - 1)]
            end_of_block = w["lane"] == n - 1
            next_row_start = w["row_start"] + 1 + Mux(end_of_block, block_step, 0)
            with m.If(accept):
                m.d.sync += [w[k].eq(0) for k in ("r", "j", "lane", "entry", "tile",
                                                  "row_start")]
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

        # --- issue: stage 0 (counters, read addresses) -> stage 1 (operands) -> ops --
        s0_valid, s1_valid = Signal(), Signal()
        s0_go = Signal()
        m.d.comb += s0_go.eq(s0_valid & (~s1_valid | ops.ready))
        rd = walker("rd", s0_go)
        with m.If(accept):
            m.d.sync += s0_valid.eq(1)
        with m.Elif(s0_go & rd["last_beat"] & rd["last_row"]):
            m.d.sync += s0_valid.eq(0)

        # Lane bounds relative to this beat: lane i is enabled iff lo_j <= i < hi_j
        # (lo_j = lo + r·causal - j·N); stepped, so the mask is compares with constants.
        lo_r, hi_r = Signal(signed(BOUND_WORK_BITS)), Signal(signed(BOUND_WORK_BITS))
        lo_j, hi_j = Signal(signed(BOUND_WORK_BITS)), Signal(signed(BOUND_WORK_BITS))
        slot_r = Signal(COUNT_FIELD_BITS)
        with m.If(accept):
            m.d.sync += [lo_r.eq(cmd.lo), hi_r.eq(cmd.hi), lo_j.eq(cmd.lo), hi_j.eq(cmd.hi),
                         slot_r.eq(cmd.slot)]
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
        s1 = {name: Signal(range(self.acc_depth), name=f"s1_{name}_addr") for name in s0_addr}
        s1_lane, s1_first, s1_mask = Signal(log_n), Signal(), Signal(n)
        s1_slot = Signal(COUNT_FIELD_BITS)
        with m.If(s0_go):
            m.d.sync += [s1_valid.eq(1), s1_lane.eq(rd["lane"]), s1_first.eq(rd["j"] == 0),
                         s1_mask.eq(mask), s1_slot.eq(slot_r)]
            m.d.sync += [s1[name].eq(addr) for name, addr in s0_addr.items()]
        with m.Elif(ops.ready):
            m.d.sync += s1_valid.eq(0)
        # A held stage 1 reads its own entries again, so its data stays on the ports.
        hold = s1_valid & ~ops.ready
        for name, addr in s0_addr.items():
            m.d.comb += getattr(self, f"{name}_addr").eq(Mux(hold, s1[name], addr))

        op = ops.payload
        m.d.comb += [
            ops.valid.eq(s1_valid),
            op.opcode.as_value().eq(ins.op),
            op.c.eq(Mux(ins.c_imm, ins.imm, self.c_data[s1_lane])),
            op.mult.eq(ins.mult), op.shift.eq(ins.shift), op.sat.eq(ins.sat),
            op.mask.eq(s1_mask), op.slot.eq(s1_slot), op.first.eq(s1_first),
        ]
        for name, scalar in (("a", ins.a_scalar), ("b", ins.b_scalar)):
            entry = getattr(self, f"{name}_data")
            lanes = getattr(op, name)
            m.d.comb += lanes[0].eq(Mux(scalar, entry[s1_lane], entry[0]))
            for i in range(1, n):
                m.d.comb += lanes[i].eq(Mux(scalar, 0, entry[i]))

        # --- write-back: one result -> a data write and/or the row total ------------
        wr_go = Signal()
        wr = walker("wr", wr_go)
        spad_row = Signal(ADDR_BITS)  # dst + r
        spad_ptr = Signal(ADDR_BITS)  # dst + j·rows + r
        with m.If(accept):
            m.d.sync += [spad_row.eq(cmd.dst), spad_ptr.eq(cmd.dst)]
        with m.Elif(wr_go):
            with m.If(wr["last_beat"]):
                m.d.sync += [spad_row.eq(spad_row + 1), spad_ptr.eq(spad_row + 1)]
            with m.Else():
                m.d.sync += spad_ptr.eq(spad_ptr + ins.rows)

        res = results.payload
        kind = ins.dst_kind
        to_acc = (kind == VecDst.TILE) | (kind == VecDst.SCALAR)
        to_spad = kind == VecDst.SPAD
        lane_bit = Signal(n)
        m.d.comb += [lane_bit[i].eq(wr["lane"] == i) for i in range(n)]
        # Row totals are gathered into one entry's lanes (N rows share a total entry)
        # and written together, so a row end costs no extra acc_w cycle: the buffer is
        # flushed after the last row of a block of N rows (or the instruction), ahead
        # of the next data write.
        tot_data = Signal(Entry(n), name="tot_data")
        tot_lanes = Signal(n, name="tot_lanes")
        tot_addr = Signal(range(self.acc_depth), name="tot_addr")
        flush = Signal(name="tot_flush")  # the buffer is complete, being written
        row_total = Signal(name="row_total")
        m.d.comb += row_total.eq(ins.total_write & wr["last_beat"])

        acc_data = results.valid & to_acc & ~flush
        write = self.acc_w.payload
        with m.If(flush):
            m.d.comb += [write.addr.eq(tot_addr), write.data.eq(tot_data),
                         write.lanes.eq(tot_lanes)]
        with m.Elif(kind == VecDst.TILE):
            m.d.comb += [write.addr.eq(ins.dst + wr["tile"]), write.data.eq(res.data),
                         write.lanes.eq((1 << n) - 1)]
        with m.Else():
            m.d.comb += [write.addr.eq(ins.dst + wr["entry"]),
                         write.data.eq(res.data[0].replicate(n)), write.lanes.eq(lane_bit)]
        m.d.comb += self.acc_w.valid.eq(flush | acc_data)

        packed = []
        for i in range(n):
            lane = res.data[i]
            packed.append(Mux(ins.pack == VecPack.LIMB_HI, Cat(lane[7:14], 0),
                              Mux(ins.pack == VecPack.LIMB_LO, Cat(lane[:7], 0), lane[:8])))
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
                         tot_addr.eq(ins.total + wr["entry"]),
                         flush.eq((wr["lane"] == n - 1) | wr["last_row"])]
        with m.Elif(flush_fire):
            m.d.sync += [flush.eq(0), tot_lanes.eq(0)]

        # --- completion: every result written, every scratchpad write acknowledged --
        written = Signal()
        with m.If(accept):
            m.d.sync += written.eq(0)
        with m.Elif(wr_go & wr["last_beat"] & wr["last_row"]):
            m.d.sync += written.eq(1)
        outstanding = Signal(2 * COUNT_FIELD_BITS + 1)
        req_fire = self.spad_req.valid & self.spad_req.ready
        m.d.comb += self.spad_resp.ready.eq(1)
        m.d.sync += outstanding.eq(outstanding + req_fire - self.spad_resp.valid)
        status = self.spad_resp.payload.status
        bad = failed(status)
        with m.If(self.spad_resp.valid & bad):
            m.d.sync += self.error.eq(1)

        done_valid = Signal()
        m.d.comb += [self.done.valid.eq(done_valid), self.done.payload.eq(ins.signal)]
        # Done once every result and total is written and no scratchpad write is
        # unacknowledged; when the last write is an accumulator write, the cycle after.
        last_write = wr_go & wr["last_beat"] & wr["last_row"]
        with m.If(busy & ~done_valid & (outstanding == 0)
                  & ((written & (~flush | flush_fire)) | (last_write & ~req_fire & ~row_total))):
            m.d.sync += done_valid.eq(1)
        with m.If(self.done.valid & self.done.ready):
            m.d.sync += [done_valid.eq(0), busy.eq(0), written.eq(0)]
        return m
