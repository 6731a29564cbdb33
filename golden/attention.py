"""Attention: prefill with a causal mask and decode against a paged KV cache.

Multi-head, grouped-query and multi-query (query head h reads KV head ``h // (H / H_kv)``),
an optional per-head sink logit (joins the softmax denominator only, GPT-OSS style) and an
optional sliding window (key j is visible from query i iff ``i - window < j <= i``).
Integer models are bit-exact with the RTL; ``*_float`` twins compute the ideal math in
float64 on the same dequantised int8 inputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from golden.exp import LOG2E, logit_multiplier, quantize_log2_logit, to_log2_domain
from golden.gemm import HEADROOM_LSB, Saturation, quantize_multiplier, wrap
from golden.kv_cache import PagedKVCache, check_block_table, gather
from golden.softmax import exact_matmul, normalise_output, online_softmax_pv
from spec.numerics import NUMERICS, Numerics

#: Query rows per prefill chunk (bounds memory; rows are independent, so results do not change).
PREFILL_CHUNK = 128


@dataclass(frozen=True)
class AttentionScales:
    """Quantisation scales (real value = int8 code x scale) and the softmax scale."""

    q: float
    k: float
    v: float
    out: float
    #: Multiplies q.k before the softmax; None means 1/sqrt(head_dim).
    softmax_scale: float | None = None

    def __post_init__(self) -> None:
        for name in ("q", "k", "v", "out"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"scale {name} must be positive and finite, got {value}")

    def softmax(self, head_dim: int) -> float:
        return self.softmax_scale if self.softmax_scale is not None else head_dim**-0.5


def _check_int8(name: str, x: np.ndarray, ndim: int) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name} must not be empty, got shape {x.shape}")
    if x.dtype != np.int8:
        raise ValueError(f"{name} must be int8, got {x.dtype}")
    return x


def _check_heads(heads: int, kv_heads: int) -> int:
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads")
    return heads // kv_heads


def _check_sinks(sinks: np.ndarray | None, heads: int) -> np.ndarray | None:
    if sinks is None:
        return None
    sinks = np.asarray(sinks, dtype=np.float64)
    if sinks.shape != (heads,):
        raise ValueError(f"sinks must hold one logit per query head ({heads},), got {sinks.shape}")
    if not np.isfinite(sinks).all():
        raise ValueError("sinks must be finite")
    return sinks


def _check_window(window: int | None) -> None:
    if window is not None and window < 1:
        raise ValueError(f"sliding window must be >= 1 token, got {window}")


def _multipliers(
    scales: AttentionScales, head_dim: int, numerics: Numerics
) -> tuple[tuple[int, int], tuple[int, int]]:
    logit_scale = (
        scales.q * scales.k * scales.softmax(head_dim) * LOG2E * (1 << numerics.exp_frac_bits)
    )
    out_scale = scales.v / scales.out / (1 << numerics.attn_out_frac_bits)
    return logit_multiplier(logit_scale, numerics), quantize_multiplier(out_scale, numerics)


def _check_first(first: int, tokens: int) -> None:
    if not 0 <= first < tokens:
        raise ValueError(f"first output row {first} outside the {tokens} query rows")


def _visible(q_pos: np.ndarray, k_pos: np.ndarray, window: int | None) -> np.ndarray:
    visible = k_pos <= q_pos
    if window is not None:
        visible &= k_pos > q_pos - window
    return visible


def _check_prefill(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    q = _check_int8("q", q, 3)
    k = _check_int8("k", k, 3)
    v = _check_int8("v", v, 3)
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"q {q.shape}, k {k.shape} and v {v.shape} differ in token count")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q head_dim {q.shape[2]} differs from k head_dim {k.shape[2]}")
    if k.shape[1] != v.shape[1]:
        raise ValueError(f"k has {k.shape[1]} KV heads but v has {v.shape[1]}")
    return q, k, v, _check_heads(q.shape[1], k.shape[1])


def attention_prefill(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scales: AttentionScales,
    *,
    window: int | None = None,
    sinks: np.ndarray | None = None,
    block_keys: int = 16,
    first: int = 0,
    numerics: Numerics = NUMERICS,
    saturation: Saturation | None = None,
) -> np.ndarray:
    """Causal self-attention of T tokens, integer model. Returns int8 (T - first, H, dv):
    the outputs of query rows ``first`` .. T-1 (an extend of a cached context).

    ``q`` (T, H, d), ``k`` (T, H_kv, d), ``v`` (T, H_kv, dv) int8; keys stream in blocks
    of ``block_keys`` from key 0 (use the page size to match decode bit for bit).
    ``saturation`` counts the outputs clamped to int8 (``attention.out``).
    """
    q, k, v, group = _check_prefill(q, k, v)
    _check_window(window)
    _check_first(first, q.shape[0])
    sinks = _check_sinks(sinks, q.shape[1])
    if block_keys < 1:
        raise ValueError(f"block_keys must be >= 1, got {block_keys}")
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    (lm, ls), (om, osh) = _multipliers(scales, dim, numerics)
    k_t = k.transpose(1, 2, 0)  # (kvh, d, T)
    v_t = v.transpose(1, 0, 2)  # (kvh, T, dv)
    sink_rows = None
    if sinks is not None:
        sink_rows = quantize_log2_logit(sinks, numerics).reshape(kv_heads, group)
    out = np.empty((tokens - first, heads, v.shape[2]), np.int8)
    for t0 in range(first, tokens, PREFILL_CHUNK):
        t1 = min(t0 + PREFILL_CHUNK, tokens)
        n = t1 - t0
        qc = q[t0:t1].reshape(n, kv_heads, group, dim).transpose(1, 2, 0, 3)
        scores = exact_matmul(qc.reshape(kv_heads, group * n, dim), k_t[:, :, :t1])
        scores = wrap(scores, numerics.acc_bits)
        x = to_log2_domain(scores, lm, ls)
        q_pos = np.tile(np.arange(t0, t1), group)[:, None]
        mask = _visible(q_pos, np.arange(t1)[None, :], window)[None]
        sink = None if sink_rows is None else np.repeat(sink_rows, n, axis=1)
        acc, total = online_softmax_pv(x, mask, v_t[:, :t1], block_keys, sink, numerics)
        y = normalise_output(acc, total, om, osh, numerics, saturation)  # (kvh, group*n, dv)
        rows = y.reshape(kv_heads, group, n, -1).transpose(2, 0, 1, 3).reshape(n, heads, -1)
        out[t0 - first:t1 - first] = rows
    return out


def _softmax_pv_float(z: np.ndarray, visible: np.ndarray, v: np.ndarray, sink) -> np.ndarray:
    z = np.where(visible, z, -np.inf)
    m = z.max(axis=-1, keepdims=True)
    if sink is not None:
        m = np.maximum(m, sink[..., None])
    p = np.exp(z - m)
    denom = p.sum(axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + np.exp(sink[..., None] - m)
    return (p @ v) / denom


def attention_prefill_float(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scales: AttentionScales,
    *,
    window: int | None = None,
    sinks: np.ndarray | None = None,
    first: int = 0,
) -> np.ndarray:
    """float64 twin of :func:`attention_prefill` on the dequantised inputs; real
    (T - first, H, dv)."""
    q, k, v, group = _check_prefill(q, k, v)
    _check_window(window)
    _check_first(first, q.shape[0])
    sinks = _check_sinks(sinks, q.shape[1])
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    qf = q.astype(np.float64) * scales.q
    kf = k.astype(np.float64).transpose(1, 2, 0) * scales.k  # (kvh, d, T)
    vf = v.astype(np.float64).transpose(1, 0, 2) * scales.v  # (kvh, T, dv)
    sink = None if sinks is None else sinks.reshape(kv_heads, group, 1)
    out = np.empty((tokens - first, heads, v.shape[2]))
    for t0 in range(first, tokens, PREFILL_CHUNK):
        t1 = min(t0 + PREFILL_CHUNK, tokens)
        n = t1 - t0
        qc = qf[t0:t1].reshape(n, kv_heads, group, dim).transpose(1, 2, 0, 3)  # (kvh,g,n,d)
        z = (qc @ kf[:, None, :, :t1]) * scales.softmax(dim)  # (kvh, g, n, t1)
        visible = _visible(np.arange(t0, t1)[:, None], np.arange(t1)[None, :], window)
        s = None if sink is None else np.broadcast_to(sink, (kv_heads, group, n))
        o = _softmax_pv_float(z, visible, vf[:, None, :t1], s)  # (kvh, g, n, dv)
        out[t0 - first:t1 - first] = o.transpose(2, 0, 1, 3).reshape(n, heads, -1)
    return out


def _check_decode(q, cache: PagedKVCache, block_table, context_lens):
    q = _check_int8("q", q, 3)
    table, lens = check_block_table(cache, block_table, context_lens)
    if q.shape[0] != table.shape[0]:
        raise ValueError(f"q has {q.shape[0]} sequences but the block table has {table.shape[0]}")
    if q.shape[2] != cache.head_dim:
        raise ValueError(f"q head_dim {q.shape[2]} differs from the cache's {cache.head_dim}")
    group = _check_heads(q.shape[1], cache.kv_heads)
    # Only the pages the longest sequence uses are streamed.
    used = -(-int(lens.max()) // cache.page_size)
    return q, table[:, :used], lens, group


def _decode_layout(q, cache, table, lens, group, window):
    """Group (batch x KV head) views: q (G, g, d), k (G, L, d), v (G, L, dv), mask (G, 1, L)."""
    batch, heads, dim = q.shape
    kv_heads = cache.kv_heads
    k, v = gather(cache, table)  # (B, L, kvh, d)
    length = k.shape[1]
    kg = k.transpose(0, 2, 1, 3).reshape(batch * kv_heads, length, dim)
    vg = v.transpose(0, 2, 1, 3).reshape(batch * kv_heads, length, -1)
    qg = q.reshape(batch * kv_heads, group, dim)
    positions = np.arange(length)[None, :]
    visible = _visible(lens[:, None] - 1, positions, window) & (positions < lens[:, None])
    mask = np.repeat(visible, kv_heads, axis=0)[:, None, :]
    return qg, kg, vg, mask


def attention_decode(
    q: np.ndarray,
    cache: PagedKVCache,
    block_table: np.ndarray,
    context_lens: np.ndarray,
    scales: AttentionScales,
    *,
    window: int | None = None,
    sinks: np.ndarray | None = None,
    numerics: Numerics = NUMERICS,
    saturation: Saturation | None = None,
) -> np.ndarray:
    """One decode step for a batch of sequences, integer model. Returns int8 (B, H, dv).

    ``q`` (B, H, d) int8 is each sequence's newest token, at position ``context_lens[b] - 1``
    (its K/V already appended). Keys stream one page per block, in logical page order.
    ``saturation`` counts the outputs clamped to int8 (``attention.out``).
    """
    q, table, lens, group = _check_decode(q, cache, block_table, context_lens)
    _check_window(window)
    sinks = _check_sinks(sinks, q.shape[1])
    (lm, ls), (om, osh) = _multipliers(scales, q.shape[2], numerics)
    qg, kg, vg, mask = _decode_layout(q, cache, table, lens, group, window)
    scores = wrap(exact_matmul(qg, kg.transpose(0, 2, 1)), numerics.acc_bits)
    x = to_log2_domain(scores, lm, ls)
    sink = None
    if sinks is not None:
        sink = np.tile(quantize_log2_logit(sinks, numerics), q.shape[0]).reshape(-1, group)
    acc, total = online_softmax_pv(x, mask, vg, cache.page_size, sink, numerics)
    y = normalise_output(acc, total, om, osh, numerics, saturation)  # (G, g, dv)
    return y.reshape(q.shape[0], q.shape[1], -1)


def attention_decode_float(
    q: np.ndarray,
    cache: PagedKVCache,
    block_table: np.ndarray,
    context_lens: np.ndarray,
    scales: AttentionScales,
    *,
    window: int | None = None,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """float64 twin of :func:`attention_decode`; real (B, H, dv)."""
    q, table, lens, group = _check_decode(q, cache, block_table, context_lens)
    _check_window(window)
    sinks = _check_sinks(sinks, q.shape[1])
    qg, kg, vg, mask = _decode_layout(q, cache, table, lens, group, window)
    z = (qg * scales.q) @ (kg.transpose(0, 2, 1) * scales.k) * scales.softmax(q.shape[2])
    sink = None if sinks is None else np.tile(sinks, q.shape[0]).reshape(-1, group)
    o = _softmax_pv_float(z, mask, vg * scales.v, sink)
    return o.reshape(q.shape[0], q.shape[1], -1)


def calibrate_out_scale(o_float: np.ndarray, v_peak: float | None = None,
                        headroom: int = HEADROOM_LSB) -> float:
    """Static output scale: the largest |output| of ``o_float`` maps to ``127 - headroom``.

    ``v_peak`` (the largest |V| in real units, when known) caps the peak: an attention
    output is a convex combination of V rows (a sink only shrinks it), so no output of
    any query can exceed it, and a scale from the cap saturates nothing whatever is
    asked of the layer.
    """
    peak = float(np.abs(o_float).max())
    if v_peak is not None:
        peak = min(peak, float(v_peak))
    return peak / (127.0 - headroom) if peak > 0 else 1.0 / 127.0


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors, flattened (1.0 when both are zero)."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b / (na * nb))


def lsb_error(y: np.ndarray, o_float: np.ndarray, out_scale: float) -> float:
    """Largest |int8 output - float output / out_scale|, in output LSBs."""
    return float(np.abs(np.asarray(y, np.float64) - np.asarray(o_float) / out_scale).max())
