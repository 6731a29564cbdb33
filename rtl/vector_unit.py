"""The vector unit: the integer element-wise and reduction operations of golden, at N lanes."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from golden.exp import exp2_tables
from golden.reciprocal import reciprocal, reciprocal_seed_table
from spec.numerics import NUMERICS
from spec.params import MAX_N, MIN_N
from spec.vector import (
    LANE_BITS,
    MUL_BITS,
    TOPK_INDEX_BITS,
    VectorOpcode,
    default_max_top_k,
)

__all__ = ["VectorOp", "VectorResult", "VectorOpcode", "VectorUnit"]

#: Lane counts the vector unit can be built at (the tensor core's range).
#: Per-slot reduction registers it can be built with.
MIN_SLOTS, MAX_SLOTS = 1, 64

#: Signed shift field: right shifts up to ``requant_max_shift``, left shifts (negative)
#: down to ``-logit_max_left_shift``.
SHIFT_BITS = max(NUMERICS.requant_max_shift, NUMERICS.logit_max_left_shift).bit_length() + 1
#: The SiLU table: one entry per int8 input code.
SILU_ENTRIES = 1 << NUMERICS.operand_bits


class VectorOp(data.StructLayout):
    """One op beat: opcode, two N-lane operands, a scalar and the immediates.

    ``a``, ``b``: N signed ``LANE_BITS`` lanes. ``c``: signed scalar (a running max, alpha,
    a divisor, a table index, depending on the op). ``mult``: unsigned
    ``requant_mult_bits`` multiplier. ``shift``: signed shift (or output fraction bits
    for EXP and DIV). ``sat``: saturate (EXP, DIV, MUL). ``mask``: bit i enables lane i
    (a disabled lane outputs 0 and stays out of reductions). ``slot``: which reduction
    and reciprocal register. ``first``: start the slot's reduction afresh.
    """

    def __init__(self, n: int, slots: int = 4):
        super().__init__({
            "opcode": VectorOpcode,
            "a": data.ArrayLayout(signed(LANE_BITS), n),
            "b": data.ArrayLayout(signed(LANE_BITS), n),
            "c": signed(LANE_BITS),
            "mult": unsigned(NUMERICS.requant_mult_bits),
            "shift": signed(SHIFT_BITS),
            "sat": 1,
            "mask": n,
            "slot": range(slots) if slots > 1 else 1,
            "first": 1,
        })


class VectorResult(data.StructLayout):
    """One result beat: N signed lanes and the op's slot total after the op."""

    def __init__(self, n: int):
        super().__init__({
            "data": data.ArrayLayout(signed(LANE_BITS), n),
            "total": signed(LANE_BITS),
        })


def _reg(m: Module, value, name: str, *, shape=None) -> Signal:
    reg = Signal(shape if shape is not None else value.shape(), name=name)
    m.d.sync += reg.eq(value)
    return reg


class VectorUnit(wiring.Component):
    """N-lane integer vector unit: every op of golden that is not a GEMM.

    One op beat in on ``ops`` gives exactly one result beat out on ``results``, in order.
    With ``first``/``slot`` the reductions run over any number of beats. Lane i of an op
    (``a_i``, ``b_i``; ``c``, ``mult``, ``shift`` shared) computes, bit-exact with golden:

    ========== ============================================================== ===========
    opcode     ``data_i``                                                      total
    ========== ============================================================== ===========
    REQUANT    ``requantize(a_i, mult, shift)`` (int8; shift 0..63)             kept
    LOGIT      ``to_log2_domain(a_i, mult, shift)`` (shift -16..63), 48-bit     max, from c
    MAX        ``a_i``                                                          max, from c
    SUM        ``a_i``                                                          sum, from 0
    EXP        ``exp2_neg(c - a_i, shift)``, ``min(., 2**shift-1)`` if sat      sum, from 0
    RESCALE    ``((a_i * c + 2**(T-1)) >> T) + b_i``  (T = 15, c = alpha)       kept
    RECIP      0; stores ``reciprocal(c)`` (y, e) in the slot                   kept
    DIV        ``divide(a_i, l, shift)`` with the slot's stored 1/l; sat: min  kept
    ADD        ``a_i + b_i`` (wraps at 48 bits)                                 kept
    MUL        ``(a_i*b_i*mult + rnd) >> shift``; sat: clamp to int8 (= requantize) kept
    SILU       ``SILU[a_i + 128]`` (int8 table)                                 kept
    SWIGLU     as MUL with ``SILU[a_i + 128]`` for ``a_i``                      kept
    SILU_LOAD  0; writes ``SILU[c & 255] = a_0`` (int8)                         kept
    TOPK       folds (a_i, index c + i) into the top-k list; value of entry i      kept
    TOPK_INDEX folds as TOPK; index of entry i (-1 if empty)                      kept
    ========== ============================================================== ===========

    Reductions (LOGIT and MAX: max; SUM and EXP: sum) fold the enabled lanes of ``data``
    into the slot's total:
    ``total = op(first ? start : total[slot], fold(data))``; the result carries the
    total after the op (for other ops, the slot's current total). All arithmetic wraps at
    ``LANE_BITS`` = 48 bits except the saturating cases named. EXP clamps a negative
    ``c - a_i`` to 0 (golden refuses it). DIV and RECIP read ``c`` as an unsigned
    ``attn_sum_bits`` divisor >= 1. MUL/SWIGLU take the low 24 bits of ``a_i``, ``b_i``.

    Top-k (MoE routing): the unit keeps one list of ``max_top_k`` = K entries (value,
    index), sorted largest value first (golden ``topk``); ``slot`` plays no part in it.
    TOPK and TOPK_INDEX fold the enabled lanes of a beat, lane i as (``a_i``, index
    ``(c + i) mod 2**16``), into it: ``list = top_K(first ? [] : list, lanes)``; a row
    of E logits is ``ceil(E / n)`` consecutive top-k beats with ``c`` = the beat's first
    index, ``first`` on the first (rows are routed one after another, as the vector
    engine issues them: one list serves them all).
    ``data_i`` (i < K) is entry i of the new list: its value for TOPK (0 if the entry is
    empty), its index for TOPK_INDEX (-1 if empty); lanes i >= K are 0. A TOPK_INDEX
    with ``mask = 0`` reads the list without changing it. Ties go to the entry folded
    first (the earlier beat, then the lower lane), so for a row folded in index order,
    entry j of the list is entry j of golden ``topk`` for any k <= K, and one unit
    serves every ``top_k`` up to K.

    Parameters
    ----------
    n : int
        Lanes, 2 to 32 (default 8, the tensor core size).
    slots : int
        Reduction/reciprocal registers (rows in flight), 1 to 64 (default 4).
    max_top_k : int
        Top-k list length K, 1 to ``n`` (default ``min(n, 8)``): the largest ``top_k``
        the unit can route. The merge is K x min(n, K) comparators.

    Latency and throughput
    ----------------------
    - One op per cycle, fully pipelined, RECIP too: but a DIV is not taken while a
      RECIP is in its ``recip_latency``-stage Newton pipeline (whose result DIV reads).
      Flow control happens only at ``ops``: an op is taken only when the result FIFO
      has room reserved for it, so a stalled ``results`` backs up into ``ops`` and the
      pipeline never stalls.
    - A result is valid on ``results`` ``latency`` cycles after its op was taken (when the
      FIFO is empty); ``latency`` = 8 + ceil(log2(n) / 2) + 1.
    - TOPK/TOPK_INDEX have the same latency. The beat is sorted in two pipeline stages
      beside the lane datapath (pairwise compares, then rank select); its merge with the
      list takes two more (K x min(n, K) compares, then a one-hot select into the
      list), so a top-k beat that reads the list (not ``first``) is not taken in the
      cycle right after another top-k beat: a row of one beat per cycle, a longer row
      at one beat per two cycles.
    """

    def __init__(self, n: int = 8, slots: int = 4, max_top_k: int | None = None):
        if max_top_k is None and isinstance(n, int) and not isinstance(n, bool):
            max_top_k = default_max_top_k(n) if MIN_N <= n <= MAX_N else 1
        for name, value, low, high in (("lane count", n, MIN_N, MAX_N),
                                       ("slot count", slots, MIN_SLOTS, MAX_SLOTS),
                                       ("top-k list length (max_top_k)", max_top_k, 1, n)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"vector unit {name} must be an integer, not {value!r}")
            if not low <= value <= high:
                raise ValueError(
                    f"vector unit {name} must be between {low} and {high}, not {value}")
        self.n, self.slots = n, slots
        #: Top-k list length: the largest ``top_k`` this unit can route.
        self.max_top_k = max_top_k
        levels = (n - 1).bit_length()
        #: Pipeline stages of the lane-reduction tree (a register every two adder levels).
        self.tree_stages = -(-levels // 2)
        #: Cycles from taking an op to its result entering the result FIFO, plus the
        #: FIFO's one cycle to its output.
        self.latency = 8 + self.tree_stages + 1
        #: Stages of the reciprocal: seed, then two multiplies and an add per Newton step.
        self.recip_latency = 2 + 3 * NUMERICS.recip_newton_steps
        self.result_depth = self.latency + 4
        #: 1 in every cycle whose clock edge can change the unit's state (an op taken or
        #: in flight, a result waiting); 0 when the next edge changes nothing that is
        #: ever read (the payload registers of empty stages), so the unit's clock may be
        #: gated then (:class:`rtl.vec_engine.VecEngine`, ``gate_unit_clock``).
        self.active = Signal()
        super().__init__({
            "ops": In(stream.Signature(VectorOp(n, slots))),
            "results": Out(stream.Signature(VectorResult(n))),
        })

    def check_top_k(self, top_k: int) -> None:
        """Raise ValueError unless this unit can route ``top_k`` (1 <= top_k <= max_top_k)."""
        is_int = isinstance(top_k, int) and not isinstance(top_k, bool)
        if not (is_int and 1 <= top_k <= self.max_top_k):
            raise ValueError(
                f"top_k {top_k!r} is impossible on this vector unit: it keeps a top-k list "
                f"of max_top_k = {self.max_top_k} entries (n = {self.n}); top_k must be "
                f"between 1 and {self.max_top_k}")

    def elaborate(self, platform):
        m = Module()
        n, nums = self.n, NUMERICS
        op_layout = VectorOp(n, self.slots)
        lane = signed(LANE_BITS)
        st = SimpleNamespace()
        st.__dict__.update(lane=lane, n=n, nums=nums, op_layout=op_layout)
        for stage in (self._intake, self._stage0, self._silu_table, self._reciprocal,
                      self._stages_1_2, self._stages_3_4, self._sort_beat, self._stages_5_6,
                      self._reduce, self._list_compare, self._last_stage, self._merge):
            stage(m, st)
        return m

    def _intake(self, m: Module, st: SimpleNamespace) -> None:
        """Intake: result-room credits and the reciprocal interlock."""
        n = st.n
        m.submodules.fifo = results = fifo.SyncFIFOBuffered(
            width=VectorResult(n).size, depth=self.result_depth + 1)
        credits = Signal(range(self.result_depth + 1), init=self.result_depth)
        recip_busy = Signal()
        topk_wait = Signal()
        take = Signal()
        m.d.comb += [
            self.ops.ready.eq((credits != 0) & ~topk_wait & ~(
                recip_busy & (self.ops.payload.opcode == VectorOpcode.DIV))),
            take.eq(self.ops.valid & self.ops.ready),
        ]
        # A top-k beat that reads the list (not ``first``) is not taken in the cycle
        # after a top-k beat: the merge compares with the list one stage before that
        # earlier beat writes it.
        offered = self.ops.payload
        offered_topk = (offered.opcode == VectorOpcode.TOPK) | (offered.opcode
                                                                  == VectorOpcode.TOPK_INDEX)
        last_topk = _reg(m, take & offered_topk, "topk_last")
        m.d.comb += topk_wait.eq(last_topk & offered_topk & ~offered.first)
        popped = self.results.valid & self.results.ready
        m.d.sync += credits.eq(credits - take + popped)
        st.__dict__.update(credits=credits, recip_busy=recip_busy, results=results, take=take)

    def _stage0(self, m: Module, st: SimpleNamespace) -> None:
        """Stage 0: the taken op."""
        op_layout, take = st.op_layout, st.take
        p0 = Signal(op_layout, name="p0")
        v0 = Signal(name="v0")
        m.d.sync += v0.eq(take)
        with m.If(take):
            m.d.sync += p0.eq(self.ops.payload)

        # Op fields travel down the pipeline with each beat.
        valids = [take, v0]  # every valid bit of the pipeline: self.active

        def carry(payload, valid, stage):
            p = Signal(op_layout, name=f"p{stage}")
            v = Signal(name=f"v{stage}")
            m.d.sync += [p.eq(payload), v.eq(valid)]
            valids.append(v)
            return p, v
        st.__dict__.update(carry=carry, p0=p0, v0=v0, valids=valids)

    def _silu_table(self, m: Module, st: SimpleNamespace) -> None:
        """SiLU table: one copy per lane (N read ports), written by SILU_LOAD."""
        n, nums, p0, v0 = st.n, st.nums, st.p0, st.v0
        silu_rd = []
        load = v0 & (p0.opcode == VectorOpcode.SILU_LOAD)
        op_bits = nums.operand_bits
        for i in range(n):
            table = memory.Memory(shape=signed(op_bits), depth=SILU_ENTRIES, init=[])
            m.submodules[f"silu{i}"] = table
            wr = table.write_port()
            rd = table.read_port()  # synchronous, not transparent: data at stage 1
            m.d.comb += [
                wr.addr.eq(p0.c[:op_bits]),
                wr.data.eq(p0.a[0][:op_bits]),
                wr.en.eq(load),
                rd.addr.eq(p0.a[i][:op_bits] ^ (1 << (op_bits - 1))),  # code + 128
            ]
            silu_rd.append(rd.data)
        st.__dict__.update(silu_rd=silu_rd)

    def _reciprocal(self, m: Module, st: SimpleNamespace) -> None:
        """Reciprocal pipeline on c (RECIP only): result into the slot registers."""
        nums, p0, recip_busy, v0 = st.nums, st.p0, st.recip_busy, st.v0
        b_bits, s_bits = nums.recip_bits, nums.recip_seed_bits
        rv = [v0 & (p0.opcode == VectorOpcode.RECIP)]
        l_val = p0.c[:nums.attn_sum_bits]
        e_comb = Signal(range(nums.attn_sum_bits))
        for bit in range(nums.attn_sum_bits):  # leading-one detector
            with m.If(l_val[bit]):
                m.d.comb += e_comb.eq(bit)
        r_slot = [p0.slot]
        # r1: normalise l to mn in [2**(B-1), 2**B) (truncating)
        up = Signal(range(b_bits), name="recip_up")
        down = Signal(range(nums.attn_sum_bits), name="recip_down")
        m.d.comb += [up.eq(Mux(e_comb < b_bits - 1, (b_bits - 1) - e_comb, 0)),
                     down.eq(Mux(e_comb > b_bits - 1, e_comb - (b_bits - 1), 0))]
        mn = _reg(m, ((l_val << up) >> down)[:b_bits], "recip_mn", shape=unsigned(b_bits))
        e1 = _reg(m, e_comb, "recip_e1")
        rv.append(_reg(m, rv[-1], "recip_v1"))
        r_slot.append(_reg(m, r_slot[-1], "recip_slot1"))
        # r2: seed
        seeds = Array(Const(int(x), unsigned(b_bits + 1)) for x in reciprocal_seed_table(nums))
        y = _reg(m, seeds[mn[b_bits - 1 - s_bits:b_bits - 1]], "recip_y0",
                 shape=signed(b_bits + 3))
        e_cur, mn_cur = _reg(m, e1, "recip_e2"), _reg(m, mn, "recip_mn2")
        rv.append(_reg(m, rv[-1], "recip_v2"))
        r_slot.append(_reg(m, r_slot[-1], "recip_slot2"))
        one = 1 << (2 * b_bits - 1)
        for step in range(nums.recip_newton_steps):
            t = _reg(m, mn_cur * y, f"recip_t{step}", shape=signed(2 * b_bits + 4))
            y_a = _reg(m, y, f"recip_ya{step}")
            err = Signal(signed(2 * b_bits + 5), name=f"recip_err{step}")
            m.d.comb += err.eq(one - t)
            ye = _reg(m, y_a * err, f"recip_ye{step}", shape=signed(3 * b_bits + 9))
            y_b = _reg(m, y_a, f"recip_yb{step}")
            y = _reg(m, y_b + ((ye + (one >> 1)) >> (2 * b_bits - 1)), f"recip_y{step + 1}",
                     shape=signed(b_bits + 3))
            for stage in range(3):
                rv.append(_reg(m, rv[-1], f"recip_v{step}_{stage}"))
                r_slot.append(_reg(m, r_slot[-1], f"recip_slot{step}_{stage}"))
                mn_cur = _reg(m, mn_cur, f"recip_mn{step}_{stage}")
                e_cur = _reg(m, e_cur, f"recip_e{step}_{stage}")
        y_min, y_max = 1 << (b_bits - 1), 1 << b_bits
        y_clamped = Mux(y < y_min, y_min, Mux(y > y_max, y_max, y))
        # Before any RECIP a slot holds 1/1, so DIV by an unset slot is well defined.
        y_one, e_one = (int(x[0]) for x in reciprocal(np.ones(1, np.int64), nums))
        recip_y = Array(Signal(unsigned(b_bits + 1), init=y_one, name=f"recip_y_slot{s}")
                        for s in range(self.slots))
        recip_e = Array(Signal(range(nums.attn_sum_bits), init=e_one, name=f"recip_e_slot{s}")
                        for s in range(self.slots))
        for s in range(self.slots):  # per-slot enables: no incomplete case statements
            with m.If(rv[-1] & (r_slot[-1] == s)):
                m.d.sync += [recip_y[s].eq(y_clamped), recip_e[s].eq(e_cur)]
        busy = rv[0]
        for valid in rv[1:-1]:
            busy = busy | valid
        # A DIV (the only op that reads a slot's reciprocal) is taken once every RECIP in
        # the pipeline has written its slot (the cycle its last stage is valid), so its
        # stage-2 read sees the new value; other ops, RECIPs too, pass.
        m.d.comb += recip_busy.eq(busy)
        assert len(rv) - 1 == self.recip_latency, (len(rv), self.recip_latency)
        st.__dict__.update(b_bits=b_bits, recip_e=recip_e, recip_y=recip_y, rv=rv)

    def _stages_1_2(self, m: Module, st: SimpleNamespace) -> None:
        """Stage 1: exp argument, SiLU read."""
        carry, n, nums, p0, recip_e = st.carry, st.n, st.nums, st.p0, st.recip_e
        recip_y, silu_rd, v0 = st.recip_y, st.silu_rd, st.v0
        p1, v1 = carry(p0, v0, 1)
        d1 = []
        for i in range(n):
            diff = p0.c - p0.a[i]
            d1.append(_reg(m, Mux(diff < 0, 0, diff), f"d1_{i}", shape=unsigned(LANE_BITS + 1)))

        # --- stage 2: exp tables and shift, MUL/SWIGLU pre-product, 1/l of the slot ---
        p2, v2 = carry(p1, v1, 2)
        hi_table, lo_table = exp2_tables(nums)
        t_bits = nums.exp_table_frac_bits + 1
        hi_rom = Array(Const(int(x), unsigned(t_bits)) for x in hi_table)
        lo_rom = Array(Const(int(x), unsigned(t_bits)) for x in lo_table)
        f_bits, lo_bits = nums.exp_frac_bits, nums.exp_lo_bits
        frac1 = p1.shift.as_unsigned()[:SHIFT_BITS - 1]
        exp_hi, exp_lo, exp_s, pre = [], [], [], []
        for i in range(n):
            d = d1[i]
            n_int = d[f_bits:]
            cap = frac1 + 2
            n_cap = Mux(n_int > cap, cap, n_int)
            exp_hi.append(_reg(m, hi_rom[d[lo_bits:f_bits]], f"exp_hi{i}"))
            exp_lo.append(_reg(m, lo_rom[d[:lo_bits]], f"exp_lo{i}"))
            exp_s.append(_reg(m, 2 * nums.exp_table_frac_bits - frac1 + n_cap, f"exp_s{i}",
                              shape=signed(SHIFT_BITS + 1)))
            use_silu = p1.opcode == VectorOpcode.SWIGLU
            x = Mux(use_silu, silu_rd[i], p1.a[i][:MUL_BITS].as_signed())
            pre.append(_reg(m, x * p1.b[i][:MUL_BITS].as_signed(), f"pre{i}",
                            shape=signed(2 * MUL_BITS)))
        silu2 = [_reg(m, silu_rd[i], f"silu2_{i}") for i in range(n)]
        y2 = _reg(m, recip_y[p1.slot], "div_y")
        e2 = _reg(m, recip_e[p1.slot], "div_e")
        st.__dict__.update(e2=e2, exp_hi=exp_hi, exp_lo=exp_lo, exp_s=exp_s, p2=p2, pre=pre,
                           silu2=silu2, t_bits=t_bits, v2=v2, y2=y2)

    def _stages_3_4(self, m: Module, st: SimpleNamespace) -> None:
        """Stage 3: multiplier operands A (signed), K (unsigned), shift s."""
        b_bits, carry, e2, exp_hi, exp_lo = st.b_bits, st.carry, st.e2, st.exp_hi, st.exp_lo
        exp_s, n, nums, p2, pre, silu2 = st.exp_s, st.n, st.nums, st.p2, st.pre, st.silu2
        t_bits, v2, y2 = st.t_bits, st.v2, st.y2
        p3, v3 = carry(p2, v2, 3)
        k_bits = max(nums.requant_mult_bits, t_bits, b_bits + 1, nums.exp_table_frac_bits + 2)
        op2 = p2.opcode
        mul_a, mul_k, mul_s = [], [], []
        frac2 = p2.shift
        for i in range(n):
            a_sel = Signal(signed(LANE_BITS + 1), name=f"a_sel{i}")
            k_sel = Signal(unsigned(k_bits), name=f"k_sel{i}")
            s_sel = Signal(signed(SHIFT_BITS + 1), name=f"s_sel{i}")
            m.d.comb += [a_sel.eq(p2.a[i]), k_sel.eq(1), s_sel.eq(0)]
            with m.If((op2 == VectorOpcode.REQUANT) | (op2 == VectorOpcode.LOGIT)):
                m.d.comb += [k_sel.eq(p2.mult), s_sel.eq(p2.shift)]
            with m.Elif(op2 == VectorOpcode.EXP):
                m.d.comb += [a_sel.eq(exp_hi[i]), k_sel.eq(exp_lo[i]), s_sel.eq(exp_s[i])]
            with m.Elif(op2 == VectorOpcode.RESCALE):
                m.d.comb += [k_sel.eq(p2.c[:k_bits]), s_sel.eq(nums.exp_table_frac_bits)]
            with m.Elif(op2 == VectorOpcode.DIV):
                m.d.comb += [k_sel.eq(y2), s_sel.eq(b_bits + e2 - frac2)]
            with m.Elif((op2 == VectorOpcode.MUL) | (op2 == VectorOpcode.SWIGLU)):
                m.d.comb += [a_sel.eq(pre[i]), k_sel.eq(p2.mult), s_sel.eq(p2.shift)]
            with m.Elif(op2 == VectorOpcode.SILU):
                m.d.comb += a_sel.eq(silu2[i])
            with m.Elif((op2 == VectorOpcode.RECIP) | (op2 == VectorOpcode.SILU_LOAD)):
                m.d.comb += a_sel.eq(0)
            with m.Else():  # MAX, SUM, ADD: a_i * 1
                pass
            mul_a.append(_reg(m, a_sel, f"mul_a{i}"))
            mul_k.append(_reg(m, k_sel, f"mul_k{i}"))
            mul_s.append(_reg(m, s_sel, f"mul_s{i}"))

        # --- stage 4: the product -----------------------------------------------------
        p4, v4 = carry(p3, v3, 4)
        prod_bits = LANE_BITS + 1 + k_bits + 1
        prod = [_reg(m, mul_a[i] * mul_k[i], f"prod{i}", shape=signed(prod_bits))
                for i in range(n)]
        s4 = [_reg(m, mul_s[i], f"s4_{i}") for i in range(n)]
        st.__dict__.update(p4=p4, prod=prod, prod_bits=prod_bits, s4=s4, v4=v4)

    def _sort_beat(self, m: Module, st: SimpleNamespace) -> None:
        """Top-k, beside stages 5 and 6: sort the beat's lanes (largest first). An entry is
        (valid, value, index); the order is valid first, then larger value, then the entry
        folded first: within a beat, the lower lane. Stage 5: pairwise compares; stage 6:
        each lane's rank, and the lanes of rank r < M placed in position r (ranks are
        distinct: a total order)."""
        lane, n, p4 = st.lane, st.n, st.p4
        k_list, idx_bits = self.max_top_k, TOPK_INDEX_BITS
        m_beat = min(n, k_list)
        lane_val = [_reg(m, p4.a[i], f"topk_val5_{i}") for i in range(n)]
        lane_idx = [_reg(m, (p4.c[:idx_bits] + i)[:idx_bits], f"topk_idx5_{i}",
                         shape=unsigned(idx_bits)) for i in range(n)]
        lane_ok = [_reg(m, p4.mask[i], f"topk_ok5_{i}") for i in range(n)]
        above = {}  # above[i, j]: lane j sorts before lane i
        for i in range(n):
            for j in range(i + 1, n):
                later = p4.mask[j] & (~p4.mask[i] | (p4.a[j] > p4.a[i]))
                above[i, j] = _reg(m, later, f"topk_cmp{i}_{j}")
                above[j, i] = ~above[i, j]
        ranks = []
        for i in range(n):
            rank = Signal(range(n), name=f"topk_rank{i}")
            m.d.comb += rank.eq(sum((above[i, j] for j in range(n) if j != i), Const(0, 1)))
            ranks.append(rank)
        sorted_val, sorted_idx, sorted_ok = [], [], []
        for r in range(m_beat):
            val, idx, ok = Const(0, unsigned(LANE_BITS)), Const(0, unsigned(idx_bits)), Const(0)
            for i in range(n):
                hit = ranks[i] == r
                val = val | Mux(hit, lane_val[i].as_unsigned(), 0)
                idx = idx | Mux(hit, lane_idx[i], 0)
                ok = ok | (hit & lane_ok[i])
            sorted_val.append(_reg(m, val.as_signed(), f"topk_sval{r}", shape=lane))
            sorted_idx.append(_reg(m, idx, f"topk_sidx{r}", shape=unsigned(idx_bits)))
            sorted_ok.append(_reg(m, ok, f"topk_sok{r}", shape=1))
        st.__dict__.update(idx_bits=idx_bits, k_list=k_list, m_beat=m_beat, sorted_idx=sorted_idx,
                           sorted_ok=sorted_ok, sorted_val=sorted_val)

    def _stages_5_6(self, m: Module, st: SimpleNamespace) -> None:
        """Stage 5: round half up and shift (right for s > 0, left for s < 0)"""
        carry, lane, n, nums, p4, prod = st.carry, st.lane, st.n, st.nums, st.p4, st.prod
        prod_bits, s4, v4 = st.prod_bits, st.s4, st.v4
        p5, v5 = carry(p4, v4, 5)
        max_left = nums.logit_max_left_shift
        wide = signed(prod_bits + max_left)
        shifted = []
        for i in range(n):
            s = s4[i]
            right = s.as_unsigned()[:SHIFT_BITS - 1]
            rnd = Mux(s > 0, Const(1, unsigned(prod_bits)) << (right - 1)[:SHIFT_BITS - 1], 0)
            down = (prod[i] + rnd) >> right
            left = prod[i] << (-s).as_unsigned()[:max_left.bit_length()]
            shifted.append(_reg(m, Mux(s < 0, left, down), f"shifted{i}", shape=wide))

        # --- stage 6: saturation, the added operand, lane masks -----------------------
        p6, v6 = carry(p5, v5, 6)
        q_min, q_max = nums.operand_min, nums.operand_max
        lanes6 = []
        frac5 = p5.shift.as_unsigned()[:SHIFT_BITS - 1]
        sat_max = (Const(1, unsigned(LANE_BITS)) << frac5) - 1
        for i in range(n):
            x = shifted[i]
            out = Signal(lane, name=f"post{i}")
            m.d.comb += out.eq(x)
            int8 = Mux(x < q_min, q_min, Mux(x > q_max, q_max, x))
            capped = Mux(x > sat_max, sat_max, x)
            with m.If(p5.opcode == VectorOpcode.REQUANT):
                m.d.comb += out.eq(int8)
            with m.Elif((p5.opcode == VectorOpcode.MUL) | (p5.opcode == VectorOpcode.SWIGLU)):
                with m.If(p5.sat):
                    m.d.comb += out.eq(int8)
            with m.Elif((p5.opcode == VectorOpcode.EXP) | (p5.opcode == VectorOpcode.DIV)):
                with m.If(p5.sat):
                    m.d.comb += out.eq(capped)
            with m.Elif((p5.opcode == VectorOpcode.RESCALE) | (p5.opcode == VectorOpcode.ADD)):
                m.d.comb += out.eq(x + p5.b[i])
            with m.Else():
                pass
            lanes6.append(_reg(m, Mux(p5.mask[i], out, 0), f"lane{i}"))
        st.__dict__.update(lanes6=lanes6, p6=p6, v6=v6)

    def _reduce(self, m: Module, st: SimpleNamespace) -> None:
        """Reduction tree over the enabled lanes: max or sum, registered every 2 levels."""
        lanes6, n, p6 = st.lanes6, st.n, st.p6
        is_max = Signal()
        m.d.comb += is_max.eq((p6.opcode == VectorOpcode.MAX) | (p6.opcode == VectorOpcode.LOGIT))
        lowest = -(1 << (LANE_BITS - 1))
        level = [Mux(p6.mask[i], lanes6[i], Mux(is_max, lowest, 0)) for i in range(n)]
        st.__dict__.update(is_max=is_max, level=level)

    def _list_compare(self, m: Module, st: SimpleNamespace) -> None:
        """Top-k: the list L (K entries), compared with the sorted beat B. before[i][j] = B_j
        sorts before L_i: valid, and a larger value (on equal values the list's entry came
        first). Computed with the last tree stage, one cycle before the list update (the
        intake keeps a list-reading top-k beat a cycle behind the previous top-k beat), and
        registered with the list as read then."""
        carry, idx_bits, is_max, k_list = st.carry, st.idx_bits, st.is_max, st.k_list
        lane, lanes6, level, m_beat, p6 = st.lane, st.lanes6, st.level, st.m_beat, st.p6
        sorted_idx, sorted_ok, sorted_val, v6 = st.sorted_idx, st.sorted_ok, st.sorted_val, st.v6
        list_val = [Signal(lane, name=f"topk_val{e}") for e in range(k_list)]
        list_idx = [Signal(unsigned(idx_bits), name=f"topk_idx{e}") for e in range(k_list)]
        list_ok = [Signal(name=f"topk_ok{e}") for e in range(k_list)]

        def merge_compares(p, beat_val, beat_ok):
            old = [(list_val[e], list_idx[e], list_ok[e] & ~p.first) for e in range(k_list)]
            before = [[_reg(m, beat_ok[j] & (~ok | (beat_val[j] > val)), f"topk_before{i}_{j}")
                       for j in range(m_beat)] for i, (val, _, ok) in enumerate(old)]
            return before, ([_reg(m, val, f"topk_old_val{e}") for e, (val, _, _) in enumerate(old)],
                            [_reg(m, idx, f"topk_old_idx{e}") for e, (_, idx, _) in enumerate(old)],
                            [_reg(m, ok, f"topk_old_ok{e}") for e, (_, _, ok) in enumerate(old)])

        p_t, v_t, data_t, max_t = p6, v6, lanes6, is_max
        depth = 0
        while len(level) > 1:
            nxt = []
            for j in range(0, len(level) - 1, 2):
                x, z = level[j], level[j + 1]
                nxt.append(Mux(max_t, Mux(x > z, x, z), (x + z)[:LANE_BITS].as_signed()))
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
            depth += 1
            if depth % 2 == 0 or len(level) == 1:
                stage = f"t{depth}"
                if len(level) == 1:
                    before, (old_val, old_idx, old_ok) = merge_compares(p_t, sorted_val, sorted_ok)
                level = [_reg(m, x, f"fold{stage}_{j}", shape=lane) for j, x in enumerate(level)]
                p_t, v_t = carry(p_t, v_t, stage)
                data_t = [_reg(m, x, f"data{stage}_{j}") for j, x in enumerate(data_t)]
                sorted_val = [_reg(m, x, f"topk_sval{stage}_{j}") for j, x in enumerate(sorted_val)]
                sorted_idx = [_reg(m, x, f"topk_sidx{stage}_{j}") for j, x in enumerate(sorted_idx)]
                sorted_ok = [_reg(m, x, f"topk_sok{stage}_{j}") for j, x in enumerate(sorted_ok)]
                max_t = _reg(m, max_t, f"max{stage}")
        folded = level[0]
        st.__dict__.update(before=before, data_t=data_t, folded=folded, list_idx=list_idx,
                           list_ok=list_ok, list_val=list_val, max_t=max_t, old_idx=old_idx,
                           old_ok=old_ok, old_val=old_val, p_t=p_t, sorted_idx=sorted_idx,
                           sorted_ok=sorted_ok, sorted_val=sorted_val, v_t=v_t)

    def _last_stage(self, m: Module, st: SimpleNamespace) -> None:
        """Last stage: the slot's running total, and the result."""
        folded, lane, max_t, p_t, v_t = st.folded, st.lane, st.max_t, st.p_t, st.v_t
        totals = Array(Signal(lane, name=f"total_slot{s}") for s in range(self.slots))
        base = Mux(p_t.first, Mux(max_t, p_t.c, 0), totals[p_t.slot])
        new_total = Signal(lane)
        total_out = Signal(lane)
        m.d.comb += [
            new_total.eq(Mux(max_t, Mux(folded > base, folded, base),
                             (base + folded)[:LANE_BITS].as_signed())),
            total_out.eq(totals[p_t.slot]),
        ]
        reduces = ((p_t.opcode == VectorOpcode.MAX) | (p_t.opcode == VectorOpcode.SUM)
                   | (p_t.opcode == VectorOpcode.EXP) | (p_t.opcode == VectorOpcode.LOGIT))
        with m.If(v_t & reduces):
            m.d.comb += total_out.eq(new_total)
        for s in range(self.slots):
            with m.If(v_t & reduces & (p_t.slot == s)):
                m.d.sync += totals[s].eq(new_total)
        st.__dict__.update(total_out=total_out)

    def _merge(self, m: Module, st: SimpleNamespace) -> None:
        """Top-k: merge the sorted beat B (M entries) into the list L (K entries) -- Both lists
        are sorted, so before[i][j] is monotone in i and j, and an entry's rank in the union
        is its position plus the number of entries of the other list before it: L_i lands at
        r = i + #{j: before[i][j]}, B_j at r = j + #{i: not before[i][j]}. Position r < K
        takes the one entry of rank r."""
        before, credits, data_t, idx_bits = st.before, st.credits, st.data_t, st.idx_bits
        k_list, lane, list_idx, list_ok = st.k_list, st.lane, st.list_idx, st.list_ok
        list_val, m_beat, n, old_idx, old_ok = st.list_val, st.m_beat, st.n, st.old_idx, st.old_ok
        old_val, p_t, results, rv = st.old_val, st.p_t, st.results, st.rv
        sorted_idx, sorted_ok, sorted_val = st.sorted_idx, st.sorted_ok, st.sorted_val
        total_out, v_t, valids = st.total_out, st.v_t, st.valids
        new_val, new_idx, new_ok = [], [], []
        for r in range(k_list):
            val, idx, ok = Const(0, unsigned(LANE_BITS)), Const(0, unsigned(idx_bits)), Const(0)
            for i in range(max(0, r - m_beat), r + 1):  # L_i with r - i entries of B before
                d = r - i
                hit = (Const(1) if d == 0 else before[i][d - 1]) & (
                    Const(1) if d == m_beat else ~before[i][d])
                val = val | Mux(hit, old_val[i].as_unsigned(), 0)
                idx = idx | Mux(hit, old_idx[i], 0)
                ok = ok | (hit & old_ok[i])
            for j in range(min(r + 1, m_beat)):  # B_j with r - j entries of L before
                d = r - j
                hit = (Const(1) if d == 0 else ~before[d - 1][j]) & before[d][j]
                val = val | Mux(hit, sorted_val[j].as_unsigned(), 0)
                idx = idx | Mux(hit, sorted_idx[j], 0)
                ok = ok | (hit & sorted_ok[j])
            new_val.append(Signal(lane, name=f"topk_new_val{r}"))
            new_idx.append(Signal(unsigned(idx_bits), name=f"topk_new_idx{r}"))
            new_ok.append(Signal(name=f"topk_new_ok{r}"))
            m.d.comb += [new_val[r].eq(val.as_signed()), new_idx[r].eq(idx), new_ok[r].eq(ok)]
        is_topk = (p_t.opcode == VectorOpcode.TOPK) | (p_t.opcode == VectorOpcode.TOPK_INDEX)
        with m.If(v_t & is_topk):
            m.d.sync += [x.eq(y) for x, y in zip(list_val + list_idx + list_ok,
                                                  new_val + new_idx + new_ok, strict=True)]
        data_out = []
        for i in range(n):
            out = Signal(lane, name=f"data_out{i}")
            m.d.comb += out.eq(data_t[i])
            with m.If(p_t.opcode == VectorOpcode.TOPK):
                m.d.comb += out.eq(Mux(new_ok[i], new_val[i], 0) if i < k_list else 0)
            with m.Elif(p_t.opcode == VectorOpcode.TOPK_INDEX):
                m.d.comb += out.eq(Mux(new_ok[i], new_idx[i], -1) if i < k_list else 0)
            data_out.append(out)

        push = _reg(m, v_t, "push")
        m.d.comb += self.active.eq(Cat(*valids, *rv, push, results.r_rdy,
                                       credits != self.result_depth).any())
        push_row = Signal(VectorResult(n))
        m.d.sync += [push_row.data.eq(Cat(*data_out)), push_row.total.eq(total_out)]
        m.d.comb += [
            results.w_en.eq(push),
            results.w_data.eq(push_row),
            self.results.valid.eq(results.r_rdy),
            self.results.payload.eq(results.r_data),
            results.r_en.eq(self.results.ready),
        ]
