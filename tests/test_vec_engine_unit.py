"""Vector engine in the Amaranth simulator against the tile model (golden/tile_model.py).

The engine's memories are Python fakes: the accumulator memory (three synchronous read
ports, a write stream with random ``ready``) and a scratchpad port (random ``ready``,
write responses after a random delay, in order). They are the arrays of a second
:class:`TileModel`, ``hw``, which also runs the instructions that are not VEC (GEMMs of
the softmax program) and the test's ``LOAD`` steps (operands put into memory), each when
the engine is idle. The reference model runs the same program; at the end both
memories must be equal and the done beats must be the VEC instructions' signals, in order.
"""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from compiler.hazards import accesses
from golden.exp import NEG_INF, exp2_neg, logit_multiplier, to_log2_domain
from golden.gemm import quantize_multiplier
from golden.moe import silu_output_scale, silu_table
from golden.softmax import normalise_output, online_softmax_pv
from golden.tile_model import TileModel, VecDst, VecPack, acc_accesses, lanes_word, word_lanes
from golden.vector_model import VectorOpcode as OP
from rtl.accumulator import LANE_BITS, AccWrite
from rtl.scratchpad import Request, Response
from rtl.vec_engine import VecEngine
from sim.runner import run_amaranth
from spec.isa import Opcode, VecArgs
from spec.isa import VecDst as IsaVecDst
from spec.isa import VecPack as IsaVecPack
from spec.numerics import NUMERICS

LANE_MASK = (1 << LANE_BITS) - 1
T = NUMERICS.exp_table_frac_bits


def _field(layout, name):
    field = layout[name]
    return field.offset, field.width


def entry_bits(values) -> int:
    return sum((int(v) & LANE_MASK) << (LANE_BITS * i) for i, v in enumerate(values))


def load(model: TileModel, fields: dict) -> None:
    """A test step: ``acc`` = {entry: lanes}, ``spad`` = {word address: word}."""
    for addr, lanes in fields.get("acc", {}).items():
        model.acc[addr] = lanes
    for addr, word in fields.get("spad", {}).items():
        model.spad[addr] = word


def run_engine(program, *, n=4, slots=4, acc_depth=256, spad_words=256, seed=1,
               acc_stall=0.0, spad_stall=0.0, done_stall=0.0, resp_delay=(1, 1),
               idle=0.0, error_at=None, timeout=20000, gated=False):
    """Run ``program`` ((name, fields) steps) on a VecEngine and on the reference model;
    return (reference, hw, done payloads, cycles, engine, accept/done cycles, error)."""
    ref = TileModel(n, spad_words, acc_depth, slots)
    for name, fields in program:
        load(ref, fields) if name == "LOAD" else ref.step(name, fields)
    hw = TileModel(n, spad_words, acc_depth, slots)
    dut = VecEngine(n, slots, acc_depth, addr_bits=16, gate_unit_clock=gated)
    rng = np.random.default_rng(seed)
    layout = VecArgs()
    w_layout, q_layout, r_layout = AccWrite(n, acc_depth), Request(16, 8 * n), Response(8 * n)
    w_addr, w_data, w_lanes = (_field(w_layout, k) for k in ("addr", "data", "lanes"))
    q_addr, q_write, q_data = (_field(q_layout, k) for k in ("addr", "write", "data"))
    resp_write = 1 << r_layout["write"].offset
    status = r_layout["status"]
    bad_address = 1 << (status.offset + status.shape["bad_address"].offset)
    dones, accepted, finished = [], [], []
    state = {"cycle": 0, "issued": 0, "spad_writes": 0, "outstanding": 0, "reads": 0}

    async def accumulator(ctx):
        ctx.set(dut.acc_w.ready, 1)
        while True:
            _, _, a, b, c, a_en, b_en, c_en, valid, ready, write = await ctx.tick().sample(
                dut.a_addr, dut.b_addr, dut.c_addr, dut.a_en, dut.b_en, dut.c_en,
                dut.acc_w.valid, dut.acc_w.ready, dut.acc_w.payload.as_value())
            state["cycle"] += 1
            # A port reads (before the write) only when enabled, else keeps its data.
            for port, addr, en in (("a", a, a_en), ("b", b, b_en), ("c", c, c_en)):
                if en:
                    ctx.set(getattr(dut, f"{port}_data").as_value(), entry_bits(hw.acc[addr]))
                    state["reads"] += 1
            if valid and ready:
                addr = (write >> w_addr[0]) & ((1 << w_addr[1]) - 1)
                lanes = (write >> w_lanes[0]) & ((1 << n) - 1)
                for i in range(n):
                    if lanes >> i & 1:
                        lane = (write >> (w_data[0] + LANE_BITS * i)) & LANE_MASK
                        hw.acc[addr, i] = lane - (1 << LANE_BITS) * (lane >> (LANE_BITS - 1))
            ctx.set(dut.acc_w.ready, bool(rng.random() >= acc_stall))

    async def scratchpad(ctx):
        pending = []  # (cycle due, response word)
        ctx.set(dut.spad_req.ready, 1)
        while True:
            _, _, valid, ready, req, resp_valid, resp_ready = await ctx.tick().sample(
                dut.spad_req.valid, dut.spad_req.ready, dut.spad_req.payload.as_value(),
                dut.spad_resp.valid, dut.spad_resp.ready)
            now = state["cycle"]
            if resp_valid and resp_ready:
                pending.pop(0)
                state["outstanding"] -= 1
            if valid and ready:
                assert (req >> q_write[0]) & 1, "the engine only writes"
                addr = (req >> q_addr[0]) & ((1 << q_addr[1]) - 1)
                hw.spad[addr] = (req >> q_data[0]) & ((1 << q_data[1]) - 1)
                word = resp_write
                if error_at is not None and state["spad_writes"] == error_at:
                    word |= bad_address
                state["spad_writes"] += 1
                state["outstanding"] += 1
                due = max([now + int(rng.integers(*resp_delay, endpoint=True))]
                          + [d + 1 for d, _ in pending[-1:]])
                pending.append((due, word))
            head = pending[0] if pending and pending[0][0] <= now + 1 else None
            ctx.set(dut.spad_resp.valid, head is not None)
            ctx.set(dut.spad_resp.payload.as_value(), head[1] if head else 0)
            ctx.set(dut.spad_req.ready, bool(rng.random() >= spad_stall))

    async def done_monitor(ctx):
        while True:
            ctx.set(dut.done.ready, bool(rng.random() >= done_stall))
            _, _, valid, ready, payload = await ctx.tick().sample(
                dut.done.valid, dut.done.ready, dut.done.payload.as_value())
            if valid and ready:
                dones.append(int(payload))
                finished.append(state["cycle"])

    def in_time() -> None:  # a wedged engine fails the test instead of hanging it
        assert state["cycle"] < timeout, (
            f"timed out: {len(dones)} of {state['issued']} instructions done, "
            f"{len(program)} steps")

    async def driver(ctx):
        for name, fields in program:
            if name != "VEC":
                while len(dones) < state["issued"]:
                    await ctx.tick()
                    in_time()
                load(hw, fields) if name == "LOAD" else hw.step(name, fields)
                continue
            while rng.random() < idle:
                await ctx.tick()
            value = dict(fields, dst_kind=IsaVecDst(fields.get("dst_kind", 0)),
                         pack=IsaVecPack(fields.get("pack", 0)))
            ctx.set(dut.cmd.payload.as_value(), layout.const(value).as_bits())
            ctx.set(dut.cmd.valid, 1)
            while not (await ctx.tick().sample(dut.cmd.ready))[-1]:
                in_time()
            accepted.append(state["cycle"])
            ctx.set(dut.cmd.valid, 0)
            state["issued"] += 1
        while len(dones) < state["issued"]:
            await ctx.tick()
            in_time()
        for _ in range(2 * dut.unit.latency):  # nothing more may appear
            await ctx.tick()
            assert not ctx.get(dut.busy) and not ctx.get(dut.acc_w.valid)
            assert not ctx.get(dut.spad_req.valid)
        assert len(dones) == state["issued"] and state["outstanding"] == 0
        # Each beat read the entries of the operands its op uses, once (the tile's
        # acc_reads): what the tile model counts.
        assert state["reads"] == sum(acc_accesses("VEC", f, n)[0]
                                     for name, f in program if name == "VEC")
        state["error"] = ctx.get(dut.error)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(accumulator, background=True)
    sim.add_testbench(scratchpad, background=True)
    sim.add_testbench(done_monitor, background=True)
    sim.add_testbench(driver)
    run_amaranth(sim)
    return ref, hw, dones, state["cycle"], dut, accepted, finished, state["error"]


def check_same(ref: TileModel, hw: TileModel, dones, program) -> None:
    for e in range(ref.acc_depth):
        assert (hw.acc[e] == ref.acc[e]).all(), (
            f"accumulator entry {e}: engine {hw.acc[e].tolist()}, model {ref.acc[e].tolist()}")
    for w in range(ref.spad_words):
        assert hw.spad[w] == ref.spad[w], (
            f"scratchpad word {w}: engine {word_lanes(hw.spad[w], ref.n).tolist()}, "
            f"model {word_lanes(ref.spad[w], ref.n).tolist()}")
    signals = [f.get("signal", {"enable": 0, "semaphore": 0}) for name, f in program
               if name == "VEC"]
    want = [s["enable"] | (s["semaphore"] << 1) for s in signals]
    assert dones == want, (dones, want)
    assert [s["enable"] | (s["semaphore"] << 1) for s in ref.done["VEC"]] == want


# --- random instructions -------------------------------------------------------------


class Ring:
    """Allocates regions of accumulator entries in a ring (fresh within a batch)."""

    def __init__(self, depth):
        self.depth, self.next = depth, 0

    def take(self, size):
        if self.next + size > self.depth:
            self.next = 0
        base, self.next = self.next, self.next + size
        return base


def _operands(rng, code, rows, beats, n):
    """(a, b, c per row, extra fields) inside each golden function's domain."""
    shape = (rows, beats, n)
    i32 = (-(1 << 31), 1 << 31)
    c = rng.integers(-(1 << 20), 1 << 20, rows)
    b = rng.integers(-128, 128, shape)
    extra = {}
    mult = int(rng.integers(1 << 15, 1 << 16))
    if code == OP.REQUANT:
        a = rng.integers(*i32, shape)
        extra = {"mult": mult, "shift": int(rng.integers(0, 64))}
    elif code == OP.LOGIT:
        a = rng.integers(*i32, shape)
        lm, ls = logit_multiplier(float(np.exp(rng.uniform(-12, 12))))
        extra = {"mult": lm, "shift": ls}
        c = np.where(rng.random(rows) < 0.5, NEG_INF, rng.integers(-(1 << 30), 1 << 30, rows))
    elif code == OP.MAX:
        a = rng.integers(-(1 << 41), 1 << 41, shape)
        c = rng.integers(-(1 << 41), 1 << 41, rows)
    elif code == OP.SUM:
        a = rng.integers(-(1 << 40), 1 << 40, shape)
    elif code == OP.EXP:
        spread = int(rng.choice([1 << 10, 1 << 14, 1 << 20]))
        a = c[:, None, None] - rng.integers(0, spread, shape)
        extra = {"shift": int(rng.choice([14, 15, int(rng.integers(1, 30))])),
                 "sat": int(rng.integers(2))}
    elif code == OP.RESCALE:
        a = rng.integers(-(1 << 40), 1 << 40, shape)
        b = rng.integers(*i32, shape)
        c = rng.integers(0, (1 << T) + 1, rows)
    elif code == OP.RECIP:
        a = rng.integers(-5, 5, shape)
        c = rng.choice([1, int(rng.integers(1, 1 << 32)), 1 << int(rng.integers(32))], rows)
    elif code == OP.DIV:
        a = rng.integers(-(1 << 30), 1 << 30, shape)
        extra = {"shift": int(rng.choice([15, 16])), "sat": int(rng.integers(2))}
    elif code == OP.ADD:
        a = rng.integers(-(1 << 46), 1 << 46, shape)
        b = rng.integers(-(1 << 46), 1 << 46, shape)
    elif code == OP.MUL:
        sat = int(rng.integers(2))
        hi = 1 << 8 if sat else 1 << 23
        a, b = rng.integers(-hi, hi, shape), rng.integers(-hi, hi, shape)
        extra = {"mult": mult, "sat": sat,
                 "shift": int(rng.integers(0, 64) if sat else rng.integers(0, 32))}
    elif code in (OP.SILU, OP.SWIGLU, OP.SILU_LOAD):
        a = rng.integers(-128, 128, shape)
        c = rng.integers(0, 256, rows)
        extra = {"mult": mult, "shift": int(rng.integers(8, 40)), "sat": 1}
    else:  # TOPK, TOPK_INDEX: one beat per row
        spread = int(rng.choice([3, 1 << 31, 1 << 47]))
        a = rng.integers(-spread, spread, shape)
        c = rng.integers(0, 1000, rows)
    return a, b, c, extra


def _spad_words(rng, fields) -> int:
    """Half of the scratchpad destinations row after row (a ``dst_stride`` from 1, rows
    overlapping, to beats + 2, rows apart): sets the stride, returns the region's words."""
    rows, beats = fields["rows"], fields["beats"]
    if rng.random() < 0.5:
        return rows * beats
    stride = fields["dst_stride"] = int(rng.integers(1, beats + 3))
    return (rows - 1) * stride + beats


def random_vec(rng, n, slots, ring, spad_ring, code):
    """One random VEC instruction with its LOAD step (operands in fresh regions)."""
    rows = int(rng.integers(1, min(slots, 2 * n + 1) + 1))
    beats = 1 if code in (OP.TOPK, OP.TOPK_INDEX) else int(rng.integers(1, 4))
    blocks = -(-rows // n)
    a_scalar, b_scalar = (int(rng.random() < 0.25) for _ in range(2))
    c_imm = int(rng.random() < 0.3)
    kind = int(rng.integers(4))
    a, b, c, extra = _operands(rng, code, rows, beats, n)
    if c_imm:
        c = np.full(rows, c[0])
        if code == OP.EXP:
            a = np.minimum(a, c[0])
    fields = {"op": int(code), "rows": rows, "beats": beats, "a_scalar": a_scalar,
              "b_scalar": b_scalar, "c_imm": c_imm, "imm": int(c[0]) if c_imm else 0,
              "dst_kind": kind, "pack": int(rng.integers(3)),
              "slot": int(rng.integers(0, slots - rows + 1)),
              "total_write": int(rng.random() < 0.5),
              "signal": {"enable": int(rng.integers(2)), "semaphore": int(rng.integers(16))},
              **extra}
    if rng.random() < 0.5:
        fields.update(lo=0, hi=beats * n, causal=0)
    else:
        lo = int(rng.integers(-2, beats * n + 1))
        fields.update(lo=lo, hi=int(rng.integers(lo - 1, beats * n + 3)),
                      causal=int(rng.integers(2)))
    acc = {}
    for name, values, scalar in (("a", a, a_scalar), ("b", b, b_scalar)):
        if scalar:
            base = fields[name] = ring.take(blocks)
            for r in range(rows):
                acc.setdefault(base + r // n, np.zeros(n, np.int64))[r % n] = values[r, 0, 0]
        else:
            base = fields[name] = ring.take(blocks * beats * n)
            for r in range(rows):
                for j in range(beats):
                    acc[base + (r // n) * beats * n + j * n + r % n] = values[r, j]
    if not c_imm:
        base = fields["c"] = ring.take(blocks)
        for r in range(rows):
            acc.setdefault(base + r // n, np.zeros(n, np.int64))[r % n] = c[r]
    if kind == VecDst.TILE:
        fields["dst"] = ring.take(blocks * beats * n)
    elif kind == VecDst.SCALAR:
        fields["dst"] = ring.take(blocks)
    elif kind == VecDst.SPAD:
        fields["dst"] = spad_ring.take(_spad_words(rng, fields))
    if fields["total_write"]:
        fields["total"] = ring.take(blocks)
    return ("LOAD", {"acc": acc}), ("VEC", fields)


def random_program(seed, n, slots, count, batch, acc_depth, spad_words):
    """``count`` random VEC instructions (every opcode in turn), ``batch`` back to back
    after each LOAD. A SiLU table is loaded first (256 SILU_LOAD rows)."""
    rng = np.random.default_rng(seed)
    ring, spad_ring = Ring(acc_depth), Ring(spad_words)
    sg = float(rng.uniform(0.01, 0.1))
    table = silu_table(sg, silu_output_scale(sg))
    program = []
    for start in range(0, 256, slots):  # SILU_LOAD: c = code, a_0 = table[code]
        rows = min(slots, 256 - start)
        acc = {}
        for r in range(rows):
            acc.setdefault(r // n, np.zeros(n, np.int64))[r % n] = table[start + r]
            acc.setdefault(8 + r // n, np.zeros(n, np.int64))[r % n] = start + r
        program += [("LOAD", {"acc": acc}),
                    ("VEC", {"op": int(OP.SILU_LOAD), "a": 0, "a_scalar": 1, "c": 8,
                             "rows": rows, "beats": 1, "lo": 0, "hi": 1,
                             "dst_kind": VecDst.NONE})]
    codes = [OP(i) for i in range(15)]
    order = []
    while len(order) < count:
        order += list(rng.permutation(codes))
    for first in range(0, count, batch):
        loads, vecs = {}, []
        for code in order[first:first + batch]:
            (_, step), vec = random_vec(rng, n, slots, ring, spad_ring, code)
            loads.update(step["acc"])
            vecs.append(vec)
        program += [("LOAD", {"acc": loads})] + vecs
    return program


@pytest.mark.parametrize(("stream", "n", "stalls"),
                         [(1, 4, False), (2, 4, True), (3, 8, True), (4, 2, True)])
def test_random_instructions_match_the_model(stream, n, stalls, seed):
    seed += stream
    slots = {2: 5, 4: 6, 8: 4}[n]
    program = random_program(seed, n, slots, count=30 if n == 4 else 15, batch=5,
                             acc_depth=1024, spad_words=512)
    stall = 0.3 if stalls else 0.0
    ref, hw, dones, cycles, *_ = run_engine(
        program, n=n, slots=slots, acc_depth=1024, spad_words=512, seed=seed,
        acc_stall=stall, spad_stall=stall, done_stall=stall, idle=stall,
        resp_delay=(1, 6) if stalls else (2, 2))
    check_same(ref, hw, dones, program)
    kinds = {(f["op"], f["dst_kind"]) for name, f in program if name == "VEC"}
    assert {op for op, _ in kinds} == set(range(15))


# --- overlapping instructions ------------------------------------------------------------


def _region(base, size):
    return set(range(base, base + size))


class _Batch:
    """Accumulator regions of one batch of dependent instructions: fresh ones (values
    LOADed before the batch) and the recent destinations later operands may read."""

    def __init__(self, rng, n):
        self.rng, self.n = rng, n
        self.loads, self.recent, self.free = {}, [], 0

    def fresh(self, size, low, high):
        base, self.free = self.free, self.free + size
        for e in range(base, base + size):
            self.loads[e] = self.rng.integers(low, high, self.n)
        return base

    def operand(self, size, writes, low=-(1 << 47), high=1 << 47, reuse=True):
        """One of the last four destinations, if it keeps clear of the instruction's own
        ``writes``; else a fresh region of values in [low, high)."""
        if reuse and self.recent and self.rng.random() < 0.85:
            base = self.recent[-int(self.rng.integers(1, min(4, len(self.recent)) + 1))]
            if not _region(base, size) & writes:
                return base
        return self.fresh(size, low, high)


def dependent_program(seed, n, slots, count, acc_depth):
    """``count`` VEC instructions in batches issued back to back (a LOAD of fresh operands
    before each batch), whose operands are often what recent instructions wrote: their
    TILE or SCALAR destinations and row totals (RAW dependencies at distances 1 to 4,
    some in place), else fresh regions; operands an op does not read (b of a SUM, c with
    an immediate) point at recent destinations too. The ops keep every result in every
    op's domain when chained (ADD, MAX, SUM, RESCALE with an immediate alpha, SILU,
    TOPK), and carry vector-unit slot state from one instruction to the next: RECIP then
    DIV, SILU_LOAD then SILU, reductions whose totals a later non-reducing op with
    ``total_write`` reports."""
    rng = np.random.default_rng(seed)
    codes = (OP.ADD, OP.MAX, OP.SUM, OP.RESCALE, OP.SILU, OP.TOPK, OP.TOPK_INDEX, OP.RECIP,
             OP.DIV, OP.SILU_LOAD)
    spad_ring = Ring(256)
    program, batch, mem = [], [], _Batch(rng, n)
    for _ in range(count):
        code = OP(rng.choice(codes))
        rows = int(rng.integers(1, slots + 1))
        one_beat = code in (OP.TOPK, OP.TOPK_INDEX, OP.RECIP, OP.SILU_LOAD)
        beats = 1 if one_beat else int(rng.integers(1, 4))
        blocks = -(-rows // n)
        tile = blocks * beats * n
        if mem.free + 4 * (tile + blocks) > acc_depth:  # the next batch, in fresh memory
            program += [("LOAD", {"acc": mem.loads})] + batch
            batch, mem = [], _Batch(rng, n)
        kind = int(rng.choice(4, p=[0.4, 0.3, 0.15, 0.15]))
        f = {"op": int(code), "rows": rows, "beats": beats, "dst_kind": kind,
             "slot": int(rng.integers(0, slots - rows + 1)), "pack": int(rng.integers(3)),
             "total_write": int(rng.random() < 0.5),
             "a_scalar": int(rng.random() < 0.25), "b_scalar": int(rng.random() < 0.25),
             "signal": {"enable": int(rng.integers(2)), "semaphore": int(rng.integers(16))}}
        if rng.random() < 0.5:
            f.update(lo=0, hi=beats * n, causal=0)
        else:
            lo = int(rng.integers(-2, beats * n + 1))
            f.update(lo=lo, hi=int(rng.integers(lo - 1, beats * n + 3)),
                     causal=int(rng.integers(2)))
        writes = set()
        if kind in (VecDst.TILE, VecDst.SCALAR):
            size = tile if kind == VecDst.TILE else blocks
            f["dst"] = mem.fresh(size, 0, 1)
            writes |= _region(f["dst"], size)
        elif kind == VecDst.SPAD:
            f["dst"] = spad_ring.take(_spad_words(rng, f))
        if f["total_write"]:
            f["total"] = mem.fresh(blocks, 0, 1)
            writes |= _region(f["total"], blocks)
        sizes = {name: blocks if f[f"{name}_scalar"] else tile for name in "ab"}
        if code == OP.DIV:  # |a| times 1/l must fit 63 bits
            f["a"] = mem.operand(sizes["a"], writes, -(1 << 30), 1 << 30, reuse=False)
            f.update(shift=int(rng.choice([15, 16])), sat=int(rng.integers(2)))
        elif kind == VecDst.TILE and code in (OP.ADD, OP.SILU) and rng.random() < 0.3:
            f.update(a=f["dst"], a_scalar=0)  # in place
        else:
            f["a"] = mem.operand(sizes["a"], writes)
        if code == OP.ADD and f["a"] == f.get("dst") and not f["a_scalar"]:
            f.update(b=f["a"], b_scalar=0)  # dst = a + a, in place
        else:
            f["b"] = mem.operand(sizes["b"], writes)
        if code == OP.RESCALE or (code in (OP.TOPK, OP.TOPK_INDEX) and rng.random() < 0.5):
            high = (1 << T) + 1 if code == OP.RESCALE else 1000  # alpha <= 1.0
            f.update(c_imm=1, imm=int(rng.integers(0, high)),
                     c=mem.recent[-1] if mem.recent else 0)  # not read
        elif code == OP.RECIP:  # a divisor l >= 1
            f["c"] = mem.fresh(blocks, 1, 1 << NUMERICS.attn_sum_bits)
        elif code in (OP.TOPK, OP.TOPK_INDEX):  # lane 0's index c, with c + N <= 2**16
            f["c"] = mem.fresh(blocks, 0, (1 << 16) - n)
        else:
            f["c"] = mem.operand(blocks, writes)
        mem.recent += [f[name] for name in ("dst", "total") if name in f
                       and (name == "total" or kind in (VecDst.TILE, VecDst.SCALAR))]
        batch.append(("VEC", f))
    return program + [("LOAD", {"acc": mem.loads})] + batch


def _dependencies(program, n, distance):
    """How many VEC instructions read (with an operand their op uses) what one of the
    ``distance`` VEC instructions before them writes in the accumulator, within a batch."""
    found, window = 0, []
    for name, f in program:
        if name == "LOAD":
            window = []
            continue
        reads, writes = accesses(Opcode.VEC, f, n)
        found += any(reads & earlier for earlier in window)
        window = (window + [{x for x in writes if x >= 1 << 20}])[-distance:]
    return found


@pytest.mark.parametrize(("stream", "n", "stalls"),
                         [(11, 4, False), (12, 4, True), (11, 8, True)])
def test_random_dependent_instructions_match_the_model(stream, n, stalls, seed):
    """Back-to-back instructions with random RAW dependencies (on destinations and
    totals, at distances 1 to 4) and slot state carried between them, with random
    backpressure everywhere: bit-exact with the model, done beats in order."""
    seed += stream
    slots = {4: 6, 8: 4}[n]
    program = dependent_program(seed, n, slots, count=48, acc_depth=1024)
    assert _dependencies(program, n, 1) >= 6 and _dependencies(program, n, 4) >= 15
    stall = 0.3 if stalls else 0.0
    ref, hw, dones, *_ = run_engine(
        program, n=n, slots=slots, acc_depth=1024, spad_words=256, seed=seed,
        acc_stall=stall, spad_stall=stall, done_stall=stall, idle=stall / 3,
        resp_delay=(1, 6) if stalls else (2, 2))
    check_same(ref, hw, dones, program)


def _chain(n, rows, beats, sources, **extra):
    """ADD instructions: instruction i reads ``sources[i]`` (a and b), writes 64·(i+1)."""
    return [("VEC", {"op": int(OP.ADD), "a": src, "b": src, "rows": rows, "beats": beats,
                     "lo": 0, "hi": beats * n, "dst": 64 * (i + 1), "dst_kind": VecDst.TILE,
                     **extra}) for i, src in enumerate(sources)]


def test_a_gated_unit_clock_changes_nothing(seed):
    """The simulation-only clock gate of the vector unit (its clock stops while it is
    idle): the same random program under stalls and idle gaps gives the same results,
    done beats and accept/done cycles as the ungated engine, cycle for cycle."""
    program = random_program(seed + 7, 4, 6, count=20, batch=5, acc_depth=1024,
                             spad_words=512)
    runs = []
    for gated in (False, True):
        ref, hw, dones, cycles, _, accepted, finished, error = run_engine(
            program, n=4, slots=6, acc_depth=1024, spad_words=512, seed=seed, acc_stall=0.3,
            spad_stall=0.3, done_stall=0.3, idle=0.5, resp_delay=(1, 6), gated=gated)
        check_same(ref, hw, dones, program)
        runs.append((dones, cycles, accepted, finished, error))
    assert runs[0] == runs[1]


def test_independent_instructions_overlap():
    """Independent instructions issue back to back: the span from the first command to
    the last done beat is the beats of all of them plus one overhead, not a sum of
    overheads; every destination kind, with totals."""
    n, rows, beats = 4, 4, 3
    load = ("LOAD", {"acc": {e: np.arange(n) + e for e in range(0, 512, 7)}})
    program = [load, *_chain(n, rows, beats, [0, 256, 320, 384])]
    for i, (kind, total) in enumerate(((VecDst.SCALAR, 0), (VecDst.SPAD, 1),
                                       (VecDst.NONE, 1)), 2):
        program[i][1].update(dst_kind=kind, total=500 + i, total_write=total,
                             op=int(OP.SUM if total else OP.ADD))
    ref, hw, dones, _, dut, accepted, finished, _ = run_engine(
        program, n=n, acc_depth=512, resp_delay=(2, 2))
    check_same(ref, hw, dones, program)
    span = finished[-1] - accepted[0]
    beats_total = 4 * rows * beats
    assert span <= beats_total + 2 + dut.overhead + 2, (span, accepted, finished)
    assert span < 4 * (rows * beats + dut.overhead), (span, accepted, finished)
    assert finished == sorted(finished)


def test_dependent_instructions_wait_for_their_operands():
    """A chain of instructions each reading (a, b, c, as tile or scalar) what an earlier
    one wrote — the one before, or two before with an independent one between — gets the
    model's results; an operand the op does not read (b of a SUM) does not hold it."""
    n, rows, beats = 4, 4, 2
    load = ("LOAD", {"acc": {e: np.arange(n) * 3 + e for e in range(0, 512)}})
    span = {}
    for case, sources in (("chain", [0, 64, 128, 192]), ("skip", [0, 400, 64, 128])):
        program = [load, *_chain(n, rows, beats, sources)]
        ref, hw, dones, _, dut, accepted, finished, _ = run_engine(
            program, n=n, acc_depth=512)
        check_same(ref, hw, dones, program)
        span[case] = finished[-1] - accepted[0]
    # Through totals, scalar destinations and c; and b of a SUM pointing at the
    # previous destination.
    program = [
        load,
        ("VEC", {"op": int(OP.MAX), "a": 0, "c": 40, "rows": rows, "beats": beats, "lo": 0,
                 "hi": beats * n, "dst_kind": VecDst.NONE, "total": 300, "total_write": 1}),
        ("VEC", {"op": int(OP.ADD), "a": 300, "a_scalar": 1, "b": 41, "b_scalar": 1,
                 "rows": rows, "beats": 1, "lo": 0, "hi": 1, "dst": 301,
                 "dst_kind": VecDst.SCALAR}),
        ("VEC", {"op": int(OP.MAX), "a": 100, "c": 301, "rows": rows, "beats": beats,
                 "lo": 0, "hi": beats * n, "dst": 200, "dst_kind": VecDst.TILE}),
        ("VEC", {"op": int(OP.SUM), "a": 120, "b": 200, "rows": rows, "beats": beats,
                 "lo": 0, "hi": beats * n, "dst_kind": VecDst.SCALAR, "dst": 302}),
    ]
    ref, hw, dones, _, dut, accepted, finished, _ = run_engine(program, n=n, acc_depth=512)
    check_same(ref, hw, dones, program)
    # A dependent instruction reads after its producer's last write: its own done beat
    # comes at least its beats plus the unit's latency later.
    gaps = [b - a for a, b in zip(finished, finished[1:], strict=False)]
    assert gaps[-1] == rows * beats, gaps  # the SUM did not wait for the MAX before it
    waited = rows * beats + dut.unit.latency
    assert gaps[0] >= rows + dut.unit.latency and gaps[1] >= waited, gaps  # the others did
    assert span["chain"] >= rows * beats + dut.overhead + 3 * waited, span
    assert span["skip"] < span["chain"], span  # the independent one overlapped


# --- online softmax ---------------------------------------------------------------------


def softmax_program(seed, n, rows, blocks, visible0):
    """Attention rows by online softmax as a tile program: per block of 2N keys the
    scores S = Q Kᵀ (GEMM), LOGIT (running max), the alpha EXP, the P EXP as two int8
    limbs in the scratchpad (+ sum), P·V (two GEMMs: high limb, then low limb
    accumulated with shift 7), the RESCALE of acc and of l; then RECIP, DIV, REQUANT.
    Row r sees keys 0 .. visible0 + r - 1 (causal bounds). Returns (program, golden
    int8 output (rows, N), the output's scratchpad address)."""
    rng = np.random.default_rng(seed)
    block, keys = 2 * n, 2 * n * blocks
    q = rng.integers(-128, 128, (rows, n))
    k = rng.integers(-128, 128, (keys, n))
    v = rng.integers(-128, 128, (keys, n))
    lm, ls = logit_multiplier(0.05 * 1.4427 * 1024 / 64)
    om, osh = quantize_multiplier(1 / (1 << NUMERICS.attn_out_frac_bits))
    spad = {i: lanes_word(q[i], n) for i in range(rows)}
    spad.update({16 + j: lanes_word(k[j], n) for j in range(keys)})
    spad.update({64 + j: lanes_word(v[j], n) for j in range(keys)})
    p_lo, p_hi, out = 128, 160, 192
    # Accumulator entries (rows <= N: one entry per scalar region).
    s, x, m_regs, alpha, psum, ell, acc, pv, o = 0, 16, (32, 33), 34, 35, 36, 40, 48, 56
    zeros = np.zeros(n, np.int64)
    program = [("LOAD", {"spad": spad, "acc": {m_regs[0]: np.full(n, NEG_INF), ell: zeros,
                                               **{acc + i: zeros for i in range(n)}}})]
    full = {"rows": rows, "lo": 0}
    for bl in range(blocks):
        m_old, m_new = m_regs[bl % 2], m_regs[(bl + 1) % 2]
        window = {"lo": -(1 << 12), "hi": visible0 - bl * block, "causal": 1}
        sig = {"enable": 1, "semaphore": bl % 16}
        program += [
            ("GEMM", {"a": 0, "a_rows": 1, "b": 16 + bl * block, "b_rows": 1, "c": s,
                      "m": rows, "k": n, "p": block}),
            ("VEC", {**full, **window, "op": int(OP.LOGIT), "a": s, "c": m_old, "beats": 2,
                     "mult": lm, "shift": ls, "dst": x, "dst_kind": VecDst.TILE,
                     "total": m_new, "total_write": 1, "signal": sig}),
            ("VEC", {**full, "op": int(OP.EXP), "a": m_old, "a_scalar": 1, "c": m_new,
                     "beats": 1, "hi": 1, "shift": T, "dst": alpha,
                     "dst_kind": VecDst.SCALAR}),
            ("VEC", {**full, **window, "op": int(OP.EXP), "a": x, "c": m_new, "beats": 2,
                     "shift": NUMERICS.attn_p_bits, "sat": 1, "dst": p_lo,
                     "dst_kind": VecDst.SPAD, "pack": VecPack.LIMB_LO, "total": psum,
                     "total_write": 1}),
            ("VEC", {**full, **window, "op": int(OP.EXP), "a": x, "c": m_new, "beats": 2,
                     "shift": NUMERICS.attn_p_bits, "sat": 1, "dst": p_hi,
                     "dst_kind": VecDst.SPAD, "pack": VecPack.LIMB_HI}),
            ("GEMM", {"a": p_hi, "a_rows": 1, "b": 64 + bl * block, "c": pv, "m": rows,
                      "k": block, "p": n}),
            ("GEMM", {"a": p_lo, "a_rows": 1, "b": 64 + bl * block, "c": pv, "m": rows,
                      "k": block, "p": n, "accumulate": 1, "acc_shift": 7}),
            ("VEC", {**full, "op": int(OP.RESCALE), "a": acc, "b": pv, "c": alpha,
                     "beats": 1, "hi": n, "dst": acc, "dst_kind": VecDst.TILE}),
            ("VEC", {**full, "op": int(OP.RESCALE), "a": ell, "a_scalar": 1, "b": psum,
                     "b_scalar": 1, "c": alpha, "beats": 1, "hi": 1, "dst": ell,
                     "dst_kind": VecDst.SCALAR}),
        ]
    program += [
        ("VEC", {**full, "op": int(OP.RECIP), "c": ell, "beats": 1, "hi": 1,
                 "dst_kind": VecDst.NONE}),
        ("VEC", {**full, "op": int(OP.DIV), "a": acc, "beats": 1, "hi": n,
                 "shift": NUMERICS.attn_out_frac_bits, "dst": o, "dst_kind": VecDst.TILE}),
        ("VEC", {**full, "op": int(OP.REQUANT), "a": o, "beats": 1, "hi": n, "mult": om,
                 "shift": osh, "dst": out, "dst_kind": VecDst.SPAD, "pack": VecPack.BYTE,
                 "signal": {"enable": 1, "semaphore": 15}}),
    ]
    scores = q @ k.T
    xg = to_log2_domain(scores, lm, ls)[None]
    mask = np.arange(keys)[None, None, :] < (visible0 + np.arange(rows))[None, :, None]
    g_acc, g_total = online_softmax_pv(xg, mask, v[None], block)
    golden = normalise_output(g_acc, g_total, om, osh)[0].astype(np.int64)
    assert (exp2_neg(np.zeros(1, np.int64), T) == 1 << T).all()
    return program, golden, out


def test_softmax_program_on_the_model_is_golden():
    """The model alone: the ISA's online softmax equals golden attention."""
    for seed, (n, rows, blocks, visible0) in enumerate([(4, 3, 3, 13), (8, 5, 2, 3),
                                                         (4, 4, 2, 1)]):
        program, golden, out = softmax_program(seed, n, rows, blocks, visible0)
        model = TileModel(n, spad_words=256, acc_depth=64, slots=8)
        for name, fields in program:
            load(model, fields) if name == "LOAD" else model.step(name, fields)
        got = np.array([word_lanes(model.spad[out + r], n) for r in range(rows)])
        assert (got == golden).all(), (got.tolist(), golden.tolist())


@pytest.mark.parametrize("stalls", [False, True])
def test_softmax_rows_match_the_model_and_golden(stalls):
    n, rows = 4, 3
    program, golden, out = softmax_program(7, n, rows, 3, 13)
    stall = 0.25 if stalls else 0.0
    ref, hw, dones, *_ = run_engine(program, n=n, slots=4, acc_depth=64, spad_words=256,
                                    acc_stall=stall, spad_stall=stall, done_stall=stall,
                                    resp_delay=(1, 5))
    check_same(ref, hw, dones, program)
    got = np.array([word_lanes(hw.spad[out + r], n) for r in range(rows)])
    assert (got == golden).all()


# --- rate, errors, parameters --------------------------------------------------------------


def _long_add(n, rows, beats, **extra):
    blocks = -(-rows // n)
    return ("VEC", {"op": int(OP.ADD), "a": 0, "b": 0, "rows": rows, "beats": beats,
                    "lo": 0, "hi": beats * n, "dst": blocks * beats * n,
                    "dst_kind": VecDst.TILE, **extra})


def test_one_beat_per_cycle():
    """Without stalls a beat issues every cycle: from a command to its done beat takes
    rows·beats + dut.overhead cycles, and back-to-back commands lose no more."""
    n, rows = 4, 4
    spans = {}
    for beats in (8, 24):
        program = [_long_add(n, rows, beats), _long_add(n, rows, beats)]
        ref, hw, dones, cycles, dut, accepted, finished, _ = run_engine(
            program, n=n, acc_depth=256)
        check_same(ref, hw, dones, program)
        spans[beats] = [f - a for a, f in zip(accepted, finished, strict=True)]
        assert spans[beats][0] <= rows * beats + dut.overhead, (spans, dut.overhead)
    per_beat = (spans[24][0] - spans[8][0]) / (rows * (24 - 8))
    assert per_beat == 1.0, spans


@pytest.mark.parametrize("kind", [VecDst.TILE, VecDst.SCALAR, VecDst.SPAD, VecDst.NONE])
@pytest.mark.parametrize("beats", [1, 3])
def test_row_totals_cost_one_cycle_per_block_of_rows(kind, beats):
    """With row totals, every destination runs at one beat per cycle plus one acc_w
    cycle per N rows (the gathered totals)."""
    n, rows = 4, 6
    program = [_long_add(n, rows, beats, dst_kind=kind, total=200, total_write=1,
                         op=int(OP.SUM))]
    ref, hw, dones, _, dut, accepted, finished, _ = run_engine(
        program, n=n, slots=rows, resp_delay=(2, 2))
    check_same(ref, hw, dones, program)
    span = finished[0] - accepted[0]
    slack = 1 + (2 if kind == VecDst.SPAD else 0)  # the totals' done; the response delay
    assert span <= rows * beats + -(-rows // n) + dut.overhead + slack, (kind, span)


def test_scratchpad_error_is_sticky():
    program = [_long_add(4, 2, 2, dst_kind=VecDst.SPAD)]
    *_, error = run_engine(program, error_at=1)
    assert error
    *_, error = run_engine(program)
    assert not error


@pytest.mark.parametrize(("args", "message"), [
    ({"n": 6}, "power of two"), ({"n": 64}, "power of two"),
    ({"acc_depth": 100}, "acc_depth"), ({"acc_depth": 2048}, "acc_depth"),
    ({"addr_bits": 17}, "addr_bits"), ({"slots": 0}, "slot count"),
    ({"in_flight": 3}, "in_flight"), ({"queue": 1}, "queue"),
])
def test_bad_parameters_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        VecEngine(**{"n": 4, **args})
