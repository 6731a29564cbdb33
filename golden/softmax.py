"""Fixed-point softmax: one-pass (for MoE gating) and online over key blocks (attention).

Logits arrive in the log2 domain (:mod:`golden.exp`). The online form keeps, per row, a
running max ``m``, a denominator ``l`` and an output accumulator ``acc`` and rescales both
``l`` and ``acc`` by ``alpha = 2**(m_old - m_new)`` whenever a block raises the max
(FlashAttention-2). Probabilities are quantised relative to the running max at the time
their block is processed, so the integer result depends on the block size: the block
size is a parameter and equals the hardware's streaming order (one KV page per block).
"""

from __future__ import annotations

import numpy as np

from golden.exp import NEG_INF, exp2_neg
from golden.gemm import Saturation, requantize
from golden.reciprocal import divide
from spec.numerics import NUMERICS, Numerics


def exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer ``a @ b`` (batched) computed with float64 BLAS, exact while sums stay < 2**53.

    The bound is checked from the operands' largest magnitudes and the depth; beyond it the
    product is computed in int64 instead. Returns int64.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    amax = int(np.abs(a).max()) if a.size else 0
    bmax = int(np.abs(b).max()) if b.size else 0
    if amax * bmax * max(a.shape[-1], 1) < (1 << 53):
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


def wrap_signed(x: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement wrap of int64 values to ``bits`` (a register of that width)."""
    half = np.int64(1) << (bits - 1)
    return ((x + half) & ((np.int64(1) << bits) - 1)) - half


def softmax(
    x: np.ndarray, mask: np.ndarray | None = None, numerics: Numerics = NUMERICS
) -> np.ndarray:
    """One-pass integer softmax over the last axis of log2-domain logits ``x``.

    ``p_i = exp2_neg(max - x_i, T)`` (Q1.T, T = ``exp_table_frac_bits``), ``l = sum p_i``,
    ``prob_i = round(p_i / l * 2**G)`` by :func:`golden.reciprocal.divide`, saturated to
    ``2**G - 1`` (G = ``gate_frac_bits``). Masked entries get probability 0; every row
    needs one unmasked entry. Returns int64 Q0.G.
    """
    x = np.asarray(x, dtype=np.int64)
    if mask is None:
        mask = np.ones(x.shape, dtype=bool)
    mask = np.broadcast_to(mask, x.shape)
    if not mask.any(axis=-1).all():
        raise ValueError("softmax: every row needs at least one unmasked entry")
    xm = np.where(mask, x, NEG_INF)
    m = xm.max(axis=-1, keepdims=True)
    p = np.where(mask, exp2_neg(m - xm, numerics.exp_table_frac_bits, numerics), 0)
    total = p.sum(axis=-1, keepdims=True)
    prob = divide(p, total, numerics.gate_frac_bits, numerics)
    return np.minimum(prob, (1 << numerics.gate_frac_bits) - 1)


def softmax_float(z: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """float64 softmax over the last axis of natural-unit logits ``z`` (masked entries -> 0)."""
    z = np.asarray(z, dtype=np.float64)
    if mask is not None:
        z = np.where(np.broadcast_to(mask, z.shape), z, -np.inf)
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def online_softmax_pv(
    x: np.ndarray,
    mask: np.ndarray,
    v: np.ndarray,
    block: int,
    sink: np.ndarray | None = None,
    numerics: Numerics = NUMERICS,
) -> tuple[np.ndarray, np.ndarray]:
    """Stream ``softmax(x) @ v`` over key blocks; return the raw state ``(acc, l)``.

    ``x`` (G, R, L) log2-domain logits for R query rows of G groups over L keys;
    ``mask`` (broadcastable to x) is True where a key is visible; ``v`` (G, L, dv) int8
    values; ``sink`` (G, R) optional log2-domain sink logits that join the denominator
    only. Keys are consumed in blocks of ``block`` (key 0 starts block 0). Per block b:

    - ``m_b = max(m_{b-1}, max_j x_j)`` over visible keys (``m_{-1}`` = sink or -inf);
    - ``P_j = min(exp2_neg(m_b - x_j, Pb), 2**Pb - 1)`` (Q0.Pb, Pb = ``attn_p_bits``);
    - ``alpha = exp2_neg(m_b - m_{b-1}, T)`` (Q1.T; 0 while the state is empty);
    - ``acc = ((acc * alpha + 2**(T-1)) >> T) + P . V_b``, same for ``l`` with ``sum P``.

    The state starts as ``acc = 0`` and ``l = 2**Pb - 1`` (the sink's own probability)
    with a sink, ``l = 0`` without. ``acc`` wraps at ``attn_acc_bits``, ``l`` at
    ``attn_sum_bits`` (neither can for contexts below ~6.7e7 and ~2.6e5 keys).
    """
    x = np.asarray(x, dtype=np.int64)
    g, r, length = x.shape
    v = np.asarray(v, dtype=np.int64)
    mask = np.broadcast_to(np.asarray(mask, dtype=bool), x.shape)
    pad = (-length) % block
    if pad:
        x = np.concatenate([x, np.zeros((g, r, pad), np.int64)], axis=-1)
        mask = np.concatenate([mask, np.zeros((g, r, pad), bool)], axis=-1)
        v = np.concatenate([v, np.zeros((g, pad, v.shape[-1]), np.int64)], axis=1)
    nb = x.shape[-1] // block
    t = numerics.exp_table_frac_bits
    pbits = numerics.attn_p_bits

    xm = np.where(mask, x, NEG_INF).reshape(g, r, nb, block)
    block_max = xm.max(axis=-1)  # (g, r, nb)
    m_init = np.full((g, r, 1), NEG_INF, np.int64) if sink is None else sink[..., None]
    running = np.maximum.accumulate(np.concatenate([m_init, block_max], axis=-1), axis=-1)
    m_old, m_new = running[..., :-1], running[..., 1:]

    visible = mask.reshape(g, r, nb, block)
    p = np.where(visible, exp2_neg(np.where(visible, m_new[..., None] - xm, 0), pbits, numerics), 0)
    p = np.minimum(p, numerics.attn_p_max)
    started = m_old > NEG_INF
    alpha = np.where(started, exp2_neg(np.where(started, m_new - m_old, 0), t, numerics), 0)

    # P.V per block; P in [0, 2**14) and |V| <= 128, so block sums are exact in float64.
    pv = exact_matmul(p.transpose(0, 2, 1, 3), v.reshape(g, nb, block, -1))  # (g, nb, r, dv)
    p_sum = p.sum(axis=-1)  # (g, r, nb)

    acc = np.zeros((g, r, v.shape[-1]), np.int64)
    total = np.zeros((g, r), np.int64) if sink is None else np.full((g, r), numerics.attn_p_max)
    half = np.int64(1) << (t - 1)
    sum_mask = (np.int64(1) << numerics.attn_sum_bits) - 1
    for b in range(nb):
        a = alpha[..., b]
        acc = wrap_signed(((acc * a[..., None] + half) >> t) + pv[:, b], numerics.attn_acc_bits)
        total = (((total * a + half) >> t) + p_sum[..., b]) & sum_mask
    return acc, total


def normalise_output(
    acc: np.ndarray,
    total: np.ndarray,
    multiplier: int,
    shift: int,
    numerics: Numerics = NUMERICS,
    saturation: Saturation | None = None,
) -> np.ndarray:
    """``acc / l`` then requantise to int8: the end of an attention row.

    ``o = round(acc / l * 2**O)`` (O = ``attn_out_frac_bits``) by the reciprocal, then
    ``clamp((o * multiplier + 2**(shift-1)) >> shift)`` with ``multiplier / 2**shift``
    ``~= s_v / s_out / 2**O`` (see :func:`golden.gemm.requantize`); clamped outputs are
    counted in ``saturation`` under ``attention.out``.
    """
    o = divide(acc, total[..., None], numerics.attn_out_frac_bits, numerics)
    return requantize(o, multiplier, shift, numerics, saturation=saturation,
                      site="attention.out")
