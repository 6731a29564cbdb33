"""Mixture of experts: router GEMM, top-k, gating, SwiGLU experts, shared expert, combine.

- Router: ``logits = x . W_r`` (int8 GEMM, int32), exact.
- Top-k: the k largest logits per token, ties to the lower expert index.
- Gating: softmax over the k selected logits only (GPT-OSS style; the one normalisation
  used for every workload), integer model = the one-pass :func:`golden.softmax.softmax`.
- Expert e: ``g = rq(x.Wg_e)``, ``u = rq(x.Wu_e)``, ``a = SILU_e[g]`` (256-entry int8
  table indexed by the int8 ``g``, no interpolation), ``h = rq(a * u)``,
  ``y = rq(h.Wd_e)``; every ``rq`` is :func:`golden.gemm.requantize`.
- Combine: ``out = rq(sum_j gate_j * y_{e_j} + sum_shared y_s << G)``.
Shared experts are stored after the routed ones (index ``experts .. experts + shared - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from golden.exp import LOG2E, logit_multiplier, to_log2_domain
from golden.gemm import HEADROOM_LSB, Saturation, quantize_multiplier, requantize, wrap
from golden.softmax import exact_matmul, softmax, softmax_float
from spec.numerics import NUMERICS, Numerics


@dataclass(frozen=True)
class MoEWeights:
    """int8 weights: router (H, E); gate/up (E+S, H, F); down (E+S, F, H); S shared experts."""

    router: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    num_shared: int = 0

    def __post_init__(self) -> None:
        for f in ("router", "w_gate", "w_up", "w_down"):
            a = np.asarray(getattr(self, f))
            if a.dtype != np.int8:
                raise ValueError(f"MoE weight {f} must be int8, got {a.dtype}")
            if 0 in a.shape:
                raise ValueError(f"MoE weight {f} must not be empty, got {a.shape}")
        if self.router.ndim != 2:
            raise ValueError(f"router must be (hidden, experts), got {self.router.shape}")
        hidden, experts = self.router.shape
        total = experts + self.num_shared
        if self.num_shared < 0:
            raise ValueError(f"num_shared must be >= 0, got {self.num_shared}")
        if self.w_gate.ndim != 3 or self.w_gate.shape[:2] != (total, hidden):
            raise ValueError(
                f"w_gate must be ({total}, {hidden}, ffn) for {experts} routed + "
                f"{self.num_shared} shared experts, got {self.w_gate.shape}"
            )
        if self.w_up.shape != self.w_gate.shape:
            raise ValueError(f"w_up {self.w_up.shape} differs from w_gate {self.w_gate.shape}")
        ffn = self.w_gate.shape[2]
        if self.w_down.shape != (total, ffn, hidden):
            raise ValueError(f"w_down must be ({total}, {ffn}, {hidden}), got {self.w_down.shape}")

    @property
    def hidden(self) -> int:
        return self.router.shape[0]

    @property
    def experts(self) -> int:
        """Routed experts."""
        return self.router.shape[1]

    @property
    def ffn(self) -> int:
        return self.w_gate.shape[2]


@dataclass(frozen=True)
class MoEScales:
    """Scales of every MoE tensor; per-expert arrays have E+S entries (shared last)."""

    x: float
    router: float
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray
    gate_act: np.ndarray
    up_act: np.ndarray
    silu_act: np.ndarray
    hidden_act: np.ndarray
    expert_out: float
    out: float

    def __post_init__(self) -> None:
        for f in fields(self):
            a = np.asarray(getattr(self, f.name), dtype=np.float64)
            if not (np.isfinite(a).all() and (a > 0).all()):
                raise ValueError(f"MoE scale {f.name} must be positive and finite")

    def to_json(self) -> dict:
        return {
            f.name: (np.asarray(getattr(self, f.name)).tolist()) for f in fields(self)
        }

    @classmethod
    def from_json(cls, d: dict) -> MoEScales:
        return cls(**{k: (np.asarray(v, np.float64) if isinstance(v, list) else v)
                      for k, v in d.items()})


@dataclass(frozen=True)
class MoEResult:
    """Output of a MoE layer: int8 (or float) output, chosen experts, gates, expert loads."""

    out: np.ndarray
    experts: np.ndarray
    gates: np.ndarray
    load: np.ndarray


def _check(x: np.ndarray, weights: MoEWeights, top_k: int, scales: MoEScales) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.int8 or x.ndim != 2 or 0 in x.shape:
        raise ValueError(f"x must be a non-empty int8 (tokens, hidden) matrix, got {x.shape} "
                         f"{x.dtype}")
    if x.shape[1] != weights.hidden:
        raise ValueError(f"x hidden size {x.shape[1]} differs from the router's {weights.hidden}")
    if not 1 <= top_k <= weights.experts:
        raise ValueError(f"top_k {top_k} must be between 1 and the {weights.experts} experts")
    total = weights.experts + weights.num_shared
    for name in ("w_gate", "w_up", "w_down", "gate_act", "up_act", "silu_act", "hidden_act"):
        if np.shape(getattr(scales, name)) != (total,):
            raise ValueError(f"scale {name} must hold {total} per-expert values")
    return x


def topk(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries per row, largest first, ties to the lower index."""
    logits = np.asarray(logits)
    if not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"top_k {k} must be between 1 and the {logits.shape[-1]} experts")
    key = -logits.astype(np.float64 if logits.dtype.kind == "f" else np.int64)
    return np.argsort(key, axis=-1, kind="stable")[..., :k]


def silu_table(gate_scale: float, silu_scale: float, numerics: Numerics = NUMERICS) -> np.ndarray:
    """int8 SiLU table: entry ``i`` = clamp(floor(silu((i-128) * s_g) / s_a + 1/2)), 256 entries.

    Indexed by the int8 gate code + 128; covers the whole int8 input range exactly
    (no interpolation). The compiler fills it per expert from the two scales.
    """
    codes = np.arange(numerics.operand_min, numerics.operand_max + 1, dtype=np.float64)
    g = codes * gate_scale
    y = np.floor(g / (1.0 + np.exp(-g)) / silu_scale + 0.5)
    return np.clip(y, numerics.operand_min, numerics.operand_max).astype(np.int8)


def _silu(g: np.ndarray) -> np.ndarray:
    return g / (1.0 + np.exp(-g))


def silu_output_scale(gate_scale: float, numerics: Numerics = NUMERICS) -> float:
    """SiLU output scale for a gate scale: the table's largest output maps to 127."""
    return float(_silu(np.float64(numerics.operand_max * gate_scale))) / numerics.operand_max


def _requant(acc: np.ndarray, scale: float, numerics: Numerics,
             saturation: Saturation | None = None, site: str = "moe") -> np.ndarray:
    m, sh = quantize_multiplier(scale, numerics)
    return requantize(wrap(acc, numerics.acc_bits), m, sh, numerics, saturation=saturation,
                      site=site)


def expert_ffn(
    x: np.ndarray, e: int, weights: MoEWeights, scales: MoEScales, numerics: Numerics = NUMERICS,
    saturation: Saturation | None = None,
) -> np.ndarray:
    """SwiGLU expert ``e`` on int8 rows ``x`` (n, H); returns int8 (n, H) at ``expert_out``.
    ``saturation`` counts clamped outputs of its four requantisations (``moe.gate``,
    ``moe.up``, ``moe.hidden``, ``moe.expert``)."""
    sx = scales.x
    g = _requant(exact_matmul(x, weights.w_gate[e]), sx * scales.w_gate[e] / scales.gate_act[e],
                 numerics, saturation, "moe.gate")
    u = _requant(exact_matmul(x, weights.w_up[e]), sx * scales.w_up[e] / scales.up_act[e],
                 numerics, saturation, "moe.up")
    a = silu_table(scales.gate_act[e], scales.silu_act[e], numerics)[g.astype(np.int64) + 128]
    h = _requant(a.astype(np.int64) * u, scales.silu_act[e] * scales.up_act[e]
                 / scales.hidden_act[e], numerics, saturation, "moe.hidden")
    return _requant(exact_matmul(h, weights.w_down[e]),
                    scales.hidden_act[e] * scales.w_down[e] / scales.expert_out, numerics,
                    saturation, "moe.expert")


def expert_ffn_float(x: np.ndarray, e: int, weights: MoEWeights, scales: MoEScales) -> np.ndarray:
    """float64 twin of :func:`expert_ffn` (no intermediate quantisation); real (n, H)."""
    xf = np.asarray(x, np.float64) * scales.x
    g = xf @ (weights.w_gate[e] * scales.w_gate[e])
    u = xf @ (weights.w_up[e] * scales.w_up[e])
    return (_silu(g) * u) @ (weights.w_down[e] * scales.w_down[e])


def router_logits(x: np.ndarray, weights: MoEWeights, numerics: Numerics = NUMERICS) -> np.ndarray:
    """int32 router logits (T, E) from the int8 GEMM."""
    return wrap(exact_matmul(x, weights.router), numerics.acc_bits)


def moe_layer(
    x: np.ndarray,
    weights: MoEWeights,
    scales: MoEScales,
    top_k: int,
    numerics: Numerics = NUMERICS,
    saturation: Saturation | None = None,
) -> MoEResult:
    """Integer MoE layer on int8 tokens ``x`` (T, H): int8 output, experts, Q0.G gates, loads.
    ``saturation`` counts the clamped outputs of every requantisation (the experts' and
    the combine's, ``moe.out``)."""
    x = _check(x, weights, top_k, scales)
    logits = router_logits(x, weights, numerics)
    chosen = topk(logits, top_k)
    selected = np.take_along_axis(logits, chosen, axis=-1)
    lm, ls = logit_multiplier(
        scales.x * scales.router * LOG2E * (1 << numerics.exp_frac_bits), numerics
    )
    gates = softmax(to_log2_domain(selected, lm, ls), numerics=numerics)
    shift = numerics.gate_frac_bits
    acc = np.zeros(x.shape, np.int64)
    for e in range(weights.experts):
        token, slot = np.nonzero(chosen == e)
        if token.size:
            y = expert_ffn(x[token], e, weights, scales, numerics,
                           saturation).astype(np.int64)
            np.add.at(acc, token, gates[token, slot][:, None] * y)
    for s in range(weights.num_shared):
        y = expert_ffn(x, weights.experts + s, weights, scales, numerics,
                       saturation).astype(np.int64)
        acc += y << shift
    out = _requant(acc, scales.expert_out / scales.out / (1 << shift), numerics, saturation,
                   "moe.out")
    load = np.bincount(chosen.ravel(), minlength=weights.experts)
    return MoEResult(out, chosen, gates, load)


def moe_layer_float(
    x: np.ndarray, weights: MoEWeights, scales: MoEScales, top_k: int
) -> MoEResult:
    """float64 twin of :func:`moe_layer` on the dequantised inputs (real output and gates)."""
    x = _check(x, weights, top_k, scales)
    logits = (np.asarray(x, np.float64) * scales.x) @ (weights.router * scales.router)
    chosen = topk(logits, top_k)
    gates = softmax_float(np.take_along_axis(logits, chosen, axis=-1))
    out = np.zeros(x.shape)
    for e in range(weights.experts):
        token, slot = np.nonzero(chosen == e)
        if token.size:
            out[token] += gates[token, slot][:, None] * expert_ffn_float(x[token], e, weights,
                                                                         scales)
    for s in range(weights.num_shared):
        out += expert_ffn_float(x, weights.experts + s, weights, scales)
    load = np.bincount(chosen.ravel(), minlength=weights.experts)
    return MoEResult(out, chosen, gates, load)


def calibrate_moe_scales(
    x: np.ndarray,
    weights: MoEWeights,
    x_scale: float,
    router_scale: float,
    weight_scales: dict[str, np.ndarray],
    top_k: int,
) -> MoEScales:
    """Static max calibration of the activation scales from a float64 pass over ``x``.

    Every expert is calibrated on all tokens (so an expert no token picks still gets a
    scale); the combined output and the shared expert-output scale use the routed pass.
    Each peak maps to ``127 - HEADROOM_LSB`` (the integer path rounds its intermediate
    results, so it may land a little above the float64 peak; the headroom keeps a
    calibrated peak from saturating). Calibrate on every token the layer will see.
    """
    xf = np.asarray(x, np.float64) * x_scale
    total = weights.experts + weights.num_shared
    amax = float(np.iinfo(np.int8).max - HEADROOM_LSB)

    def peak(a: np.ndarray) -> float:
        m = float(np.abs(a).max())
        return m if m > 0 else 1.0

    gate_act, up_act, silu_act, hidden_act, y_peak = [], [], [], [], []
    for e in range(total):
        g = xf @ (weights.w_gate[e] * weight_scales["w_gate"][e])
        u = xf @ (weights.w_up[e] * weight_scales["w_up"][e])
        sg, su = peak(g) / amax, peak(u) / amax
        sa = silu_output_scale(sg)
        h = _silu(g) * u
        gate_act.append(sg)
        up_act.append(su)
        silu_act.append(sa)
        hidden_act.append(peak(h) / amax)
        y_peak.append(peak(h @ (weights.w_down[e] * weight_scales["w_down"][e])))
    provisional = MoEScales(
        x=x_scale, router=router_scale,
        w_gate=np.asarray(weight_scales["w_gate"], np.float64),
        w_up=np.asarray(weight_scales["w_up"], np.float64),
        w_down=np.asarray(weight_scales["w_down"], np.float64),
        gate_act=np.array(gate_act), up_act=np.array(up_act), silu_act=np.array(silu_act),
        hidden_act=np.array(hidden_act), expert_out=max(y_peak) / amax, out=1.0,
    )
    out = moe_layer_float(np.asarray(x), weights, provisional, top_k).out
    return MoEScales(**{**provisional.__dict__, "out": peak(out) / amax})

