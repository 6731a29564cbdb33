"""Integer reciprocal: leading-one normalisation, a small seed table and Newton steps.

The only division in serrano's vector unit. :func:`reciprocal` returns ``(y, e)`` with
``1 / l ~= y * 2**-(B + e)`` (``B = recip_bits``), so a quotient ``a / l`` is
``(a * y) >> (B + e)`` with rounding by the caller.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from spec.numerics import NUMERICS, Numerics


@lru_cache(maxsize=16)
def reciprocal_seed_table(numerics: Numerics = NUMERICS) -> np.ndarray:
    """``seed[i] = round(2**B / (1 + (i + 0.5) / 2**S))``: 1/x at the middle of each interval."""
    b, s = numerics.recip_bits, numerics.recip_seed_bits
    mid = 1.0 + (np.arange(1 << s) + 0.5) / (1 << s)
    table = np.floor((1 << b) / mid + 0.5).astype(np.int64)
    table.setflags(write=False)
    return table


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Position of the leading one plus one (a priority encoder), for x >= 1, exact to 2**62."""
    x = np.asarray(x, dtype=np.int64)
    e = np.zeros(x.shape, dtype=np.int64)
    for step in (32, 16, 8, 4, 2, 1):
        big = (x >> step) > 0
        x = np.where(big, x >> step, x)
        e += np.where(big, step, 0)
    return e + 1


def reciprocal(l: np.ndarray, numerics: Numerics = NUMERICS) -> tuple[np.ndarray, np.ndarray]:  # noqa: E741
    """``(y, e)`` with ``1 / l ~= y * 2**-(B + e)`` for integers ``l >= 1``; both int64 arrays.

    1. ``e = floor(log2 l)`` (leading one); ``mn`` = the top ``B`` bits of ``l`` as Q1.(B-1),
       i.e. ``l << (B-1-e)`` or ``l >> (e-B+1)`` (truncating), ``mn`` in ``[2**(B-1), 2**B)``.
    2. ``y = seed[(mn >> (B-1-S)) & (2**S - 1)]`` with ``S = recip_seed_bits``.
    3. ``recip_newton_steps`` times: ``t = mn * y``, ``err = 2**(2B-1) - t``,
       ``y += (y * err + 2**(2B-2)) >> (2B-1)``.
    4. Clamp ``y`` to ``[2**(B-1), 2**B]`` (B+1 bits; 2**B only when l is a power of two).

    Relative error of ``y * 2**-(B+e)`` against ``1/l``: below ``2**-(B-1)`` (the truncation
    of ``l`` to ``B`` bits plus the ``B``-bit result), see docs/numerics.md.
    """
    l = np.asarray(l, dtype=np.int64)  # noqa: E741
    if l.size and l.min() < 1:
        raise ValueError("reciprocal needs integers >= 1")
    b, s = numerics.recip_bits, numerics.recip_seed_bits
    e = _bit_length(l) - 1
    up = np.maximum(b - 1 - e, 0)
    down = np.maximum(e - (b - 1), 0)
    mn = (l << up) >> down
    y = reciprocal_seed_table(numerics)[(mn >> (b - 1 - s)) & ((1 << s) - 1)]
    one = np.int64(1) << (2 * b - 1)
    for _ in range(numerics.recip_newton_steps):
        err = one - mn * y
        y = y + ((y * err + (one >> 1)) >> (2 * b - 1))
    y = np.clip(y, 1 << (b - 1), 1 << b)
    return y, e


def divide(a: np.ndarray, l: np.ndarray, out_frac_bits: int, numerics: Numerics = NUMERICS):  # noqa: E741
    """``round(a / l * 2**out_frac_bits)`` through :func:`reciprocal`, rounding half up.

    ``a`` is signed, ``l >= 1`` broadcasts against it. ``a * y`` must fit 63 bits.
    """
    y, e = reciprocal(l, numerics)
    shift = numerics.recip_bits + e - out_frac_bits
    a = np.asarray(a, dtype=np.int64)
    prod = a * y
    right = np.maximum(shift, 0)
    rounded = (prod + np.where(right > 0, np.int64(1) << np.maximum(right - 1, 0), 0)) >> right
    return rounded << np.maximum(-shift, 0)
