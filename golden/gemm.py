"""int8 GEMM with int32 accumulation, and requantisation back to int8.

Integer functions are bit-exact with the RTL; ``*_float`` twins compute the same
quantity in float64 so tests can bound the integer model's error.
"""

from __future__ import annotations

import math

import numpy as np

from spec.numerics import NUMERICS, Numerics


def _check_operand(name: str, x: np.ndarray, numerics: Numerics) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D matrix, got shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name} must not be empty, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {x.dtype}")
    if x.min() < numerics.operand_min or x.max() > numerics.operand_max:
        raise ValueError(
            f"{name} holds values outside int{numerics.operand_bits} "
            f"[{numerics.operand_min}, {numerics.operand_max}]"
        )
    return x.astype(np.int64)


def wrap(x: np.ndarray, bits: int) -> np.ndarray:
    """Reduce integers modulo 2**bits into the signed range, as a register of that width does."""
    x = np.asarray(x, dtype=np.int64)
    half = 1 << (bits - 1)
    return ((x + half) & ((1 << bits) - 1)) - half


def gemm(a: np.ndarray, b: np.ndarray, numerics: Numerics = NUMERICS) -> np.ndarray:
    """``a @ b`` for int8 matrices, accumulated in int32 with two's-complement wrap.

    ``a`` is M x K, ``b`` is K x N; the result is M x N int32. The sum wraps exactly as
    the hardware accumulator does; it cannot wrap while K <= ``numerics.max_exact_depth``.
    """
    a = _check_operand("a", a, numerics)
    b = _check_operand("b", b, numerics)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    # Products are < 2**14 and int64 holds 2**49 of them: exact, then wrapped once.
    return wrap(a @ b, numerics.acc_bits).astype(np.int32)


def gemm_float(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float64 twin of :func:`gemm` (no wrap)."""
    return np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)


def quantize_multiplier(scale: float, numerics: Numerics = NUMERICS) -> tuple[int, int]:
    """Integer (multiplier, shift) with ``multiplier / 2**shift`` closest to ``scale``.

    The multiplier is normalised to ``[2**(B-1), 2**B)`` for ``B = requant_mult_bits``,
    so it keeps B significant bits; relative error <= 2**-B.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"requantisation scale must be positive and finite, got {scale}")
    bits = numerics.requant_mult_bits
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    multiplier = round(mantissa * (1 << bits))
    shift = bits - exponent
    if multiplier == 1 << bits:  # rounding carried into the next power of two
        multiplier >>= 1
        shift -= 1
    if shift < 0:
        raise ValueError(f"requantisation scale {scale} is too large (needs a left shift)")
    if shift > numerics.requant_max_shift:
        raise ValueError(f"requantisation scale {scale} is too small for a {bits}-bit multiplier")
    return multiplier, shift


#: Output codes a calibrated scale keeps free below 127: the integer models round their
#: intermediate results (quantised probabilities, reciprocals, requantisations), so an
#: output may land a little above its float64 value, and a calibrated peak must not
#: saturate. docs/numerics.md states what it costs.
HEADROOM_LSB = 3


class Saturation:
    """Saturated outputs per requantisation site, counted by the integer models.

    Pass one to a model (``saturation=``): every :func:`requantize` it makes adds, under
    its site's name (e.g. ``attention.out``, ``moe.hidden``), how many of its outputs
    were clamped to the int8 range and how many it produced. A saturated output is an
    error the float64 twin cannot see in LSBs alone; a calibration that holds keeps every
    count at zero.
    """

    def __init__(self) -> None:
        #: site -> [saturated outputs, outputs]
        self.sites: dict[str, list[int]] = {}

    def add(self, site: str, saturated: int, outputs: int) -> None:
        counts = self.sites.setdefault(site, [0, 0])
        counts[0] += int(saturated)
        counts[1] += int(outputs)

    def merge(self, other: Saturation) -> None:
        for site, (saturated, outputs) in other.sites.items():
            self.add(site, saturated, outputs)

    @property
    def saturated(self) -> int:
        return sum(c[0] for c in self.sites.values())

    @property
    def outputs(self) -> int:
        return sum(c[1] for c in self.sites.values())

    def worst(self) -> str | None:
        """The site with the most saturated outputs, or None when nothing saturated."""
        site = max(self.sites, key=lambda s: self.sites[s][0], default=None)
        return site if site is not None and self.sites[site][0] else None

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {site: {"saturated": s, "outputs": n} for site, (s, n) in self.sites.items()}


def requantize(
    acc: np.ndarray, multiplier: int, shift: int, numerics: Numerics = NUMERICS, *,
    saturation: Saturation | None = None, site: str = "requantize",
) -> np.ndarray:
    """int32 accumulators to int8: ``clamp(floor((acc * multiplier + 2**(shift-1)) / 2**shift))``.

    Rounding is round-half-up (ties go towards +infinity); shift 0 means no rounding term.
    Saturation clamps to the operand range; with ``saturation`` the clamped outputs are
    counted under ``site``. ``multiplier`` is unsigned, < 2**requant_mult_bits.
    """
    if not 0 <= multiplier < (1 << numerics.requant_mult_bits):
        raise ValueError(
            f"multiplier {multiplier} outside [0, 2**{numerics.requant_mult_bits})"
        )
    if not 0 <= shift <= numerics.requant_max_shift:
        raise ValueError(f"shift {shift} outside [0, {numerics.requant_max_shift}]")
    acc = np.asarray(acc)
    if acc.size and (acc.min() < numerics.acc_min or acc.max() > numerics.acc_max):
        raise ValueError(f"accumulators outside int{numerics.acc_bits}")
    # |acc * multiplier| < 2**47 and the rounding term <= 2**62: exact in int64.
    rounding = (1 << (shift - 1)) if shift else 0
    scaled = (acc.astype(np.int64) * multiplier + rounding) >> shift
    out = np.clip(scaled, numerics.operand_min, numerics.operand_max)
    if saturation is not None:
        saturation.add(site, np.count_nonzero(out != scaled), scaled.size)
    return out.reshape(acc.shape).astype(np.int8)


def requantize_float(acc: np.ndarray, scale: float, numerics: Numerics = NUMERICS) -> np.ndarray:
    """float64 twin of :func:`requantize`: ``acc * scale`` rounded to nearest and clamped."""
    y = np.rint(np.asarray(acc, dtype=np.float64) * scale)
    return np.clip(y, numerics.operand_min, numerics.operand_max)
