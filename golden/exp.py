"""exp by base-2 decomposition: logits in the log2 domain, two small tables and a shift.

A real logit ``z`` (natural units) becomes a log2-domain fixed-point integer
``x = round(z * log2(e) * 2**F)`` with ``F = exp_frac_bits``; then ``e**(z - z_max)`` is
``2**-(d / 2**F)`` for the non-negative integer ``d = x_max - x``. :func:`exp2_neg`
evaluates it as ``T_hi[f_hi] * T_lo[f_lo] >> (n + ...)`` where ``n`` is the integer part
of ``d / 2**F`` and ``f_hi``/``f_lo`` are the top and bottom bits of its fraction.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from golden.gemm import quantize_multiplier
from spec.numerics import NUMERICS, Numerics

LOG2E = 1.0 / math.log(2.0)

#: A log2-domain logit below every real one: marks "minus infinity" (masked, or empty state).
NEG_INF = -(1 << 40)


@lru_cache(maxsize=16)
def exp2_tables(numerics: Numerics = NUMERICS) -> tuple[np.ndarray, np.ndarray]:
    """The coarse and fine tables of ``2**-f`` in unsigned Q1.``exp_table_frac_bits``.

    ``T_hi[i] = round(2**(T - i / 2**H))`` for ``i < 2**H`` and
    ``T_lo[j] = round(2**(T - j / 2**F))`` for ``j < 2**(F - H)``, with ``T`` the table
    fraction bits, ``H = exp_hi_bits``, ``F = exp_frac_bits``. Both start at ``2**T`` (1.0).
    """
    t, h, f = numerics.exp_table_frac_bits, numerics.exp_hi_bits, numerics.exp_frac_bits
    hi = np.floor(2.0 ** (t - np.arange(1 << h) / (1 << h)) + 0.5).astype(np.int64)
    lo = np.floor(2.0 ** (t - np.arange(1 << (f - h)) / (1 << f)) + 0.5).astype(np.int64)
    hi.setflags(write=False)
    lo.setflags(write=False)
    return hi, lo


def exp2_neg(d: np.ndarray, out_frac_bits: int, numerics: Numerics = NUMERICS) -> np.ndarray:
    """``2**-(d / 2**F)`` for integers ``d >= 0``, as unsigned Q?.``out_frac_bits`` (int64).

    ``n = d >> F``, ``f = d & (2**F - 1)``, ``f_hi = f >> (F - H)``, ``f_lo = f & (2**(F-H) - 1)``;
    the result is ``(T_hi[f_hi] * T_lo[f_lo] + 2**(s-1)) >> s`` with
    ``s = 2*T - out_frac_bits + n``: one rounding, half up. 1.0 (``d = 0``) gives
    ``2**out_frac_bits``; the caller saturates if its format cannot hold it.
    """
    d = np.asarray(d, dtype=np.int64)
    if d.size and d.min() < 0:
        raise ValueError("exp2_neg takes non-negative exponents d = x_max - x")
    t, f, h = numerics.exp_table_frac_bits, numerics.exp_frac_bits, numerics.exp_hi_bits
    if not 0 < out_frac_bits < 2 * t:
        raise ValueError(f"out_frac_bits {out_frac_bits} outside [1, {2 * t - 1}]")
    hi_table, lo_table = exp2_tables(numerics)
    frac = d & ((1 << f) - 1)
    prod = hi_table[frac >> (f - h)] * lo_table[frac & ((1 << (f - h)) - 1)]
    # Past 2*T + 1 extra bits of shift everything rounds to zero: clip to keep shifts < 64.
    n = np.minimum(d >> f, out_frac_bits + 2)
    s = 2 * t - out_frac_bits + n
    return (prod + (np.int64(1) << (s - 1))) >> s


def exp2_neg_float(d: np.ndarray, numerics: Numerics = NUMERICS) -> np.ndarray:
    """float64 twin of :func:`exp2_neg` (as a real number, not scaled by 2**out_frac_bits)."""
    return np.exp2(-np.asarray(d, dtype=np.float64) / (1 << numerics.exp_frac_bits))


def logit_multiplier(scale: float, numerics: Numerics = NUMERICS) -> tuple[int, int]:
    """(multiplier, shift) with ``multiplier * 2**-shift ~= scale``; ``shift`` may be negative.

    Maps an integer score to the log2 domain: ``scale`` already includes
    ``log2(e) * 2**exp_frac_bits``. A negative shift is an exact left shift of the product
    (allowed down to ``-logit_max_left_shift``); the multiplier keeps
    ``requant_mult_bits`` significant bits either way.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"logit scale must be positive and finite, got {scale}")
    top = 2.0 ** (numerics.requant_mult_bits - 1)  # beyond this the shift would go negative
    left = 0
    while scale * 2.0**-left >= top and left < numerics.logit_max_left_shift:
        left += 1
    if scale * 2.0**-left >= top:
        raise ValueError(f"logit scale {scale} is too large for the logit multiplier")
    multiplier, shift = quantize_multiplier(scale * 2.0**-left, numerics)
    return multiplier, shift - left


def to_log2_domain(
    scores: np.ndarray, multiplier: int, shift: int
) -> np.ndarray:
    """Integer scores to log2-domain logits: ``(s * m + 2**(sh-1)) >> sh`` (or ``<< -sh``)."""
    prod = np.asarray(scores, dtype=np.int64) * multiplier
    if shift > 0:
        return (prod + (1 << (shift - 1))) >> shift
    return prod << (-shift)


def quantize_log2_logit(z: np.ndarray, numerics: Numerics = NUMERICS) -> np.ndarray:
    """A real logit (natural units, e.g. a sink) to the log2 domain, rounded half up."""
    z = np.asarray(z, dtype=np.float64)
    return np.floor(z * LOG2E * (1 << numerics.exp_frac_bits) + 0.5).astype(np.int64)
