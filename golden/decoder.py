"""Between attention and the MoE layer: the output projection and the residual add.

A decoder layer's attention output ``o`` (T, H·d_v) int8 at the attention output scale
``s_o`` is projected by ``W_o`` (H·d_v, hidden) int8 at ``s_wo`` and added to the
residual stream ``r`` (T, hidden) int8 at the hidden scale ``s_x``; the sum is the MoE
layer's input, at ``s_x`` too:

    p = rq(o · W_o; s_o · s_wo / s_x)       (int32 GEMM, then a requantisation: site ``proj``)
    x = clamp(r + p)                        (int8 saturation: site ``residual``)

Both steps are requantisations of :func:`golden.gemm.requantize` (the clamp one of
multiplier 1), so a ``Saturation`` counts what each clamps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from golden.gemm import Saturation, quantize_multiplier, requantize, wrap
from golden.softmax import exact_matmul
from spec.numerics import NUMERICS, Numerics


@dataclass(frozen=True)
class ProjectionScales:
    """Scales of the projection: attention output, W_o, and the hidden (residual) scale."""

    attention_out: float
    w_o: float
    hidden: float

    def __post_init__(self) -> None:
        for name in ("attention_out", "w_o", "hidden"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"projection scale {name} must be positive and finite, "
                                 f"got {value}")

    def multiplier(self, numerics: Numerics = NUMERICS) -> tuple[int, int]:
        """(multiplier, shift) of the projection's requantisation."""
        return quantize_multiplier(self.attention_out * self.w_o / self.hidden, numerics)


def _check(o: np.ndarray, w_o: np.ndarray, residual: np.ndarray) -> None:
    for name, a in (("o", o), ("w_o", w_o), ("residual", residual)):
        a = np.asarray(a)
        if a.dtype != np.int8 or a.ndim != 2 or 0 in a.shape:
            raise ValueError(f"{name} must be a non-empty int8 matrix, got {a.shape} {a.dtype}")
    if o.shape[1] != w_o.shape[0]:
        raise ValueError(f"o has {o.shape[1]} channels but w_o takes {w_o.shape[0]}")
    if residual.shape != (o.shape[0], w_o.shape[1]):
        raise ValueError(f"residual must be ({o.shape[0]}, {w_o.shape[1]}), got "
                         f"{residual.shape}")


#: The requantisation that only clamps (multiplier 1): the residual add's saturation.
IDENTITY = (1 << (NUMERICS.requant_mult_bits - 1), NUMERICS.requant_mult_bits - 1)


def project_residual(o: np.ndarray, w_o: np.ndarray, residual: np.ndarray,
                     scales: ProjectionScales, numerics: Numerics = NUMERICS,
                     saturation: Saturation | None = None) -> np.ndarray:
    """The MoE input ``clamp(r + rq(o · W_o))``, int8 (T, hidden); bit-exact with the
    chip's home tile (``compiler.moe``)."""
    _check(o, w_o, residual)
    m, sh = scales.multiplier(numerics)
    p = requantize(wrap(exact_matmul(o, w_o), numerics.acc_bits), m, sh, numerics,
                   saturation=saturation, site="proj")
    total = p.astype(np.int64) + residual
    return requantize(total, *IDENTITY, numerics, saturation=saturation, site="residual")


def project_residual_float(o: np.ndarray, w_o: np.ndarray, residual: np.ndarray,
                           scales: ProjectionScales) -> np.ndarray:
    """float64 twin of :func:`project_residual` on the dequantised inputs: real (T,
    hidden), no rounding, no clamp."""
    _check(o, w_o, residual)
    return ((np.asarray(o, np.float64) * scales.attention_out)
            @ (np.asarray(w_o, np.float64) * scales.w_o)
            + np.asarray(residual, np.float64) * scales.hidden)
