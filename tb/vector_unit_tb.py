"""cocotb tests of the vector unit in a StreamHarness, and the golden-backed model they use.

A *program* is a list of op beats (dicts of :class:`rtl.vector_unit.VectorOp` fields).
:func:`expected_results` runs it through :class:`golden.vector_model.VectorUnitModel`
(the golden functions beat by beat, with the slot state kept as the hardware does); the
scoreboard compares every result beat, and the count must be exact. The program builders
also check their chained results against the whole-row golden models (online_softmax_pv
+ normalise_output, softmax, topk) so a model slip cannot hide.
"""

from __future__ import annotations

import cocotb
import numpy as np

from golden.exp import NEG_INF, exp2_neg, logit_multiplier, to_log2_domain
from golden.gemm import quantize_multiplier, wrap
from golden.moe import silu_output_scale, silu_table, topk
from golden.reciprocal import divide
from golden.softmax import exact_matmul, normalise_output, online_softmax_pv, softmax
from golden.vector_model import VectorUnitModel, rescale
from rtl.vector_unit import (
    LANE_BITS,
    VectorOp,
    VectorOpcode,
    VectorResult,
    default_max_top_k,
)
from sim import coverage
from sim.harness_driver import HarnessDriver
from sim.runner import parameters, report
from sim.vector_unit_run import full_rate_span
from spec.numerics import NUMERICS

OP = VectorOpcode
T = NUMERICS.exp_table_frac_bits


# --- packing ---------------------------------------------------------------------


def beat(op: VectorOpcode, n: int, *, a=None, b=None, c=0, mult=0, shift=0, sat=0,
         mask=None, slot=0, first=0) -> dict:
    """One op beat with defaults (all lanes enabled, operands zero)."""
    zeros = [0] * n
    return {
        "opcode": op,
        "a": [int(x) for x in (zeros if a is None else a)],
        "b": [int(x) for x in (zeros if b is None else b)],
        "c": int(c), "mult": int(mult), "shift": int(shift), "sat": int(sat),
        "mask": (1 << n) - 1 if mask is None else int(mask),
        "slot": int(slot), "first": int(first),
    }


def pack(program: list[dict], n: int, slots: int) -> list[int]:
    layout = VectorOp(n, slots)
    return [layout.const(op).as_bits() for op in program]


def unpack(words: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Result words -> (beats x N lane values, totals), both int64."""
    layout = VectorResult(n)
    mask = (1 << LANE_BITS) - 1
    off_d, off_t = layout["data"].offset, layout["total"].offset
    data = np.array([[(w >> (off_d + LANE_BITS * i)) & mask for i in range(n)]
                     for w in words], dtype=np.int64).reshape(len(words), n)
    total = np.array([(w >> off_t) & mask for w in words], dtype=np.int64)
    return wrap(data, LANE_BITS), wrap(total, LANE_BITS)


# --- the golden-backed model -------------------------------------------------------


def expected_results(program: list[dict], n: int, slots: int, max_top_k: int | None = None):
    """(data, totals) the vector unit must produce for ``program``, from golden
    (:class:`golden.vector_model.VectorUnitModel` run from reset)."""
    model = VectorUnitModel(n, slots, max_top_k)
    beats = [model.step(op) for op in program]
    data = np.array([d for d, _ in beats], np.int64).reshape(len(program), n)
    return data, np.array([t for _, t in beats], np.int64)


def topk_waits(program: list[dict]) -> int:
    """Cycles the unit's intake waits for top-k, offered ``program`` back to back: one
    per top-k beat that reads the list (not ``first``) right after another top-k beat."""
    topk_ops = ("TOPK", "TOPK_INDEX")
    return sum(op["opcode"].name in topk_ops and prev["opcode"].name in topk_ops
               and not op["first"]
               for prev, op in zip(program, program[1:], strict=False))


# --- programs ------------------------------------------------------------------------


def random_program(rng: np.random.Generator, n: int, slots: int, count: int) -> list[dict]:
    """``count`` random ops of every kind, operands inside each golden function's domain."""
    program = []
    # A SiLU table first (as the compiler would load one per expert).
    sg = float(rng.uniform(0.01, 0.1))
    table = silu_table(sg, silu_output_scale(sg))
    for code in range(256):
        program.append(beat(OP.SILU_LOAD, n, a=[int(table[code])] + [0] * (n - 1), c=code))
    kinds = [OP.REQUANT, OP.LOGIT, OP.MAX, OP.SUM, OP.EXP, OP.RESCALE, OP.RECIP, OP.DIV,
             OP.ADD, OP.MUL, OP.SILU, OP.SWIGLU, OP.TOPK, OP.TOPK_INDEX]
    i32 = (-(1 << 31), 1 << 31)
    next_index = [0] * slots  # top-k: indices grow within a row, so they stay distinct
    for _ in range(count):
        code = kinds[rng.integers(len(kinds))]
        mask = int(rng.integers(1, 1 << n)) if rng.random() < 0.3 else (1 << n) - 1
        slot, first = int(rng.integers(slots)), int(rng.random() < 0.3)
        common = {"mask": mask, "slot": slot, "first": first}
        if code == OP.REQUANT:
            shift = int(rng.choice([0, 1, 2, int(rng.integers(0, 64))]))
            # Half the beats land inside int8 (a * mult >> shift small), so the rounding
            # and shifting are seen, not only the saturation.
            top = 1 << max(0, min(31, shift - 9)) if rng.random() < 0.5 else 1 << 31
            op = beat(code, n, a=rng.integers(-top, top, n),
                      mult=rng.integers(1 << 15, 1 << 16), shift=shift, **common)
        elif code == OP.LOGIT:
            m, sh = logit_multiplier(float(np.exp(rng.uniform(-12, 12))))
            # Small scores too: with a left shift (sh < 0) they stay unsaturated.
            top = 1 << int(rng.choice([4, 12, 31]))
            op = beat(code, n, a=rng.integers(-top, top, n), mult=m, shift=sh,
                      c=rng.choice([NEG_INF, int(rng.integers(-(1 << 30), 1 << 30))]), **common)
        elif code == OP.MAX:
            op = beat(code, n, a=rng.integers(-(1 << 41), 1 << 41, n),
                      c=rng.integers(-(1 << 41), 1 << 41), **common)
        elif code == OP.SUM:
            op = beat(code, n, a=rng.integers(-(1 << 40), 1 << 40, n), **common)
        elif code == OP.EXP:
            c = int(rng.integers(-(1 << 20), 1 << 20))
            spread = int(rng.choice([1 << 10, 1 << 14, 1 << 20]))
            a = c - rng.integers(0, spread, n)
            a[rng.random(n) < 0.2] = c  # d = 0: exactly 1.0
            op = beat(code, n, a=a, c=c, shift=rng.choice([14, 15, int(rng.integers(1, 30))]),
                      sat=rng.integers(2), **common)
        elif code == OP.RESCALE:
            op = beat(code, n, a=rng.integers(-(1 << 40), 1 << 40, n),
                      b=rng.integers(*i32, n), c=rng.integers(0, (1 << T) + 1), **common)
        elif code == OP.RECIP:
            op = beat(code, n, c=rng.choice([1, int(rng.integers(1, 1 << 32)),
                                             int(rng.integers(1, 1 << 16)),
                                             1 << int(rng.integers(32))]), **common)
        elif code == OP.DIV:
            op = beat(code, n, a=rng.integers(-(1 << 30), 1 << 30, n),
                      shift=rng.choice([15, 16]), sat=rng.integers(2), **common)
        elif code == OP.ADD:
            op = beat(code, n, a=rng.integers(-(1 << 46), 1 << 46, n),
                      b=rng.integers(-(1 << 46), 1 << 46, n), **common)
        elif code == OP.MUL:
            sat = int(rng.integers(2))
            hi = 1 << 8 if sat else 1 << 23
            op = beat(code, n, a=rng.integers(-hi, hi, n), b=rng.integers(-hi, hi, n),
                      mult=rng.integers(1 << 15, 1 << 16),
                      shift=rng.integers(0, 64) if sat else rng.integers(0, 32), sat=sat,
                      **common)
        elif code in (OP.TOPK, OP.TOPK_INDEX):
            if first:  # low indices, or high ones (every index bit; c + N stays < 2**16)
                next_index[slot] = int(rng.choice([rng.integers(0, 64),
                                                   rng.integers(0, (1 << 16) - 4096)]))
            base = next_index[slot]
            next_index[slot] += n + int(rng.integers(0, 4))
            spread = int(rng.choice([3, 1 << 31, 1 << 47]))  # 3: many ties
            op = beat(code, n, a=rng.integers(-spread, spread, n), c=base, **common)
        else:  # SILU, SWIGLU: int8 codes
            op = beat(code, n, a=rng.integers(-128, 128, n), b=rng.integers(-128, 128, n),
                      mult=rng.integers(1 << 15, 1 << 16), shift=rng.integers(8, 40), sat=1,
                      **common)
        program.append(op)
    return program


def attention_program(rng: np.random.Generator, n: int, slots: int, rows: int,
                      blocks: int, *, sink: bool = False):
    """Online softmax of ``rows`` query rows over ``blocks`` blocks of 2N keys, d_v = N.

    Per block and row: LOGIT beats (scores -> logits, running max), the alpha EXP, the P
    EXP beats (sum of P), RESCALE of acc (b = P.V, the tensor core's part) and of l;
    then RECIP, DIV and REQUANT per row. Returns (program, indices of the final beats,
    golden int8 output (rows, N)).
    """
    keys = blocks * 2 * n
    scores = rng.integers(-3000, 3000, (1, rows, keys))
    lm, ls = logit_multiplier(0.05 * 1.4427 * 1024)
    x = to_log2_domain(scores, lm, ls)
    mask = rng.random((1, rows, keys)) < 0.85
    mask[..., 0] = True
    v = rng.integers(-128, 128, (1, keys, n))
    sinks = rng.integers(-2000, 2000, (1, rows)) if sink else None
    om, osh = quantize_multiplier(1 / (1 << NUMERICS.attn_out_frac_bits))
    program, finals = [], []
    block = 2 * n
    for r in range(rows):
        slot = r % slots
        m_old = NEG_INF if sinks is None else int(sinks[0, r])
        acc = np.zeros(n, np.int64)
        total = 0 if sinks is None else NUMERICS.attn_p_max
        for bl in range(blocks):
            ks = slice(bl * block, (bl + 1) * block)
            xb, vis = x[0, r, ks], mask[0, r, ks]
            for half in range(2):
                lanes = slice(half * n, (half + 1) * n)
                program.append(beat(OP.LOGIT, n, a=scores[0, r, ks][lanes], mult=lm, shift=ls,
                                    c=m_old, mask=_bits(vis[lanes]), slot=slot,
                                    first=half == 0))
            m_new = max(m_old, int(np.where(vis, xb, NEG_INF).max()))
            started = m_old > NEG_INF
            program.append(beat(OP.EXP, n, a=[m_old] + [0] * (n - 1), c=m_new, shift=T,
                                mask=int(started), slot=slot))
            alpha = int(exp2_neg(m_new - m_old, T)) if started else 0
            p = np.where(vis, np.minimum(exp2_neg(np.where(vis, m_new - xb, 0),
                                                  NUMERICS.attn_p_bits), NUMERICS.attn_p_max), 0)
            for half in range(2):
                lanes = slice(half * n, (half + 1) * n)
                program.append(beat(OP.EXP, n, a=xb[lanes], c=m_new, shift=NUMERICS.attn_p_bits,
                                    sat=1, mask=_bits(vis[lanes]), slot=slot, first=half == 0))
            pv = exact_matmul(p[None, :], v[0, ks])[0]
            program.append(beat(OP.RESCALE, n, a=acc, b=pv, c=alpha, slot=slot))
            program.append(beat(OP.RESCALE, n, a=[total] + [0] * (n - 1),
                                b=[int(p.sum())] + [0] * (n - 1), c=alpha, mask=1, slot=slot))
            acc, total, m_old = rescale(acc, alpha, pv), int(rescale(total, alpha, p.sum())), m_new
            # The chain so far must be golden's state after bl + 1 blocks.
            end = (bl + 1) * block
            g_acc, g_total = online_softmax_pv(
                x[:, r:r + 1, :end], mask[:, r:r + 1, :end], v[:, :end], block,
                None if sinks is None else sinks[:, r:r + 1])
            assert (g_acc[0, 0] == acc).all() and g_total[0, 0] == total, "chain != golden"
        program.append(beat(OP.RECIP, n, c=total, slot=slot))
        program.append(beat(OP.DIV, n, a=acc, shift=NUMERICS.attn_out_frac_bits, slot=slot))
        o = divide(acc, total, NUMERICS.attn_out_frac_bits)
        program.append(beat(OP.REQUANT, n, a=o, mult=om, shift=osh, slot=slot))
        finals.append(len(program) - 1)
    g_acc, g_total = online_softmax_pv(x, mask, v, block, sinks)
    golden_out = normalise_output(g_acc, g_total, om, osh)[0].astype(np.int64)
    return program, finals, golden_out


def gating_program(rng: np.random.Generator, n: int, rows: int):
    """MoE gating softmax over N logits per row: MAX, EXP (Q1.15, sum), RECIP, DIV (sat)."""
    x = rng.integers(-20000, 20000, (rows, n))
    program, finals = [], []
    for r in range(rows):
        program.append(beat(OP.MAX, n, a=x[r], c=NEG_INF, first=1))
        m = int(x[r].max())
        program.append(beat(OP.EXP, n, a=x[r], c=m, shift=T, first=1))
        p = exp2_neg(m - x[r], T)
        program.append(beat(OP.RECIP, n, c=int(p.sum())))
        program.append(beat(OP.DIV, n, a=p, shift=NUMERICS.gate_frac_bits, sat=1))
        finals.append(len(program) - 1)
    return program, finals, softmax(x)


def routing_program(rng: np.random.Generator, n: int, slots: int, rows: int,
                    ties: list | None = None):
    """MoE routing then gating, per row of router logits (as ``golden.moe.moe_layer``).

    Per row (slot r % slots): E experts (6, 32 or 48) in ceil(E / n) TOPK beats (``c`` =
    first expert of the beat, the last beat masked), a TOPK_INDEX read (``mask`` 0) for
    the chosen experts, then the gating softmax over the k selected logits: LOGIT (to the
    log2 domain, max), EXP (sum), RECIP, DIV (Q0.15). k is the bound ``max_top_k`` on
    alternate rows, else a smaller one; some rows are all ties. Final beats: the
    TOPK_INDEX (golden ``topk``) and the DIV (golden gates) of every row. ``ties``, if
    given, receives per row whether the k-th and (k+1)-th best logits are equal.
    """
    k_list = default_max_top_k(n)
    program, finals, golden = [], [], []
    for r in range(rows):
        slot = r % slots
        experts = int(rng.choice([6, 32, 48]))
        k = min(k_list, experts) if r % 2 == 0 else int(rng.integers(1, min(k_list, experts) + 1))
        spread = [1, 4, 1 << 31][r % 3]  # 1: all equal, 4: many ties, 2**31: int32
        logits = rng.integers(-spread, spread, experts) if spread > 1 else np.full(experts, 7)
        for start in range(0, experts, n):
            lanes = logits[start:start + n]
            a = np.zeros(n, np.int64)
            a[: lanes.size] = lanes
            program.append(beat(OP.TOPK, n, a=a, c=start, mask=(1 << lanes.size) - 1,
                                slot=slot, first=start == 0))
        program.append(beat(OP.TOPK_INDEX, n, mask=0, slot=slot))
        chosen = topk(logits[None, :], k)[0]
        if ties is not None:
            ranked = np.sort(logits)[::-1]
            ties.append(bool(k < experts and ranked[k - 1] == ranked[k]))
        finals.append(len(program) - 1)
        golden.append(chosen)
        selected = logits[chosen]
        lm, ls = logit_multiplier(float(np.exp(rng.uniform(-12, -4))))
        x = to_log2_domain(selected, lm, ls)
        pad = np.zeros(n - k, np.int64)
        mask = (1 << k) - 1
        program.append(beat(OP.LOGIT, n, a=np.concatenate([selected, pad]), mult=lm, shift=ls,
                            c=NEG_INF, mask=mask, slot=slot, first=1))
        m = int(x.max())
        program.append(beat(OP.EXP, n, a=np.concatenate([x, pad]), c=m, shift=T, mask=mask,
                            slot=slot, first=1))
        p = exp2_neg(m - x, T)
        program.append(beat(OP.RECIP, n, c=int(p.sum()), slot=slot))
        program.append(beat(OP.DIV, n, a=np.concatenate([p, pad]), shift=NUMERICS.gate_frac_bits,
                            sat=1, mask=mask, slot=slot))
        finals.append(len(program) - 1)
        golden.append(softmax(x[None, :])[0])
    return program, finals, golden


def edge_program(rng: np.random.Generator, n: int, rounds: int):
    """Operands at every scale, where the random programs' ranges stop short.

    Per round: an EXP beat per bit k of the exponent ``d = c - a_i`` (k = 0 .. 47), its
    lanes ``d = 2**k + r`` with small ``r`` (so a lost high bit of ``d`` turns a result
    that underflows to 0 into a large one); and a top-k row per scale ``2**s``
    (s = 1 .. 45), three beats of values ``base + [-2**s, 2**s)`` then a TOPK_INDEX read,
    so the merge's compares are decided at every bit of the values. Final beats: every
    EXP (golden ``exp2_neg``) and every TOPK_INDEX (golden ``topk``, all K entries).
    """
    k_list = default_max_top_k(n)
    f_bits = NUMERICS.exp_frac_bits
    program, finals, golden = [], [], []
    for _ in range(rounds):
        for k in range(LANE_BITS):
            c = (1 << 20) + int(rng.integers(0, 1 << 20))  # a = c - d stays above -2**47
            d = (1 << k) + rng.integers(0, 1 << (f_bits + 2), n)
            shift, sat = int(rng.integers(1, 30)), int(rng.integers(2))
            program.append(beat(OP.EXP, n, a=c - d, c=c, shift=shift, sat=sat,
                                first=1))
            p = exp2_neg(d, shift)
            finals.append(len(program) - 1)
            golden.append(np.minimum(p, (1 << shift) - 1) if sat else p)
        for scale in range(1, 46):
            base = int(rng.integers(-(1 << 46), 1 << 46))
            logits = base + rng.integers(-(1 << scale), 1 << scale, 3 * n)
            for start in range(0, logits.size, n):
                program.append(beat(OP.TOPK, n, a=logits[start:start + n], c=start,
                                    first=start == 0))
            program.append(beat(OP.TOPK_INDEX, n, mask=0))
            finals.append(len(program) - 1)
            golden.append(topk(logits[None, :], k_list)[0])
    return program, finals, golden


def _bits(flags) -> int:
    return sum(1 << i for i, f in enumerate(flags) if f)


def build_program(kind: str, n: int, slots: int, seed: int, count: int,
                  ties: list | None = None):
    """(program, final-beat indices, golden whole-row outputs or None) for a test kind
    (``ties``: see :func:`routing_program`)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return random_program(rng, n, slots, count), [], None
    if kind in ("attention", "attention-sink"):
        return attention_program(rng, n, slots, rows=max(1, count // 40), blocks=3,
                                 sink=kind == "attention-sink")
    if kind == "gating":
        return gating_program(rng, n, rows=max(1, count // 4))
    if kind == "routing":
        return routing_program(rng, n, slots, rows=max(1, count // 12), ties=ties)
    if kind == "edges":
        return edge_program(rng, n, rounds=max(1, count // 200))
    raise ValueError(f"unknown program kind {kind!r}")


def check(got_data, got_total, program, n, slots, finals=(), golden=None) -> None:
    """Scoreboard: every beat equal to the model; final beats equal to the row golden
    (``golden[i]``, one row per final beat, compared with that beat's first lanes)."""
    want_data, want_total = expected_results(program, n, slots)
    for index in range(len(program)):
        if not ((got_data[index] == want_data[index]).all()
                and got_total[index] == want_total[index]):
            raise AssertionError(
                f"beat {index} ({program[index]['opcode'].name}) wrong: got "
                f"{got_data[index].tolist()} total {got_total[index]}, want "
                f"{want_data[index].tolist()} total {want_total[index]}; op {program[index]}")
    if golden is not None:
        assert len(golden) == len(finals), (len(golden), len(finals))
        for index, want in zip(finals, golden, strict=True):
            want = np.asarray(want)
            assert (got_data[index][: want.size] == want).all(), (
                f"beat {index} ({program[index]['opcode'].name}) differs from the row golden: "
                f"got {got_data[index].tolist()}, want {want.tolist()}")


# --- cocotb ------------------------------------------------------------------------


class VectorUnitTB:
    """Loads a program into the harness, runs it and checks it against golden."""

    def __init__(self, dut, n: int, slots: int):
        self.harness = HarnessDriver(dut)
        self.n, self.slots = n, slots

    def set_idle_generator(self, probability: float) -> None:
        self.harness.set_idle("ops", probability)

    def set_backpressure_generator(self, probability: float) -> None:
        self.harness.set_backpressure("results", probability)

    async def run(self, program: list[dict], seed: int):
        self.harness.load("ops", pack(program, self.n, self.slots))
        self.harness.expect("results", len(program))
        stats = await self.harness.run(seed=seed, timeout_cycles=30 * len(program) + 1000)
        assert stats.finished, f"timed out after {stats.cycles} cycles"
        await self.harness.settle(64)
        received = self.harness.counter("results_received")
        assert received == len(program), f"{received} results, expected {len(program)}"
        data, total = unpack(self.harness.read("results", len(program)), self.n)
        return stats, data, total


@cocotb.test()
async def program_matches_golden(dut):
    """A program (random ops, attention rows or gating rows), bit-exact against golden."""
    p = parameters()
    n, slots, seed = p["n"], p["slots"], p["seed"]
    program, finals, golden = build_program(p["kind"], n, slots, seed, p["count"])
    tb = VectorUnitTB(dut, n, slots)
    tb.set_idle_generator(p.get("idle", 0.0))
    tb.set_backpressure_generator(p.get("stall", 0.0))
    await tb.harness.reset()
    stats, data, total = await tb.run(program, seed)
    check(data, total, program, n, slots, finals, golden)
    first_in, last_out = tb.harness.counter("ops_first"), tb.harness.counter("results_last")
    logits = sum(bin(op["mask"]).count("1") for op in program if op["opcode"] == OP.LOGIT)
    report(cycles=stats.cycles, beats=len(program), span_cycles=last_out - first_in + 1,
           logits=logits, wall_s=stats.wall_s)


@cocotb.test()
async def programs_match_golden(dut):
    """Several programs in one simulation (``cases``: kind, count, idle, stall, seed and
    a name), a reset before each: every one bit-exact against golden, and attention
    rows with neither idle input nor stalls at full rate (``full_rate_span``)."""
    p = parameters()
    n, slots = p["n"], p["slots"]
    tb = VectorUnitTB(dut, n, slots)
    for case in p["cases"]:
        ties: list[bool] = []
        program, finals, golden = build_program(case["kind"], n, slots, case["seed"],
                                                case["count"], ties)
        tb.set_idle_generator(case["idle"])
        tb.set_backpressure_generator(case["stall"])
        await tb.harness.reset()
        try:
            _, data, total = await tb.run(program, case["seed"])
            check(data, total, program, n, slots, finals, golden)
            if case["kind"] == "attention" and case["idle"] == case["stall"] == 0:
                span = tb.harness.counter("results_last") - tb.harness.counter("ops_first") + 1
                assert span <= full_rate_span(len(program)), \
                    f"{len(program)} beats spanned {span} cycles"
        except AssertionError as failure:
            raise AssertionError(f"case {case['name']} (seed {case['seed']}): "
                                 f"{failure}") from None
        for tied in ties:
            coverage.moe_ties(tied)
    report(cases=len(p["cases"]))


@cocotb.test()
async def reset_mid_program(dut):
    """Reset halfway through a program, then run it again: exact, nothing stale."""
    p = parameters()
    n, slots, seed = p["n"], p["slots"], p["seed"]
    program, _, _ = build_program("random", n, slots, seed, p["count"])
    tb = VectorUnitTB(dut, n, slots)
    tb.set_backpressure_generator(0.3)
    await tb.harness.reset()
    tb.harness.load("ops", pack(program, n, slots))
    tb.harness.expect("results", len(program))
    stats = await tb.harness.run(seed=seed, timeout_cycles=len(program) // 2)
    assert not stats.finished, "finished before the reset could interrupt it"
    await tb.harness.reset()
    _, data, total = await tb.run(program, seed + 1)
    check(data, total, program, n, slots)
