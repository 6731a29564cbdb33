"""Model-shaped miniature workloads: configs, a registry, and seeded tensor generators.

Shapes are scaled down from the public models; ratios that matter to the hardware are
kept (query heads per KV head, top-k, routed experts per selected expert, a shared
expert, sinks, alternating sliding windows). Tensors are Gaussian with calibrated scales
and a few outlier channels, quantised per tensor (symmetric int8, max calibration).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace
from numbers import Integral

import numpy as np

from golden.attention import (
    AttentionScales,
    attention_decode_float,
    attention_prefill,
    attention_prefill_float,
    calibrate_out_scale,
)
from golden.decoder import ProjectionScales, project_residual
from golden.gemm import HEADROOM_LSB
from golden.kv_cache import build_cache
from golden.moe import MoEScales, MoEWeights, calibrate_moe_scales


@dataclass(frozen=True)
class WorkloadConfig:
    """One model-shaped layer stack: attention layers (one per window entry) and a MoE FFN."""

    name: str
    #: What the miniature is shaped after, in words.
    shaped_after: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    #: Value head dim; with ``latent_kv`` the values are the first ``v_head_dim`` key
    #: channels (an MLA-style shared latent read as MQA at decode).
    v_head_dim: int
    latent_kv: bool
    #: One attention layer per entry: a sliding window in tokens, or None for full causal.
    windows: tuple[int | None, ...]
    sinks: bool
    page_size: int
    experts: int
    top_k: int
    ffn: int
    shared_experts: int
    prefill_tokens: int
    decode_context_lens: tuple[int, ...]
    moe_tokens: int
    seed: int = 0
    #: Target standard deviation of the attention logits q.k*scale (natural units).
    logit_std: float = 2.5
    #: Channels (per tensor) whose magnitude is ``outlier_gain`` times the rest.
    outlier_channels: int = 2
    outlier_gain: float = 6.0
    #: Standard deviation of the router logits.
    router_std: float = 2.0

    def __post_init__(self) -> None:
        for name in ("hidden", "heads", "kv_heads", "head_dim", "v_head_dim", "page_size",
                     "experts", "top_k", "ffn", "prefill_tokens", "moe_tokens",
                     "shared_experts", "outlier_channels"):
            value, least = getattr(self, name), int(name not in ("shared_experts",
                                                                 "outlier_channels"))
            if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
                raise ValueError(f"{self.name}: {name} must be an integer >= {least}, "
                                 f"not {value!r}")
        if not self.windows or any(w is not None and (not isinstance(w, Integral) or w < 1)
                                   for w in self.windows):
            raise ValueError(f"{self.name}: windows must list one attention layer or more, "
                             f"each a window >= 1 token or None, not {self.windows!r}")
        if not self.decode_context_lens:
            raise ValueError(f"{self.name}: decode_context_lens lists no context")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.name}: {self.heads} heads not a multiple of {self.kv_heads}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"{self.name}: top_k {self.top_k} outside 1..{self.experts}")
        if self.latent_kv and self.v_head_dim > self.head_dim:
            raise ValueError(f"{self.name}: latent values need v_head_dim <= head_dim")
        if min(self.decode_context_lens, default=1) < 1 or self.prefill_tokens < 1:
            raise ValueError(f"{self.name}: contexts must be >= 1 token")

    def to_json(self) -> dict:
        d = asdict(self)
        d["windows"] = list(self.windows)
        d["decode_context_lens"] = list(self.decode_context_lens)
        return d

    @classmethod
    def from_json(cls, d: dict) -> WorkloadConfig:
        required = {f.name for f in fields(cls) if f.default is MISSING}
        if missing := sorted(required - d.keys()):
            raise ValueError(f"a workload config lacks {', '.join(missing)}")
        d = dict(d)
        d["windows"] = tuple(d["windows"])
        d["decode_context_lens"] = tuple(d["decode_context_lens"])
        return cls(**d)


WORKLOADS: dict[str, WorkloadConfig] = {
    "tiny": WorkloadConfig(
        name="tiny", shaped_after="nothing: smallest shapes exercising every feature",
        hidden=32, heads=6, kv_heads=2, head_dim=12, v_head_dim=12, latent_kv=False,
        windows=(5, None), sinks=True, page_size=4, experts=6, top_k=2, ffn=16,
        shared_experts=1, prefill_tokens=11, decode_context_lens=(1, 6, 13), moe_tokens=8,
    ),
    "gpt-oss": WorkloadConfig(
        name="gpt-oss",
        shaped_after="GPT-OSS-120B: 64 q : 8 kv heads, head_dim 64, sinks, window 128 on "
        "alternate layers, 128 experts top-4, no shared expert",
        hidden=128, heads=16, kv_heads=2, head_dim=32, v_head_dim=32, latent_kv=False,
        windows=(128, None), sinks=True, page_size=16, experts=32, top_k=4, ffn=64,
        shared_experts=0, prefill_tokens=160, decode_context_lens=(1, 77, 300, 1500),
        moe_tokens=32, seed=120,
    ),
    "deepseek-r1": WorkloadConfig(
        name="deepseek-r1",
        shaped_after="DeepSeek-R1: MLA (latent 512 + rope 64) read as MQA at decode, "
        "256 routed experts top-8 + 1 shared",
        hidden=256, heads=16, kv_heads=1, head_dim=40, v_head_dim=32, latent_kv=True,
        windows=(None,), sinks=False, page_size=16, experts=32, top_k=8, ffn=32,
        shared_experts=1, prefill_tokens=128, decode_context_lens=(3, 200, 1024),
        moe_tokens=32, seed=671,
    ),
    "kimi-k2": WorkloadConfig(
        name="kimi-k2",
        shaped_after="Kimi-K2: MLA as DeepSeek-V3 with 64 heads, 384 experts top-8 + 1 shared",
        hidden=256, heads=8, kv_heads=1, head_dim=40, v_head_dim=32, latent_kv=True,
        windows=(None,), sinks=False, page_size=16, experts=48, top_k=8, ffn=32,
        shared_experts=1, prefill_tokens=128, decode_context_lens=(5, 333, 2048),
        moe_tokens=32, seed=1000,
    ),
}


def get_workload(name: str, **overrides) -> WorkloadConfig:
    """The registered config ``name`` (optionally with fields replaced)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    return replace(WORKLOADS[name], **overrides) if overrides else WORKLOADS[name]


def quantize(x: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric per-tensor int8: scale = max|x| / 127, codes rounded half to even."""
    scale = _peak_scale([x])
    return _q8(x, scale), scale


def _q8(x: np.ndarray, scale: float) -> np.ndarray:
    """int8 codes of ``x`` at ``scale``, rounded half to even and clamped."""
    return np.clip(np.rint(x / scale), -128, 127).astype(np.int8)


def _peak_scale(arrays: list[np.ndarray]) -> float:
    """The scale that maps the largest |value| of ``arrays`` to 127."""
    peak = max(float(np.abs(a).max()) for a in arrays)
    return peak / 127.0 if peak > 0 else 1.0 / 127.0


def _channel_gains(rng: np.random.Generator, dim: int, cfg: WorkloadConfig) -> np.ndarray:
    gains = np.ones(dim)
    n = min(cfg.outlier_channels, max(dim // 8, 0))
    gains[rng.choice(dim, size=n, replace=False)] = cfg.outlier_gain
    return gains


def _stream(seed: int, *key: int) -> np.random.Generator:
    """An independent random stream per (seed, purpose, ...): what one stream draws never
    shifts another, so a layer's weights do not depend on how many tokens are drawn, and
    token t of a sequence is the same whatever its length."""
    return np.random.default_rng([seed, *key])


#: Stream purposes (the second word of every stream's key).
_LAYER, _TOKENS, _MOE_WEIGHTS, _MOE_TOKENS = range(4)
#: Tokens drawn from a layer's own stream to set its logit gain and router scale.
_CALIBRATION_TOKENS = 64


@dataclass
class _AttentionLayerParams:
    """What fixes an attention layer's token distribution: the weight side of q, k, v."""

    k_gain: np.ndarray
    k_mean: np.ndarray
    q_dir: np.ndarray
    q_gain: float
    sinks: np.ndarray | None
    #: The output projection (H·d_v, hidden), real: the projected attention output of
    #: the layer's own sample tokens has unit standard deviation, like the residual
    #: stream's ordinary channels.
    w_o: np.ndarray | None = None

    @classmethod
    def draw(cls, cfg: WorkloadConfig, seed: int, layer: int) -> _AttentionLayerParams:
        rng = _stream(seed, _LAYER, layer)
        d = cfg.head_dim
        # Outlier channels sit in keys (and so queries), not values, as measured in LLMs.
        # With latent KV the values are the keys' first v_head_dim channels (the latent),
        # so the outliers go to the channels past them (the decoupled rope part of MLA).
        k_gain = np.ones(d)
        rope = d - cfg.v_head_dim if cfg.latent_kv else 0
        k_gain[d - rope if rope else 0:] = _channel_gains(rng, rope or d, cfg)
        k_mean = rng.standard_normal((cfg.kv_heads, d)) * 0.5  # a bias direction per KV head
        # Queries lean towards a per-head direction so some keys stand out (peaked
        # attention), and token 0 of every sequence is a strong "attention sink" token.
        q_dir = rng.standard_normal((cfg.heads, d))
        sinks = rng.normal(1.0, 1.0, cfg.heads) if cfg.sinks else None
        params = cls(k_gain, k_mean, q_dir, 1.0, sinks)
        # q's gain sets the logits' spread, measured on tokens of the layer's own stream.
        n = _CALIBRATION_TOKENS
        q = params.queries(rng.standard_normal((n, cfg.heads, d)))
        k = params.keys(rng.standard_normal((n, cfg.kv_heads, d)), cfg) - k_mean
        kq = np.repeat(k, cfg.heads // cfg.kv_heads, axis=1)
        z = np.einsum("thd,shd->hts", q, kq) * d**-0.5
        params.q_gain = cfg.logit_std / max(float(z.std()), 1e-9)
        v = k[..., :cfg.v_head_dim] + k_mean[..., :cfg.v_head_dim] if cfg.latent_kv else \
            rng.standard_normal((n, cfg.kv_heads, cfg.v_head_dim))
        o = _causal_attention(z * params.q_gain, v, cfg)
        w_o = rng.standard_normal((cfg.heads * cfg.v_head_dim, cfg.hidden))
        params.w_o = w_o / (np.sqrt(w_o.shape[0]) * max(float(np.sqrt((o**2).mean())), 1e-9))
        return params

    def queries(self, noise: np.ndarray) -> np.ndarray:
        return (noise * self.k_gain + 0.7 * self.q_dir) * self.q_gain

    def keys(self, noise: np.ndarray, cfg: WorkloadConfig) -> np.ndarray:
        k = noise * self.k_gain + self.k_mean
        k[:1] += 1.5 * self.q_dir.reshape(cfg.kv_heads, -1, cfg.head_dim).mean(axis=1)
        return k


def _causal_attention(z: np.ndarray, v: np.ndarray, cfg: WorkloadConfig) -> np.ndarray:
    """float64 causal attention of logits ``z`` (H, T, T) over values ``v`` (T, H_kv,
    d_v): outputs (T, H·d_v)."""
    t = z.shape[1]
    z = np.where(np.tril(np.ones((t, t), bool)), z, -np.inf)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    vh = np.repeat(v, cfg.heads // cfg.kv_heads, axis=1)  # (T, H, d_v)
    return np.einsum("hts,shd->thd", p, vh).reshape(t, -1)


def _sequence_tokens(cfg: WorkloadConfig, params: _AttentionLayerParams, seed: int,
                     layer: int, sequence: int, n: int):
    """Float q (n, H, d), k (n, H_kv, d), v (n, H_kv, dv) of tokens 0..n-1 of a sequence."""
    kvh, d = cfg.kv_heads, cfg.head_dim
    q = params.queries(_stream(seed, _TOKENS, layer, sequence, 0)
                       .standard_normal((n, cfg.heads, d)))
    k = params.keys(_stream(seed, _TOKENS, layer, sequence, 1).standard_normal((n, kvh, d)), cfg)
    if cfg.latent_kv:
        v = k[..., :cfg.v_head_dim].copy()
    else:
        v = _stream(seed, _TOKENS, layer, sequence, 2).standard_normal((n, kvh, cfg.v_head_dim))
    return q, k, v


@dataclass
class Workload:
    """A config, its int8/float tensors by name, and its scales (JSON-serialisable dicts).

    A workload is one sequence of a batch: :func:`generate_batch` gives every sequence of
    a batch the same weights and scales (one calibration per layer)."""

    config: WorkloadConfig
    tensors: dict[str, np.ndarray]
    scales: dict[str, dict]

    def attention_scales(self, layer: int) -> AttentionScales:
        s = self.scales[f"attn{layer}"]
        return AttentionScales(s["q"], s["k"], s["v"], s["out"], s.get("softmax_scale"))

    def moe_weights(self) -> MoEWeights:
        t = self.tensors
        return MoEWeights(t["moe.router"], t["moe.w_gate"], t["moe.w_up"], t["moe.w_down"],
                          self.config.shared_experts)

    def moe_scales(self) -> MoEScales:
        return MoEScales.from_json(self.scales["moe"])

    def sinks(self, layer: int) -> np.ndarray | None:
        return self.tensors.get(f"attn{layer}.sinks")

    def projection_scales(self, layer: int) -> ProjectionScales:
        """Scales of attention layer ``layer``'s output projection into the residual
        stream (``golden.decoder``)."""
        s = self.scales[f"attn{layer}"]
        return ProjectionScales(s["out"], s["w_o"], self.scales["moe"]["x"])


def generate(
    cfg: WorkloadConfig | str,
    seed: int | None = None,
    decode_context_lens: tuple[int, ...] | None = None,
    prefill_tokens: int | None = None,
    moe_tokens: int | None = None,
) -> Workload:
    """Seeded, deterministic tensors for every layer of ``cfg`` (calibrated scales
    included): the first sequence of :func:`generate_batch`."""
    return generate_batch(cfg, 1, seed=seed, decode_context_lens=decode_context_lens,
                          prefill_tokens=prefill_tokens, moe_tokens=moe_tokens)[0]


def generate_batch(
    cfg: WorkloadConfig | str,
    batch: int,
    seed: int | None = None,
    decode_context_lens: tuple[int, ...] | None = None,
    prefill_tokens: int | None = None,
    moe_tokens: int | None = None,
) -> list[Workload]:
    """``batch`` sequences of one layer stack: the same weights and scales, each its own
    tokens. Seeded and deterministic; every random stream is independent
    (:func:`_stream`), so the weights do not depend on the token counts and a longer
    sequence begins with the tokens of a shorter one.

    Per sequence and attention layer: ``q/k/v_prefill`` of ``prefill_tokens`` tokens,
    and a decode batch — one query per entry of ``decode_context_lens``, each the newest
    token of the sequence at that length (its keys and values paged into ``k/v_pages``).
    MoE: ``moe.x``, the sequence's first ``moe_tokens`` hidden states.

    One calibration per layer over everything the batch holds (max calibration; input
    scales map the peak to 127, output and activation scales keep
    :data:`golden.gemm.HEADROOM_LSB` codes free, and an attention output scale is capped
    by the largest |V|: see :func:`golden.attention.calibrate_out_scale`).
    """
    if isinstance(cfg, str):
        cfg = get_workload(cfg)
    overrides = {
        k: v for k, v in {
            "seed": seed, "decode_context_lens": decode_context_lens,
            "prefill_tokens": prefill_tokens, "moe_tokens": moe_tokens,
        }.items() if v is not None
    }
    cfg = replace(cfg, **overrides) if overrides else cfg
    if isinstance(batch, bool) or not isinstance(batch, Integral) or batch < 1:
        raise ValueError(f"batch must be an integer >= 1, not {batch!r}")
    if cfg.seed < 0:
        raise ValueError(f"seed must be >= 0, not {cfg.seed}")
    tensors: list[dict[str, np.ndarray]] = [{} for _ in range(batch)]
    scales: dict[str, dict] = {}
    contexts = tuple(int(c) for c in cfg.decode_context_lens)
    tokens = max(cfg.prefill_tokens, *contexts)
    projections = []  # per layer: its output projection (Projection)
    for layer, window in enumerate(cfg.windows):
        projection, scales[f"attn{layer}"] = _attention_tensors(cfg, layer, window, tensors,
                                                                 contexts, tokens)
        projections.append(projection)
    scales["moe"] = _moe_tensors(cfg, tensors, projections)
    return [Workload(cfg, t, scales) for t in tensors]


@dataclass(frozen=True)
class Projection:
    """An attention layer's output projection, for calibrating the MoE layer: ``w_o``
    (int8) and its scale ``s_wo``, the attention output scale ``out``, and each
    sequence's prefill outputs (T, H·d_v), in real units (float64, ``outputs``) and as
    the chip computes them (int8, ``chip_outputs``)."""

    w_o: np.ndarray
    s_wo: float
    out: float
    outputs: list[np.ndarray]
    chip_outputs: list[np.ndarray]

    @property
    def w_o_real(self) -> np.ndarray:
        return self.w_o * self.s_wo


def _attention_tensors(cfg: WorkloadConfig, layer: int, window: int | None,
                       tensors: list[dict], contexts: tuple[int, ...], tokens: int):
    """Attention layer ``layer``'s tensors into each sequence's ``tensors``: its
    projection (:class:`Projection`) and scales."""
    params = _AttentionLayerParams.draw(cfg, cfg.seed, layer)
    seqs = [_sequence_tokens(cfg, params, cfg.seed, layer, s, tokens)
            for s in range(len(tensors))]
    s_q = _peak_scale([q for q, _, _ in seqs])
    s_k = _peak_scale([k for _, k, _ in seqs])
    s_v = s_k if cfg.latent_kv else _peak_scale([v for _, _, v in seqs])
    p = f"attn{layer}."
    base = AttentionScales(s_q, s_k, s_v, 1.0)
    peaks, v_peak = [], 0.0
    for s, (q, k, v) in enumerate(seqs):
        t = tensors[s]
        q8, k8, v8 = _q8(q, s_q), _q8(k, s_k), _q8(v, s_v)
        n = cfg.prefill_tokens
        t[p + "q_prefill"], t[p + "k_prefill"], t[p + "v_prefill"] = q8[:n], k8[:n], v8[:n]
        t[p + "q_decode"] = np.stack([q8[c - 1] for c in contexts])
        cache, table = build_cache([k8[:c] for c in contexts], [v8[:c] for c in contexts],
                                   cfg.page_size, rng=_stream(cfg.seed, _TOKENS, layer, s, 3))
        t[p + "k_pages"], t[p + "v_pages"] = cache.k_pages, cache.v_pages
        t[p + "block_table"] = table
        t[p + "context_lens"] = np.array(contexts, np.int64)
        if params.sinks is not None:
            t[p + "sinks"] = params.sinks
        peaks.append(attention_prefill_float(t[p + "q_prefill"], t[p + "k_prefill"],
                                             t[p + "v_prefill"], base, window=window,
                                             sinks=params.sinks))
        peaks.append(attention_decode_float(t[p + "q_decode"], cache, table,
                                            t[p + "context_lens"], base, window=window,
                                            sinks=params.sinks))
        v_peak = max(v_peak, float(np.abs(v8[:tokens]).max()) * s_v)
    out = calibrate_out_scale(np.concatenate([o.ravel() for o in peaks]), v_peak)
    w_o, s_wo = quantize(params.w_o)
    for t in tensors:
        t[p + "w_o"] = w_o
    # The prefill outputs the chip computes (int8, keys in page blocks: a decode step's
    # output is the same row), which the MoE layer's inputs are projected from.
    chip = [attention_prefill(t[p + "q_prefill"], t[p + "k_prefill"], t[p + "v_prefill"],
                              replace(base, out=out), window=window, sinks=params.sinks,
                              block_keys=cfg.page_size) for t in tensors]
    projection = Projection(w_o, s_wo, out, [o.reshape(o.shape[0], -1) for o in peaks[::2]],
                            [o.reshape(o.shape[0], -1) for o in chip])
    return projection, {"q": s_q, "k": s_k, "v": s_v, "softmax_scale": None,
                        "window": window, "out": out, "w_o": s_wo}


def _moe_tensors(cfg: WorkloadConfig, tensors: list[dict], projections: list) -> dict:
    """The MoE layer's tensors into each sequence's ``tensors`` (the weights shared, each
    its own tokens ``moe.x``); its scales, calibrated on every token and on the layer's
    inputs after each attention layer (``projections``)."""
    # MoE: hidden states with outlier channels; weights ~ N(0, 1/fan_in) per expert.
    h, e_all = cfg.hidden, cfg.experts + cfg.shared_experts
    rng = _stream(cfg.seed, _MOE_WEIGHTS)
    gains = _channel_gains(rng, h, cfg)
    router = rng.standard_normal((h, cfg.experts))
    sample = rng.standard_normal((_CALIBRATION_TOKENS, h)) * gains
    router *= cfg.router_std / float((sample @ router).std())
    r_i, s_r = quantize(router)
    shared: dict[str, np.ndarray] = {"moe.router": r_i}
    weight_scales = {}
    for name, shape, fan in (
        ("w_gate", (h, cfg.ffn), h), ("w_up", (h, cfg.ffn), h), ("w_down", (cfg.ffn, h), cfg.ffn),
    ):
        w = rng.standard_normal((e_all, *shape)) / np.sqrt(fan)
        peak = np.abs(w).reshape(e_all, -1).max(axis=1)
        s = peak / 127.0
        shared["moe." + name] = np.clip(np.rint(w / s[:, None, None]), -128, 127).astype(np.int8)
        weight_scales[name] = s
    # The residual stream (the hidden states entering the layer, ``moe.x``) and the MoE
    # layer's input after each attention layer: residual + projected attention output
    # (golden.decoder), for the tokens both cover. The hidden scale holds both (in real
    # units); the activations are calibrated on the inputs as the chip computes them
    # (int8 attention outputs, the requantised projection, the clamped sum).
    xs = [_stream(cfg.seed, _MOE_TOKENS, s).standard_normal((cfg.moe_tokens, h)) * gains
          for s in range(len(tensors))]
    both = min(cfg.moe_tokens, cfg.prefill_tokens)
    inputs = [x[:both] + o[:both] @ pr.w_o_real for pr in projections
              for x, o in zip(xs, pr.outputs, strict=True)]
    s_x = max(_peak_scale(xs), _peak_scale(inputs) * 127.0 / (127.0 - HEADROOM_LSB))
    x_q = [_q8(x, s_x) for x in xs]
    x_all = np.concatenate(x_q)
    weights = MoEWeights(r_i, shared["moe.w_gate"], shared["moe.w_up"], shared["moe.w_down"],
                         cfg.shared_experts)
    chip_inputs = [project_residual(o[:both], pr.w_o, x[:both],
                                    ProjectionScales(pr.out, pr.s_wo, s_x))
                   for pr in projections for x, o in zip(x_q, pr.chip_outputs, strict=True)]
    calibration = np.concatenate([x_all] + chip_inputs)
    for s, t in enumerate(tensors):
        t.update(shared)
        t["moe.x"] = x_all[s * cfg.moe_tokens:(s + 1) * cfg.moe_tokens]
    return calibrate_moe_scales(calibration, weights, s_x, s_r, weight_scales,
                                cfg.top_k).to_json()
