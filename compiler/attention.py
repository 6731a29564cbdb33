"""Attention on one tile: prefill and decode programs for one layer, bit-exact with golden.

The builders turn one attention layer (:class:`AttentionLayer`, usually from a golden
``Workload``) and its int8 tensors into a :class:`compiler.program.TileProgram` whose
output equals ``golden.attention.attention_prefill(..., block_keys=page_size)`` or
``attention_decode`` bit for bit. docs/compiler.md has the memory map, the op sequence
per key block and the synchronisation; in short:

- The query rows are cut into **chunks** of at most ``min(slots, 64)`` rows that share a
  KV head: a decode chunk is a group's query heads at one position; a prefill chunk is
  consecutive tokens of one query head (``causal = 1`` bounds) or, where the VEC bounds
  cannot express that layout's masks (a sliding window with pages not a multiple of N
  keys), a group's heads at one token.
- Each chunk streams its key blocks (one KV page = ``page_size`` keys, golden's
  ``block_keys``) through the FlashAttention-2 step: scores GEMM, LOGIT (running max),
  EXP (alpha), EXP (P, two 7-bit limbs into the scratchpad), one P·V GEMM (its A
  joined from the two limbs, read in step), RESCALE of the accumulator and the
  denominator. Blocks no row can see are skipped. After the last block: RECIP, DIV,
  REQUANT to int8 words.
- Steps are software-pipelined over two buffers (scores, P, P·V): the scores GEMM of
  step i + 1 and the P·V GEMM of step i - 1 run while the vector unit works on step i.
  The builder only orders the operations so; the WAITs between the engines are derived
  from the operations' hazards by :class:`compiler.emit.Emitter`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from itertools import zip_longest

import numpy as np

from compiler.emit import Emitter, MemoryFull, Regions
from compiler.kv import KvLayout, PageAllocator, pack_word
from compiler.program import Op, OutputRows, TileProgram, encode_ops, frozen, summarise
from golden.attention import _multipliers
from golden.exp import NEG_INF, quantize_log2_logit
from golden.vector_model import VectorOpcode as VOP
from spec.config import TileConfig, ceil_div
from spec.isa import (
    BOUND_BITS,
    COUNT_FIELD_BITS,
    MAX_GEMM_DIM,
    DmaTarget,
    Opcode,
    VecDst,
    VecPack,
)
from spec.numerics import NUMERICS

__all__ = [
    "AttentionLayer", "build_decode", "build_prefill", "decode_from_workload",
    "prefill_from_workload",
]

#: Largest rows/beats of a VEC (``spec.isa.COUNT_FIELD_BITS``; the docs say 1..64).
MAX_COUNT = min(64, (1 << COUNT_FIELD_BITS) - 1)
#: Signed range of a VEC key bound.
BOUND_MIN, BOUND_MAX = -(1 << (BOUND_BITS - 1)), (1 << (BOUND_BITS - 1)) - 1
#: Bits per int8 limb (P's two limbs; the base-128 digits of the sink logits).
LIMB_BITS = NUMERICS.limb_bits
#: Longest key block whose P·V (A joined from P's limbs, V int8) cannot wrap int32.
MAX_PV_KEYS = NUMERICS.acc_max // (NUMERICS.attn_p_max * -NUMERICS.operand_min)


@dataclass(frozen=True)
class AttentionLayer:
    """One attention layer as the tile sees it: shapes, mask, sinks, and the integer
    multipliers of golden (``_multipliers``): scores -> log2 logits ``(logit_mult,
    logit_shift)``, normalised output -> int8 ``(out_mult, out_shift)``. ``sinks``: one
    log2-domain sink logit per query head (``quantize_log2_logit``), or None."""

    heads: int
    kv_heads: int
    head_dim: int
    v_head_dim: int
    page_size: int
    window: int | None
    sinks: tuple[int, ...] | None
    logit_mult: int
    logit_shift: int
    out_mult: int
    out_shift: int

    def __post_init__(self) -> None:
        for name in ("heads", "kv_heads", "head_dim", "v_head_dim", "page_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"AttentionLayer: {name} must be >= 1, not "
                                 f"{getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"AttentionLayer: {self.heads} query heads are not a multiple "
                             f"of {self.kv_heads} KV heads")
        if self.window is not None and self.window < 1:
            raise ValueError(f"AttentionLayer: sliding window must be >= 1, not {self.window}")
        if self.sinks is not None and len(self.sinks) != self.heads:
            raise ValueError(f"AttentionLayer: {len(self.sinks)} sinks for {self.heads} heads")

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads // self.kv_heads

    @classmethod
    def from_workload(cls, workload, layer: int) -> AttentionLayer:
        """Layer ``layer`` of a golden ``Workload`` (its scales: one output scale serves
        prefill and decode)."""
        cfg = workload.config
        if not 0 <= layer < len(cfg.windows):
            raise ValueError(f"workload {cfg.name} has attention layers 0..{len(cfg.windows) - 1}")
        (lm, ls), (om, osh) = _multipliers(workload.attention_scales(layer),
                                           cfg.head_dim, NUMERICS)
        sinks = workload.sinks(layer)
        sinks = None if sinks is None else tuple(int(x) for x in quantize_log2_logit(sinks))
        return cls(cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.v_head_dim, cfg.page_size,
                   cfg.windows[layer], sinks, lm, ls, om, osh)


# --- planning: chunks of query rows and their key blocks -----------------------------------

class _Inexpressible(Exception):
    """A block's key masks cannot be written as VEC bounds."""


@dataclass
class _Chunk:
    kv_head: int
    q: np.ndarray  # (rows, head_dim) int8
    positions: np.ndarray  # (rows,) query token index of each row
    targets: list[tuple[int, int]]  # (token, head) of each row's output
    sinks: tuple[int, ...] | None  # per row, log2 domain
    steps: list[_Step] = field(default_factory=list)
    q_addr: int = 0
    out_addr: int = 0
    out_stride: int = 0  # words from one row's outputs to the next row's
    sink_entry: int = 0

    @property
    def rows(self) -> int:
        return len(self.targets)


@dataclass
class _Step:
    block: int
    lo: int
    hi: int
    causal: int


def _visible_intervals(positions: np.ndarray, block: int, ps: int, window: int | None):
    """Per row, the visible keys of the block as [start, end) relative to the block."""
    kb = block * ps
    end = np.clip(positions + 1 - kb, 0, ps)
    start = np.zeros_like(end) if window is None else np.clip(positions - window + 1 - kb, 0, ps)
    empty = end <= start
    return np.where(empty, 0, start), np.where(empty, 0, end)


def _mask(lo: int, hi: int, causal: int, rows: int, lanes: int) -> np.ndarray:
    """The lanes a VEC enables: lo + r·causal <= x < hi + r·causal (spec.isa.VecArgs)."""
    r = np.arange(rows)[:, None] * causal
    x = np.arange(lanes)[None, :]
    return (lo + r <= x) & (x < hi + r)


def _solve_bounds(start: np.ndarray, end: np.ndarray, lanes: int) -> tuple[int, int, int]:
    """(lo, hi, causal) whose lane masks are exactly rows' [start, end); _Inexpressible if
    none is (lanes past the page must stay off, which a causal step cannot always do)."""
    rows = len(start)
    x = np.arange(lanes)[None, :]
    want = (x >= start[:, None]) & (x < end[:, None])
    candidates = []
    if (start == start[0]).all() and (end == end[0]).all():
        candidates.append((int(start[0]), int(end[0]), 0))
    r = np.arange(rows)
    los = sorted({int(x) for x in start - r} | {-rows})
    his = sorted({int(x) for x in end - r} | {lanes})
    candidates += [(lo, hi, 1) for lo in los for hi in his]
    for lo, hi, causal in candidates:
        if BOUND_MIN <= lo <= BOUND_MAX and BOUND_MIN <= hi <= BOUND_MAX and \
                (_mask(lo, hi, causal, rows, lanes) == want).all():
            return lo, hi, causal
    raise _Inexpressible


def _plan_steps(chunk: _Chunk, layer: AttentionLayer, n: int) -> None:
    """The key blocks a chunk must stream (blocks no row sees are skipped), with bounds."""
    ps, w = layer.page_size, layer.window
    lanes = -(-ps // n) * n
    first = 0 if w is None else max(0, int(chunk.positions.min()) - w + 1) // ps
    for block in range(first, int(chunk.positions.max()) // ps + 1):
        start, end = _visible_intervals(chunk.positions, block, ps, w)
        if (end > start).any():
            chunk.steps.append(_Step(block, *_solve_bounds(start, end, lanes)))


def _row_sinks(layer: AttentionLayer, heads) -> tuple[int, ...] | None:
    return None if layer.sinks is None else tuple(layer.sinks[h] for h in heads)


def _decode_chunks(layer: AttentionLayer, q: np.ndarray, context: int, rmax: int):
    chunks = []
    for kvh in range(layer.kv_heads):
        for g0 in range(0, layer.group, rmax):
            heads = range(kvh * layer.group + g0, kvh * layer.group + min(layer.group, g0 + rmax))
            chunks.append(_Chunk(kvh, q[list(heads)], np.full(len(heads), context - 1),
                                 [(0, h) for h in heads], _row_sinks(layer, heads)))
    return chunks


def _prefill_token_chunks(layer: AttentionLayer, q: np.ndarray, rmax: int, n: int,
                          first: int):
    """Consecutive tokens of one head per chunk; ``q``'s rows are the tokens at positions
    ``first``, ``first`` + 1, ... With pages not a multiple of N keys a chunk stays inside
    one page's tokens (so its diagonal block needs no lane past the page)."""
    end, ps = first + q.shape[0], layer.page_size
    if ps % n == 0:
        ranges = [(t, min(t + rmax, end)) for t in range(first, end, rmax)]
    else:
        ranges = [(t, min(t + rmax, b + ps, end))
                  for b in range(first - first % ps, end, ps)
                  for t in range(max(b, first), min(b + ps, end), rmax)]
    chunks = []
    for t0, t1 in ranges:
        for h in range(layer.heads):
            sinks = None if layer.sinks is None else (layer.sinks[h],) * (t1 - t0)
            chunks.append(_Chunk(h // layer.group, q[t0 - first:t1 - first, h],
                                 np.arange(t0, t1), [(t - first, h) for t in range(t0, t1)],
                                 sinks))
    return chunks


def _prefill_head_chunks(layer: AttentionLayer, q: np.ndarray, rmax: int, first: int):
    """A group's query heads at one token per chunk (every row has the same mask)."""
    chunks = []
    for i in range(q.shape[0]):
        for kvh in range(layer.kv_heads):
            for g0 in range(0, layer.group, rmax):
                heads = list(range(kvh * layer.group + g0,
                                   kvh * layer.group + min(layer.group, g0 + rmax)))
                chunks.append(_Chunk(kvh, q[i, heads], np.full(len(heads), first + i),
                                     [(i, h) for h in heads], _row_sinks(layer, heads)))
    return chunks


@dataclass(frozen=True)
class HandOff:
    """Where a program's outputs go when they are done: a DMA of each token's outputs
    (its heads' rows, at the same address) to ``tiles`` (a DMA mask), raising
    ``semaphore`` there; then the program waits for ``incoming`` such arrivals from
    other tiles' programs before it halts, so that every output is in place when the
    round ends. ``region`` (words [lo, hi)) holds every program's outputs: no other
    region of the program is placed there, where the others' arrive. ``stored``: the
    tokens whose outputs go to a memory channel instead ({token: (channel, the word of
    its first head's)}, a STORE each, in that order), for a later round that loads
    them; the program then fences each channel it stored to (a LOAD of no words,
    raising ``semaphore`` here once the channel holds them) and waits for those signals
    too."""

    tiles: int
    semaphore: int
    incoming: int
    region: tuple[int, int]
    stored: dict[int, tuple[int, int]] = field(default_factory=dict)


# --- memory map ------------------------------------------------------------------------------

@dataclass
class _Map:
    """Addresses of every buffer (scratchpad words and accumulator entries). Buffers of
    one key block are indexed [lane][round parity] (``lanes`` x 2); P·V is [lane][parity]
    or, when the accumulator is short, one per lane ([lane][0] for both parities); acc
    and l are one per lane."""

    lanes: int = 1
    pv_double: bool = True
    p_hi: list[list[int]] = field(default_factory=list)
    p_lo: list[list[int]] = field(default_factory=list)
    identity: int = 0
    digits: list[int] = field(default_factory=list)
    scores: list[list[int]] = field(default_factory=list)
    pv: list[list[int]] = field(default_factory=list)
    acc: list[int] = field(default_factory=list)
    m: list[list[int]] = field(default_factory=list)
    alpha: list[list[int]] = field(default_factory=list)
    psum: list[list[int]] = field(default_factory=list)
    l: list[int] = field(default_factory=list)  # noqa: E741 - the denominator's name in golden
    sinks: int = 0
    sink_rows: list[np.ndarray] = field(default_factory=list)
    page_table: int = 0  # a compact program's: one word per (KV head, block)
    spad_words: int = 0
    acc_entries: int = 0


def _sink_digits(rows: list[np.ndarray]) -> list[np.ndarray]:
    """Base-128 digits (top digit signed int8, the others 0..127) of every value of the
    sink constant rows, top first: value = ((d0 << 7) + d1 << 7) + ..., as the GEMM's
    accumulate with acc_shift 7 builds it."""
    values = np.array(rows, np.int64)
    digits = []
    rest = values.copy()
    while True:
        digits.append(rest & 127)
        rest = rest >> 7
        if ((rest >= -128) & (rest <= 127)).all():
            digits.append(rest)
            break
    return digits[::-1]


def _memory_map(config: TileConfig, layer: AttentionLayer, chunks: list[_Chunk],
                lanes: int, pv_double: bool, table_words: int = 0,
                out_at: int | None = None, keep: tuple[int, int] | None = None,
                token_words: int | None = None) -> _Map:
    n, rmax = config.n, max(c.rows for c in chunks)
    nb, dq = ceil_div(layer.page_size, n), ceil_div(layer.head_dim, n)
    dvc = ceil_div(layer.v_head_dim, n)
    # The outputs: from ``out_at`` when given (where another round reads them), output
    # (t, h) at word out_at + t·token_words + h·⌈dv⌉ (by default the tokens one after
    # another); else anywhere, a chunk's rows one after another. No other region in
    # them or in ``keep`` (words [lo, hi) below the KV pages that others' outputs
    # arrive in).
    out_words = dvc * sum(c.rows for c in chunks)
    free = [(0, config.kv_start), (config.kv_end, config.spad_words)]
    if out_at is not None:
        token_words = layer.heads * dvc if token_words is None else token_words
        tokens = 1 + max(t for c in chunks for t, _ in c.targets)
        end = out_at + (tokens - 1) * token_words + layer.heads * dvc
        lo, hi = keep or (out_at, end)
        if not 0 <= lo <= out_at <= end <= hi <= config.kv_start:
            raise ValueError(f"the outputs' words {out_at}..{end - 1} are not within "
                             f"words {lo}..{hi - 1}, below the KV pages (word "
                             f"{config.kv_start})")
        free = [(0, lo), (hi, config.kv_start), free[1]]
    # The scratchpad outside the KV region; GEMM A operands (queries, P's high limbs)
    # start in bank banks / 2, half the banks away from every KV page (pages start in bank
    # 0), and P's low limbs, read in step with the high ones, in bank 3·banks / 4 (the A/B
    # skew measured 2 000 cycles faster per decode token at context 1025 on gpt-oss).
    spad = Regions(free, "scratchpad", "attention", banks=config.banks)
    acc = Regions([(0, config.acc_depth)], "accumulator memory", "attention")
    mp = _Map(lanes=lanes, pv_double=pv_double)
    a_bank = config.banks // 2
    for c in chunks:
        c.q_addr = spad.take(dq * c.rows, "the queries", bank=a_bank)
    if out_at is None:
        at = spad.take(out_words, "the outputs")
        for c in chunks:
            c.out_addr, c.out_stride, at = at, dvc, at + dvc * c.rows
    else:
        for c in chunks:
            places = [out_at + t * token_words + h * dvc for t, h in c.targets]
            c.out_addr = places[0]
            c.out_stride = places[1] - places[0] if c.rows > 1 else dvc
            evenly = places == [c.out_addr + r * c.out_stride for r in range(c.rows)]
            if not evenly or not 0 < c.out_stride < 1 << COUNT_FIELD_BITS:  # dst_stride
                raise ValueError(f"the outputs of a chunk of {c.rows} rows are not rows "
                                 f"1..{(1 << COUNT_FIELD_BITS) - 1} words apart from word "
                                 f"{out_at} ({token_words} words a token)")

    def per_block(take, size: int, what: str, double: bool = True) -> list[list[int]]:
        """[lane][parity] regions (one per lane, used for both parities, if not double)."""
        regions = []
        for _ in range(lanes):
            first = take(size, what)
            regions.append([first, take(size, what) if double else first])
        return regions

    mp.p_hi = per_block(partial(spad.take, bank=a_bank), nb * rmax, "P (high limb)")
    mp.p_lo = per_block(partial(spad.take, bank=a_bank + config.banks // 4), nb * rmax,
                        "P (low limb)")

    take = acc.take
    tile_rows, scalar = ceil_div(rmax, n) * n, ceil_div(rmax, n)
    mp.scores = per_block(take, tile_rows * nb, "scores")
    mp.pv = per_block(take, tile_rows * dvc, "P·V", pv_double)
    mp.acc = [take(tile_rows * dvc, "the output accumulator") for _ in range(lanes)]
    mp.m = per_block(take, scalar, "the running max")
    mp.alpha = per_block(take, scalar, "alpha")
    mp.psum = per_block(take, scalar, "sum P")
    mp.l = [take(scalar, "the denominator") for _ in range(lanes)]
    if layer.sinks is not None:
        # One scalar region per distinct row pattern of sink logits (the initial max).
        seen: dict[tuple[int, ...], int] = {}
        for c in chunks:
            if c.sinks not in seen:
                seen[c.sinks] = len(mp.sink_rows)
                for e in range(ceil_div(c.rows, n)):
                    lane = np.zeros(n, np.int64)
                    part = c.sinks[e * n:(e + 1) * n]
                    lane[:len(part)] = part
                    mp.sink_rows.append(lane)
            c.sink_entry = seen[c.sinks]
        count = len(mp.sink_rows)
        if count > MAX_GEMM_DIM:
            raise ValueError(f"{count} sink constant entries exceed a GEMM's 12-bit m")
        mp.sinks = take(ceil_div(count, n) * n, "the sink constants")
        for c in chunks:
            c.sink_entry += mp.sinks
        mp.identity = spad.take(ceil_div(count, n) * count, "the identity for the constants")
        mp.digits = [spad.take(count, "the sink constant digits")
                     for _ in _sink_digits(mp.sink_rows)]
    if table_words:
        mp.page_table = spad.take(table_words, "the page table")
    mp.spad_words, mp.acc_entries = spad.used, acc.used
    return mp


# --- emission --------------------------------------------------------------------------------

class _Pipeline:
    """The program of a chunk list, stage by stage (docs/compiler.md, "Synchronisation and
    overlap"). A GEMM reading a KV page is emitted with the KV region's first word and
    listed in ``pages`` (the builder puts the page's address in). Each
    ``lane_steps[g][r]`` is lane g's key block of round r: (chunk, step, first, last)."""

    def __init__(self, config: TileConfig, layer: AttentionLayer, chunks: list[_Chunk],
                 mp: _Map, hand_off: HandOff | None = None):
        self.n, self.layer, self.mp, self.kv_start = config.n, layer, mp, config.kv_start
        self.chunks, self.hand_off = chunks, hand_off
        self.nb = ceil_div(layer.page_size, config.n)
        self.dvc = ceil_div(layer.v_head_dim, config.n)
        self.e = Emitter(config.n)
        self.lane_steps = _lane_steps(chunks, mp.lanes)
        self.rounds = max(len(steps) for steps in self.lane_steps)
        self.members = [[g for g, steps in enumerate(self.lane_steps) if r < len(steps)]
                        for r in range(self.rounds)]
        self.running_max: list[int | None] = [None] * mp.lanes  # each lane's current m
        # For :func:`_compact`: the KV page each GEMM reads, {op index: (kv_head, K 0 or
        # V 1, logical page)}, and the index of each round's first op (then the end).
        self.pages: dict[int, tuple[int, int, int]] = {}
        self.bounds: list[int] = []

    def program(self) -> list[Op]:
        """The whole program. Per round r, in program order, over the round's lanes,
        alternating: VEC softmax(r) | GEMM S(r+1) | VEC rescale(r-1) | GEMM PV(r); the
        emitter adds the WAITs."""
        self.sink_constants()
        members = self.members
        for g in members[0]:
            self.scores_gemm(g, 0)
        for r in range(self.rounds):
            self.bounds.append(len(self.e.ops))
            self.interleaved([self.softmax_ops(g, r) for g in members[r]])
            for g in members[r + 1] if r + 1 < self.rounds else []:
                self.scores_gemm(g, r + 1)
            if r:
                self.rescale(r - 1)
            for g in members[r]:
                self.pv_gemm(g, r)
        self.bounds.append(len(self.e.ops))
        self.rescale(self.rounds - 1)
        if self.hand_off is not None:  # a DMA of each token's outputs (its heads')
            h, e = self.hand_off, self.e
            tokens: dict[int, list[int]] = {}
            for c in self.chunks:
                for r, (t, _) in enumerate(c.targets):
                    tokens.setdefault(t, []).append(c.out_addr + r * c.out_stride)
            # Over the mesh first, then the stores in the order ``stored`` gives.
            order = [t for t in sorted(tokens) if t not in h.stored] + list(h.stored)
            for t in order:
                rows = tokens[t]
                start = min(rows)
                assert sorted(rows) == list(range(start, start + len(rows) * self.dvc,
                                                  self.dvc)), "a token's outputs are apart"
                if t in h.stored:
                    channel, word = h.stored[t]
                    e.dma(src=start, length=self.dvc * len(rows), target=DmaTarget.STORE,
                          channel=channel, mem_addr=word)
                else:
                    e.dma(src=start, dst=start, length=self.dvc * len(rows), tiles=h.tiles,
                          remote_signal=1, remote_semaphore=h.semaphore)
            fenced = sorted({channel for channel, _ in h.stored.values()})
            for channel in fenced:
                e.dma(dst=0, length=0, target=DmaTarget.LOAD, channel=channel, remote_signal=1,
                      remote_semaphore=h.semaphore)
            e.wait_arrivals(h.semaphore, h.incoming + len(fenced))
        return self.e.halt()

    def sink_constants(self) -> None:
        """The sink logits (each chunk's initial running max) built in the accumulator by
        an identity GEMM per base-128 digit."""
        mp = self.mp
        if mp.sink_rows:
            count = len(mp.sink_rows)
            for i, base in enumerate(mp.digits):
                self.e.gemm(a=mp.identity, b=base, c=mp.sinks, m=count, k=count, p=self.n,
                            a_rows=1, b_rows=0, accumulate=int(i > 0),
                            acc_shift=LIMB_BITS if i else 0)

    def scores_gemm(self, g: int, r: int) -> None:
        c, s, _, _ = self.lane_steps[g][r]
        i = self.e.gemm(a=c.q_addr, b=self.kv_start,
                        c=self.mp.scores[g][r % 2], m=c.rows, k=self.layer.head_dim,
                        p=self.layer.page_size, a_rows=1, b_rows=1)
        self.pages[i] = (c.kv_head, 0, s.block)

    def softmax_ops(self, g: int, r: int) -> list:
        """Ops 2-5 of the block as emitters."""
        e, mp, layer, nb = self.e, self.mp, self.layer, self.nb
        c, s, first, _ = self.lane_steps[g][r]
        rows, buf = c.rows, r % 2
        bounds = {"lo": s.lo, "hi": s.hi, "causal": s.causal}
        m_new, scores = mp.m[g][buf], mp.scores[g][buf]
        # m_old: the sink logits (an entry) or -inf (an immediate) at a chunk's start.
        m_old = (None if layer.sinks is None else c.sink_entry) if first else self.running_max[g]
        self.running_max[g] = m_new

        def logit() -> None:
            # 1. logits in place of the scores; the running max from m_old into m_new.
            e.vec(VOP.LOGIT, rows, nb, scores,
                  **({"imm": NEG_INF} if m_old is None else {"c": m_old}),
                  mult=layer.logit_mult, shift=layer.logit_shift, dst=scores,
                  dst_kind=VecDst.TILE, total=m_new, total_write=1, **bounds)

        def alpha() -> None:
            # 2. alpha = exp2(m_old - m_new) in Q1.15 (not needed when the state is
            #    empty: the first RESCALE then ignores it).
            e.vec(VOP.EXP, rows, 1, m_old, a_scalar=1, c=m_new,
                  shift=NUMERICS.exp_table_frac_bits, dst=mp.alpha[g][buf],
                  dst_kind=VecDst.SCALAR, lo=0, hi=1)

        def p_limb(pack: VecPack, dst: int) -> None:
            # 3. P = exp2(x - m_new) in Q0.14, saturated; its high then low 7-bit limb
            #    into the scratchpad in the a_rows layout; sum P from the first pass.
            hi = pack == VecPack.LIMB_HI
            e.vec(VOP.EXP, rows, nb, scores, c=m_new, shift=NUMERICS.attn_p_bits, sat=1,
                  dst=dst, dst_kind=VecDst.SPAD, pack=pack, total=mp.psum[g][buf],
                  total_write=int(hi), **bounds)

        return [logit, *([alpha] if m_old is not None else []),
                lambda: p_limb(VecPack.LIMB_HI, mp.p_hi[g][buf]),
                lambda: p_limb(VecPack.LIMB_LO, mp.p_lo[g][buf])]

    def pv_gemm(self, g: int, r: int) -> None:
        # One pass: A joined from P's two limbs (hi·2⁷ + lo <= 2¹⁴ - 1), so a key adds at
        # most 2²¹ to an int32 sum: exact for pages of up to MAX_PV_KEYS (_check_fit).
        c, s, _, _ = self.lane_steps[g][r]
        mp = self.mp
        i = self.e.gemm(a=mp.p_hi[g][r % 2], a_lo=mp.p_lo[g][r % 2], a_limbs=1,
                        b=self.kv_start, c=mp.pv[g][r % 2],
                        m=c.rows, k=self.layer.page_size, p=self.layer.v_head_dim,
                        a_rows=1, b_rows=0)
        self.pages[i] = (c.kv_head, 1, s.block)

    def rescale_ops(self, g: int, r: int) -> tuple[list, list]:
        """Ops 8-9 of the block, and the chunk's end (if it is the last), as emitters."""
        e, mp, layer, n, dvc = self.e, self.mp, self.layer, self.n, self.dvc
        c, _, first, last = self.lane_steps[g][r]
        rows, buf, acc, ell = c.rows, r % 2, mp.acc[g], mp.l[g]
        pv, alpha, psum = mp.pv[g][buf], mp.alpha[g][buf], mp.psum[g][buf]
        if first:  # acc = P·V; l = l0·alpha + sum P (l0 = the sink's 2^14 - 1, or 0)
            l0 = 0 if layer.sinks is None else NUMERICS.attn_p_max
            ops = [lambda: e.vec(VOP.RESCALE, rows, dvc, pv, imm=0, dst=acc,
                                 dst_kind=VecDst.TILE, lo=0, hi=dvc * n),
                   lambda: e.vec(VOP.RESCALE, rows, 1, alpha if l0 else psum, a_scalar=1,
                                 b=psum, b_scalar=1, imm=l0, dst=ell,
                                 dst_kind=VecDst.SCALAR, lo=0, hi=1)]
        else:  # acc = acc·alpha + P·V; l = l·alpha + sum P (in place)
            ops = [lambda: e.vec(VOP.RESCALE, rows, dvc, acc, b=pv, b_scalar=0, c=alpha,
                                 dst=acc, dst_kind=VecDst.TILE, lo=0, hi=dvc * n),
                   lambda: e.vec(VOP.RESCALE, rows, 1, ell, a_scalar=1, b=psum, b_scalar=1,
                                 c=alpha, dst=ell, dst_kind=VecDst.SCALAR, lo=0, hi=1)]
        end = []
        if last:  # o = acc / l in Q.16, then int8 into the scratchpad

            def divide() -> None:
                # 1/l goes through the rows' slots, which every lane uses: RECIP and its
                # DIV stay adjacent.
                e.vec(VOP.RECIP, rows, 1, ell, a_scalar=1, c=ell, dst_kind=VecDst.NONE,
                      lo=0, hi=1)
                e.vec(VOP.DIV, rows, dvc, acc, shift=NUMERICS.attn_out_frac_bits, dst=acc,
                      dst_kind=VecDst.TILE, lo=0, hi=dvc * n)

            end = [divide,
                   lambda: e.vec(VOP.REQUANT, rows, dvc, acc, mult=layer.out_mult,
                                 shift=layer.out_shift, dst=c.out_addr, dst_kind=VecDst.SPAD,
                                 dst_stride=c.out_stride,
                                 pack=VecPack.BYTE, lo=0, hi=layer.v_head_dim)]
        return ops, end

    @staticmethod
    def interleaved(per_lane: list[list]) -> None:
        """The lanes' ops alternately (consecutive VEC instructions independent)."""
        for ops in zip_longest(*per_lane):
            for op in ops:
                if op is not None:
                    op()

    def rescale(self, r: int) -> None:
        """Round r's ops 8-9, then its chunk ends, over its lanes, alternating."""
        ops, ends = zip(*(self.rescale_ops(g, r) for g in self.members[r]), strict=True)
        self.interleaved(list(ops))
        self.interleaved(list(ends))


def _emit(config: TileConfig, layer: AttentionLayer, chunks: list[_Chunk],
          mp: _Map, hand_off: HandOff | None = None) -> tuple[list[Op], _Pipeline]:
    """The whole program, straight-line (KV pages not yet in), and the pipeline that
    emitted it."""
    pipeline = _Pipeline(config, layer, chunks, mp, hand_off)
    return pipeline.program(), pipeline


# --- compact programs: loops over key blocks ---------------------------------------------

#: Registers of the loops :func:`_compact` makes: the trip counter and its limit, the
#: page table's offset (two blocks per trip) and the page address loaded for one GEMM.
R_TRIP, R_LIMIT, R_OFFSET, R_PAGE = 0, 1, 2, 3


def _key(op: Op, paged: bool) -> tuple:
    """What two instructions must share to be one instruction of a loop body: all
    fields but a KV page's address (looked up in the page table at run time)."""
    opcode, fields = op
    return opcode, paged, frozen({k: v for k, v in fields.items() if not (paged and k == "b")})


def _compact(ops: list[Op], pipeline: _Pipeline, page_word) -> list[Op]:
    """``ops`` with every run of identical pairs of rounds (the steady state of a chunk:
    same instructions, WAITs included, each KV page two blocks on) made a loop. A GEMM
    of the body reads its page's address from the page table (``page_word(kv_head,
    block)``: the word whose bytes 0-1 hold the block's K page address and bytes 2-3
    its V page address): WITH offset, LOAD (unless the GEMM before read the same
    page), WITH, GEMM. The loop runs the very instructions ``ops`` lists, in the same
    order, so it is synchronised exactly as they are; the program's length no longer
    grows with the key blocks."""
    pages, bounds = pipeline.pages, pipeline.bounds
    rounds = len(bounds) - 1
    keys = [_key(op, i in pages) for i, op in enumerate(ops)]

    def same(r: int, j: int) -> bool:
        """Is round pair r + 2j the pair at r again, every page two blocks on per j?"""
        a, b = bounds[r], bounds[r + 2 * j]
        if bounds[r + 2] - a != bounds[r + 2 * j + 2] - b or \
                keys[a:bounds[r + 2]] != keys[b:bounds[r + 2 * j + 2]]:
            return False
        for i in range(a, bounds[r + 2]):
            if i in pages:
                kv_head, which, block = pages[i]
                if pages[i - a + b] != (kv_head, which, block + 2 * j):
                    return False
        return True

    out = list(ops[:bounds[0]])
    r = 0
    while r < rounds:
        trips = 1
        while r + 2 * trips + 1 < rounds and same(r, trips):
            trips += 1
        body: list[Op] = []
        loaded = None  # the page whose address R_PAGE holds
        for i in range(bounds[r], bounds[r + 2]) if trips > 1 else ():
            opcode, fields = ops[i]
            if i in pages:
                kv_head, which, block = pages[i]
                if loaded != pages[i]:
                    body += [(Opcode.WITH, {"field0": 1, "reg0": R_OFFSET}),
                             (Opcode.LOAD, {"rd": R_PAGE, "lane": 2 * which,
                                            "addr": page_word(kv_head, block)})]
                    loaded = pages[i]
                body += [(Opcode.WITH, {"field0": 2, "reg0": R_PAGE}),
                         (opcode, {**fields, "b": 0})]
            else:
                body.append(ops[i])
        # SET x 3, the body, ADD, LOOP: fewer words than the pairs unrolled?
        if trips < 2 or len(body) + 5 >= bounds[r + 2 * trips] - bounds[r]:
            out += ops[bounds[r]:bounds[r + 1]]
            r += 1
            continue
        out += [(Opcode.SET, {"rd": R_TRIP, "value": 0}),
                (Opcode.SET, {"rd": R_LIMIT, "value": trips}),
                (Opcode.SET, {"rd": R_OFFSET, "value": 0})]
        start = len(out)
        out += body
        out += [(Opcode.ADD, {"rd": R_OFFSET, "ra": R_OFFSET, "imm": 2}),
                (Opcode.LOOP, {"counter": R_TRIP, "limit": R_LIMIT, "target": start,
                               "bound": trips})]
        r += 2 * trips
    return out + list(ops[bounds[rounds]:])


def _lane_steps(chunks: list[_Chunk], lanes: int) -> list[list[tuple]]:
    """Each lane's key blocks (chunk, step, first, last), chunks given in order to the
    lane with the fewest blocks so far."""
    steps: list[list[tuple]] = [[] for _ in range(lanes)]
    for c in chunks:
        g = min(range(lanes), key=lambda x: len(steps[x]))
        steps[g] += [(c, s, k == 0, k == len(c.steps) - 1) for k, s in enumerate(c.steps)]
    return [x for x in steps if x]


# --- the builders ---------------------------------------------------------------------------

def _check_int8(name: str, x, shape: tuple[int, ...]) -> np.ndarray:
    x = np.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {x.shape}")
    if x.dtype != np.int8:
        raise ValueError(f"{name} must be int8, got {x.dtype}")
    return x


def _check_fit(config: TileConfig, layer: AttentionLayer) -> int:
    """Refuse a layer the tile cannot run; return the rows per chunk."""
    n = config.n
    if layer.page_size != config.page_size:
        raise ValueError(f"the layer streams {layer.page_size}-key blocks but the tile's KV "
                         f"pages hold page_size = {config.page_size} tokens")
    for name, count in (("page_size", ceil_div(layer.page_size, n)),
                        ("v_head_dim", ceil_div(layer.v_head_dim, n))):
        if count > MAX_COUNT:
            raise ValueError(f"{name} {getattr(layer, name)} needs {count} beats of "
                             f"{n} lanes; a VEC has at most {MAX_COUNT}")
    for name in ("head_dim", "v_head_dim", "page_size"):
        if getattr(layer, name) > MAX_GEMM_DIM:
            raise ValueError(f"{name} {getattr(layer, name)} exceeds a GEMM's 12-bit field")
    if layer.page_size > MAX_PV_KEYS:
        raise ValueError(f"page_size {layer.page_size}: a P·V GEMM sums at most "
                         f"{MAX_PV_KEYS} keys without wrapping int32")
    if layer.page_size > -BOUND_MIN:
        raise ValueError(f"page_size {layer.page_size} exceeds the VEC key bounds "
                         f"({BOUND_BITS}-bit signed)")
    return min(config.slots, MAX_COUNT)


def _fewer_rows(rows: int, n: int) -> int:
    """The next smaller chunk height tried when the accumulator is full: multiples of N,
    then halves."""
    return (rows - 1) // n * n if rows > n else rows // 2


def _build(config: TileConfig, layer: AttentionLayer, kind: str, plan,
           k: np.ndarray, v: np.ndarray, output_shape: tuple[int, ...],
           allocator: PageAllocator | None, first_row: int, loops: bool | None,
           out_at: int | None = None, hand_off: HandOff | None = None,
           token_words: int | None = None) -> TileProgram:
    """``plan(rows)``: the chunks (with their steps) for chunks of at most ``rows`` rows.
    Chunks get as many rows as the slots allow, fewer if their buffers do not fit the
    accumulator memory. ``out_at``, ``token_words``: where the outputs go
    (:func:`_memory_map`)."""
    n = config.n
    dq, dvc = ceil_div(layer.head_dim, n), ceil_div(layer.v_head_dim, n)
    rows = _check_fit(config, layer)
    keep = None if hand_off is None else hand_off.region
    mp = None
    while mp is None:
        chunks = plan(rows)
        # Two lanes (chunks interleaved block by block) if there are two chunks and
        # their buffers fit, P·V double-buffered or one per lane; else one lane.
        layouts = [(2, True), (2, False)] if len(chunks) > 1 else []
        for lanes, pv_double in layouts + [(1, True)]:
            try:
                mp = _memory_map(config, layer, chunks, lanes, pv_double, out_at=out_at,
                                 keep=keep, token_words=token_words)
                break
            except MemoryFull as error:
                if lanes == 1 and error.memory == "scratchpad":
                    raise
                failure = error
        if mp is None:
            if _fewer_rows(rows, n) < 1:
                raise ValueError(f"{failure} (with chunks of a single query row)") from None
            rows = _fewer_rows(rows, n)
    # The program has its length before any KV page is taken from the allocator (engines
    # only read KV pages, so their addresses change no WAIT); a program longer than the
    # program memory (or any, with ``loops``) is made compact.
    straight, pipeline = _emit(config, layer, chunks, mp, hand_off)
    looped = len(straight) > config.program_depth if loops is None else loops
    length = len(_compact(straight, pipeline, lambda *_: 0) if looped else straight)
    if length > config.program_depth:
        steps = sum(len(c.steps) for c in chunks)
        how = (f"with loops over key blocks ({len(chunks)} chunks of query rows, {steps} "
               f"key blocks, {len(straight)} unrolled); fewer query tokens per program "
               "(a shorter prefill chunk) make it shorter" if looped else
               f"({len(chunks)} chunks, {steps} key blocks)")
        raise ValueError(f"the {kind} program needs {length} instructions {how}, but the "
                         f"program memory holds program_depth = {config.program_depth}")
    blocks = ceil_div(k.shape[0], layer.page_size)
    if looped:  # the page table after every other region: their addresses stay
        mp = _memory_map(config, layer, chunks, mp.lanes, mp.pv_double,
                         table_words=layer.kv_heads * blocks, out_at=out_at, keep=keep,
                         token_words=token_words)
    allocator = PageAllocator(config) if allocator is None else allocator
    kv = KvLayout.allocate(config, allocator, layer.kv_heads, layer.head_dim,
                           layer.v_head_dim, k.shape[0], first_row)
    for i, page in pipeline.pages.items():
        opcode, fields = straight[i]
        straight[i] = (opcode, {**fields, "b": kv.page_base(*page)})
    ops = (_compact(straight, pipeline, lambda h, b: mp.page_table + h * blocks + b)
           if looped else straight)
    assert len(ops) == length

    writes: dict[int, int] = {}
    for c in chunks:
        for cc in range(dq):
            for i in range(c.rows):
                writes[c.q_addr + cc * c.rows + i] = pack_word(c.q[i, cc * n:(cc + 1) * n], n)
    if looped:
        for h in range(layer.kv_heads):
            for b in range(blocks):
                writes[mp.page_table + h * blocks + b] = (kv.page_base(h, 0, b)
                                                          | kv.page_base(h, 1, b) << 16)
    if mp.sink_rows:
        count = len(mp.sink_rows)
        for cc in range(ceil_div(count, n)):
            for i in range(count):
                lanes = [int(cc * n + x == i) for x in range(n)]
                writes[mp.identity + cc * count + i] = pack_word(lanes, n)
        for base, digit in zip(mp.digits, _sink_digits(mp.sink_rows), strict=True):
            for e_ in range(count):
                writes[base + e_] = pack_word(digit[e_], n)

    out_words = [c.out_addr + r * c.out_stride + j for c in chunks for r in range(c.rows)
                 for j in range(dvc)]
    dv = layer.v_head_dim

    reader = OutputRows(output_shape, n, dv, [
        ((t, h), [c.out_addr + r * c.out_stride + j for j in range(dvc)])
        for c in chunks for r, (t, h) in enumerate(c.targets)])

    steps = sum(len(c.steps) for c in chunks)
    summary = summarise(config, ops, mp.spad_words, mp.acc_entries,
                        {"chunks": len(chunks), "key_blocks": steps, "lanes": mp.lanes,
                         "pv_double": int(mp.pv_double),
                         "rows_per_chunk": max(c.rows for c in chunks),
                         "causal_chunks": sum(any(s.causal for s in c.steps) for c in chunks),
                         "loops": sum(op == Opcode.LOOP for op, _ in ops),
                         "unrolled": len(straight)},
                        executed=straight)
    return TileProgram(config, kind, encode_ops(ops), ops, writes, kv, kv.map_requests(),
                       kv.appends(k, v), kv.placement(k, v), out_words, output_shape,
                       summary, reader)


def build_prefill(config: TileConfig, layer: AttentionLayer, q, k, v, *,
                  allocator: PageAllocator | None = None, first_row: int = 0,
                  loops: bool | None = None) -> TileProgram:
    """Causal self-attention of T prompt tokens: ``q`` (T, H, d), ``k`` (T, H_kv, d),
    ``v`` (T, H_kv, dv) int8; the output (T, H, dv) equals
    ``attention_prefill(..., block_keys=page_size)``. The host appends all T tokens'
    K and V (``kv_map``, ``kv_appends``) before ``start``."""
    return build_extend(config, layer, q, k, v, allocator=allocator, first_row=first_row,
                        loops=loops)


def build_extend(config: TileConfig, layer: AttentionLayer, q, k, v, *,
                 allocator: PageAllocator | None = None, first_row: int = 0,
                 loops: bool | None = None, out_at: int | None = None,
                 token_words: int | None = None,
                 hand_off: HandOff | None = None) -> TileProgram:
    """Chunked prefill over a cached context: the last T of L tokens attend to all L.
    ``q`` (T, H, d) the queries of positions L - T .. L - 1; ``k`` (L, H_kv, d) and ``v``
    (L, H_kv, dv) every token so far. The output (T, H, dv) equals rows L - T .. L - 1 of
    ``attention_prefill`` of all L tokens (``block_keys=page_size``); with T = L it is
    :func:`build_prefill`. The host appends the tokens the cache does not hold yet
    (``kv_appends`` lists all L; a caller that kept the cache sends only the new ones).
    With ``out_at``, output (t, h) is at word ``out_at + t·token_words + h·⌈dv⌉``
    (default ``token_words``: H·⌈dv⌉, token after token), handed to other tiles as
    ``hand_off`` says."""
    q = np.asarray(q)
    tokens = q.shape[0] if q.ndim == 3 else 0
    if tokens < 1:
        raise ValueError(f"q must be (tokens >= 1, {layer.heads}, {layer.head_dim}), got "
                         f"{q.shape}")
    q = _check_int8("q", q, (tokens, layer.heads, layer.head_dim))
    context = np.asarray(k).shape[0] if np.asarray(k).ndim == 3 else 0
    if context < tokens:
        raise ValueError(f"k holds {context} tokens, fewer than the {tokens} queries")
    k = _check_int8("k", k, (context, layer.kv_heads, layer.head_dim))
    v = _check_int8("v", v, (context, layer.kv_heads, layer.v_head_dim))
    first = context - tokens

    def plan(rows: int) -> list[_Chunk]:
        try:
            chunks = _prefill_token_chunks(layer, q, rows, config.n, first)
            for c in chunks:
                _plan_steps(c, layer, config.n)
        except _Inexpressible:
            chunks = _prefill_head_chunks(layer, q, rows, first)
            for c in chunks:
                _plan_steps(c, layer, config.n)  # every row of a chunk has the same mask
        return chunks

    return _build(config, layer, "prefill" if first == 0 else "extend", plan, k, v,
                  (tokens, layer.heads, layer.v_head_dim), allocator, first_row, loops,
                  out_at, hand_off, token_words)


def build_decode(config: TileConfig, layer: AttentionLayer, q, k, v, *,
                 allocator: PageAllocator | None = None, first_row: int = 0,
                 loops: bool | None = None, out_at: int | None = None,
                 hand_off: HandOff | None = None) -> TileProgram:
    """One decode step of one sequence at context L: ``q`` (H, d) or (1, H, d), the
    newest token at position L - 1; ``k`` (L, H_kv, d) and ``v`` (L, H_kv, dv) every
    token so far (its own included). The output (1, H, dv) equals ``attention_decode``
    for that sequence; its rows (a head's ⌈dv⌉ words each) from word ``out_at`` when
    given, and handed to other tiles as ``hand_off`` says."""
    q = np.asarray(q)
    if q.ndim == 3 and q.shape[0] == 1:
        q = q[0]
    q = _check_int8("q", q, (layer.heads, layer.head_dim))
    k = np.asarray(k)
    context = k.shape[0] if k.ndim == 3 else 0
    if context < 1:
        raise ValueError(f"k must be (context >= 1, {layer.kv_heads}, {layer.head_dim}), got "
                         f"{k.shape}")
    k = _check_int8("k", k, (context, layer.kv_heads, layer.head_dim))
    v = _check_int8("v", v, (context, layer.kv_heads, layer.v_head_dim))

    def plan(rows: int) -> list[_Chunk]:
        chunks = _decode_chunks(layer, q, context, rows)
        for c in chunks:
            _plan_steps(c, layer, config.n)  # rows share one position: always expressible
        return chunks

    return _build(config, layer, "decode", plan, k, v, (1, layer.heads, layer.v_head_dim),
                  allocator, first_row, loops, out_at, hand_off)


def prefill_from_workload(config: TileConfig, workload, layer: int, tokens: int | None = None,
                          **kwargs) -> TileProgram:
    """:func:`build_prefill` of the workload's first ``tokens`` prompt tokens (all by
    default) of attention layer ``layer``."""
    p = f"attn{layer}."
    t = workload.tensors
    tokens = t[p + "q_prefill"].shape[0] if tokens is None else tokens
    return build_prefill(config, AttentionLayer.from_workload(workload, layer),
                         t[p + "q_prefill"][:tokens], t[p + "k_prefill"][:tokens],
                         t[p + "v_prefill"][:tokens], **kwargs)


def decode_from_workload(config: TileConfig, workload, layer: int, sequence: int = 0,
                         **kwargs) -> TileProgram:
    """:func:`build_decode` of decode sequence ``sequence`` of the workload (its context
    length and KV read from the workload's paged cache)."""
    from golden.kv_cache import PagedKVCache, gather

    p = f"attn{layer}."
    t = workload.tensors
    cache = PagedKVCache(t[p + "k_pages"], t[p + "v_pages"])
    context = int(t[p + "context_lens"][sequence])
    k, v = gather(cache, t[p + "block_table"][sequence:sequence + 1])
    return build_decode(config, AttentionLayer.from_workload(workload, layer),
                        t[p + "q_decode"][sequence], k[0, :context], v[0, :context], **kwargs)
