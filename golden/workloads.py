"""Model-shaped miniature workloads: configs, a registry, and seeded tensor generators.

Shapes are scaled down from the public models; ratios that matter to the hardware are
kept (query heads per KV head, top-k, routed experts per selected expert, a shared
expert, sinks, alternating sliding windows). Tensors are Gaussian with calibrated scales
and a few outlier channels, quantised per tensor (symmetric int8, max calibration).
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from numbers import Integral

import numpy as np

from golden.attention import (
    AttentionScales,
    attention_decode_float,
    attention_prefill_float,
    calibrate_out_scale,
)
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
    peak = float(np.abs(x).max())
    scale = peak / 127.0 if peak > 0 else 1.0 / 127.0
    return np.clip(np.rint(x / scale), -128, 127).astype(np.int8), scale


def _channel_gains(rng: np.random.Generator, dim: int, cfg: WorkloadConfig) -> np.ndarray:
    gains = np.ones(dim)
    n = min(cfg.outlier_channels, max(dim // 8, 0))
    gains[rng.choice(dim, size=n, replace=False)] = cfg.outlier_gain
    return gains


@dataclass
class AttentionLayerTensors:
    """Float tensors of one attention layer before quantisation."""

    q_prefill: np.ndarray
    k_prefill: np.ndarray
    v_prefill: np.ndarray
    q_decode: np.ndarray
    k_decode: list[np.ndarray] = field(default_factory=list)
    v_decode: list[np.ndarray] = field(default_factory=list)


def _attention_float(rng, cfg: WorkloadConfig, prefill: int, contexts) -> AttentionLayerTensors:
    kvh, d, dv = cfg.kv_heads, cfg.head_dim, cfg.v_head_dim
    k_gain = _channel_gains(rng, d, cfg)
    # Outlier channels sit in keys (and so queries), not values, as measured in LLMs.
    k_mean = rng.standard_normal((kvh, d)) * 0.5  # keys share a bias direction per head
    # Queries lean towards a per-head direction so some keys stand out (peaked attention),
    # and token 0 of every sequence is a strong "attention sink" token.
    q_dir = rng.standard_normal((cfg.heads, d))

    def keys(n: int) -> np.ndarray:
        k = rng.standard_normal((n, kvh, d)) * k_gain + k_mean
        k[0] += 1.5 * q_dir.reshape(kvh, -1, d).mean(axis=1)
        return k

    def values(n: int, k: np.ndarray) -> np.ndarray:
        if cfg.latent_kv:
            return k[..., :dv].copy()
        return rng.standard_normal((n, kvh, dv))

    def queries(n: int) -> np.ndarray:
        return rng.standard_normal((n, cfg.heads, d)) * k_gain + 0.7 * q_dir

    t = AttentionLayerTensors(queries(prefill), keys(prefill), None, queries(len(contexts)))
    t.v_prefill = values(prefill, t.k_prefill)
    for n in contexts:
        k = keys(n)
        t.k_decode.append(k)
        t.v_decode.append(values(n, k))
    # Scale q so the logits have the configured spread (measured on the prefill keys).
    group = cfg.heads // kvh
    kq = np.repeat(t.k_prefill - k_mean, group, axis=1)  # (T, H, d)
    z = np.einsum("thd,shd->hts", t.q_prefill, kq) * d**-0.5
    gain = cfg.logit_std / max(float(z.std()), 1e-9)
    t.q_prefill *= gain
    t.q_decode *= gain
    return t


@dataclass
class Workload:
    """A config, its int8/float tensors by name, and its scales (JSON-serialisable dicts)."""

    config: WorkloadConfig
    tensors: dict[str, np.ndarray]
    scales: dict[str, dict]

    def attention_scales(self, layer: int, phase: str) -> AttentionScales:
        s = self.scales[f"attn{layer}"]
        return AttentionScales(s["q"], s["k"], s["v"], s[f"out_{phase}"], s.get("softmax_scale"))

    def moe_weights(self) -> MoEWeights:
        t = self.tensors
        return MoEWeights(t["moe.router"], t["moe.w_gate"], t["moe.w_up"], t["moe.w_down"],
                          self.config.shared_experts)

    def moe_scales(self) -> MoEScales:
        return MoEScales.from_json(self.scales["moe"])

    def sinks(self, layer: int) -> np.ndarray | None:
        return self.tensors.get(f"attn{layer}.sinks")


def generate(
    cfg: WorkloadConfig | str,
    seed: int | None = None,
    decode_context_lens: tuple[int, ...] | None = None,
    prefill_tokens: int | None = None,
    moe_tokens: int | None = None,
) -> Workload:
    """Seeded, deterministic tensors for every layer of ``cfg`` (calibrated scales included)."""
    if isinstance(cfg, str):
        cfg = get_workload(cfg)
    overrides = {
        k: v for k, v in {
            "seed": seed, "decode_context_lens": decode_context_lens,
            "prefill_tokens": prefill_tokens, "moe_tokens": moe_tokens,
        }.items() if v is not None
    }
    cfg = replace(cfg, **overrides) if overrides else cfg
    rng = np.random.default_rng(cfg.seed)
    tensors: dict[str, np.ndarray] = {}
    scales: dict[str, dict] = {}
    contexts = tuple(int(c) for c in cfg.decode_context_lens)
    for layer, window in enumerate(cfg.windows):
        t = _attention_float(rng, cfg, cfg.prefill_tokens, contexts)
        p = f"attn{layer}."
        q_i, s_q = quantize(np.concatenate([t.q_prefill.ravel(), t.q_decode.ravel()]))
        k_i, s_k = quantize(np.concatenate([t.k_prefill.ravel()] + [k.ravel() for k in t.k_decode]))
        if cfg.latent_kv:
            s_v = s_k
        else:
            all_v = [t.v_prefill.ravel()] + [v.ravel() for v in t.v_decode]
            s_v = quantize(np.concatenate(all_v))[1]

        def q8(x, s):
            return np.clip(np.rint(x / s), -128, 127).astype(np.int8)

        tensors[p + "q_prefill"] = q8(t.q_prefill, s_q)
        tensors[p + "k_prefill"] = q8(t.k_prefill, s_k)
        tensors[p + "v_prefill"] = q8(t.v_prefill, s_v)
        tensors[p + "q_decode"] = q8(t.q_decode, s_q)
        cache, table = build_cache(
            [q8(k, s_k) for k in t.k_decode], [q8(v, s_v) for v in t.v_decode],
            cfg.page_size, rng=rng,
        )
        tensors[p + "k_pages"] = cache.k_pages
        tensors[p + "v_pages"] = cache.v_pages
        tensors[p + "block_table"] = table
        tensors[p + "context_lens"] = np.array(contexts, np.int64)
        if cfg.sinks:
            tensors[p + "sinks"] = rng.normal(1.0, 1.0, cfg.heads)
        sinks = tensors.get(p + "sinks")
        base = AttentionScales(s_q, s_k, s_v, 1.0)
        o_pre = attention_prefill_float(
            tensors[p + "q_prefill"], tensors[p + "k_prefill"], tensors[p + "v_prefill"], base,
            window=window, sinks=sinks,
        )
        o_dec = attention_decode_float(
            tensors[p + "q_decode"], cache, table, tensors[p + "context_lens"], base,
            window=window, sinks=sinks,
        )
        scales[f"attn{layer}"] = {
            "q": s_q, "k": s_k, "v": s_v, "softmax_scale": None, "window": window,
            "out_prefill": calibrate_out_scale(o_pre), "out_decode": calibrate_out_scale(o_dec),
        }

    # MoE: hidden states with outlier channels; weights ~ N(0, 1/fan_in) per expert.
    h, e_all = cfg.hidden, cfg.experts + cfg.shared_experts
    x = rng.standard_normal((cfg.moe_tokens, h)) * _channel_gains(rng, h, cfg)
    x_i, s_x = quantize(x)
    router = rng.standard_normal((h, cfg.experts))
    router *= cfg.router_std / float((x_i * s_x @ router).std())
    r_i, s_r = quantize(router)
    weight_scales = {}
    for name, shape, fan in (
        ("w_gate", (h, cfg.ffn), h), ("w_up", (h, cfg.ffn), h), ("w_down", (cfg.ffn, h), cfg.ffn),
    ):
        w = rng.standard_normal((e_all, *shape)) / np.sqrt(fan)
        peak = np.abs(w).reshape(e_all, -1).max(axis=1)
        s = peak / 127.0
        tensors["moe." + name] = np.clip(np.rint(w / s[:, None, None]), -128, 127).astype(np.int8)
        weight_scales[name] = s
    tensors["moe.x"] = x_i
    tensors["moe.router"] = r_i
    weights = MoEWeights(r_i, tensors["moe.w_gate"], tensors["moe.w_up"], tensors["moe.w_down"],
                         cfg.shared_experts)
    scales["moe"] = calibrate_moe_scales(x_i, weights, s_x, s_r, weight_scales, cfg.top_k).to_json()
    return Workload(cfg, tensors, scales)
