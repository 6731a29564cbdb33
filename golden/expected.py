"""Expected outputs of a workload: every integer model, its float64 twin, and their distance."""

from __future__ import annotations

import numpy as np

from golden.attention import (
    attention_decode,
    attention_decode_float,
    attention_prefill,
    attention_prefill_float,
    cosine,
    lsb_error,
)
from golden.decoder import project_residual, project_residual_float
from golden.gemm import Saturation
from golden.kv_cache import PagedKVCache
from golden.moe import moe_layer, moe_layer_float
from golden.workloads import Workload
from spec.numerics import NUMERICS, Numerics


def compute_expected(wl: Workload, numerics: Numerics = NUMERICS,
                     saturation: dict[str, Saturation] | None = None) -> dict[str, np.ndarray]:
    """Integer outputs (``*.out``, bit-exact with the RTL) and float64 twins (``*.ref``).

    Attention layer i: ``attn{i}.prefill.out`` (T, H, dv) int8 with prefill key blocks of
    ``page_size`` keys, ``attn{i}.decode.out`` (B, H, dv) int8, ``attn{i}.proj.out`` (T',
    hidden) int8 the MoE input after layer i (``golden.decoder``: its prefill outputs
    projected into the residual stream ``moe.x``, T' the tokens both hold). MoE:
    ``moe.out`` (T, H) int8, ``moe.experts`` (T, k), ``moe.gates`` (T, k) Q0.15,
    ``moe.load`` (E,). ``saturation``
    (a dict, filled when given) receives per integer output ``X.out`` the values its
    model clamped to int8 (for the MoE layer, its intermediate results' too).
    """
    cfg, t = wl.config, wl.tensors
    out: dict[str, np.ndarray] = {}
    counts: dict[str, Saturation] = {} if saturation is None else saturation
    for layer, window in enumerate(cfg.windows):
        p = f"attn{layer}."
        sinks = wl.sinks(layer)
        scales = wl.attention_scales(layer)
        args = (t[p + "q_prefill"], t[p + "k_prefill"], t[p + "v_prefill"], scales)
        out[p + "prefill.out"] = attention_prefill(
            *args, window=window, sinks=sinks, block_keys=cfg.page_size, numerics=numerics,
            saturation=counts.setdefault(p + "prefill.out", Saturation()),
        )
        out[p + "prefill.ref"] = attention_prefill_float(*args, window=window, sinks=sinks)
        cache = PagedKVCache(t[p + "k_pages"], t[p + "v_pages"])
        args = (t[p + "q_decode"], cache, t[p + "block_table"], t[p + "context_lens"], scales)
        out[p + "decode.out"] = attention_decode(
            *args, window=window, sinks=sinks, numerics=numerics,
            saturation=counts.setdefault(p + "decode.out", Saturation()),
        )
        out[p + "decode.ref"] = attention_decode_float(*args, window=window, sinks=sinks)
        # The MoE input after this layer: its prefill outputs projected into the residual
        # stream (moe.x), for the tokens both cover.
        both = min(t["moe.x"].shape[0], t[p + "q_prefill"].shape[0])
        args = (out[p + "prefill.out"][:both].reshape(both, -1), t[p + "w_o"],
                t["moe.x"][:both], wl.projection_scales(layer))
        out[p + "proj.out"] = project_residual(
            *args, numerics=numerics,
            saturation=counts.setdefault(p + "proj.out", Saturation()))
        out[p + "proj.ref"] = project_residual_float(*args)
    weights, scales = wl.moe_weights(), wl.moe_scales()
    r = moe_layer(t["moe.x"], weights, scales, cfg.top_k, numerics,
                  saturation=counts.setdefault("moe.out", Saturation()))
    f = moe_layer_float(t["moe.x"], weights, scales, cfg.top_k)
    out.update({
        "moe.out": r.out, "moe.experts": r.experts, "moe.gates": r.gates, "moe.load": r.load,
        "moe.ref": f.out, "moe.ref_experts": f.experts, "moe.ref_gates": f.gates,
    })
    return out


def accuracy(wl: Workload, expected: dict[str, np.ndarray],
             saturation: dict[str, Saturation] | None = None) -> dict[str, float]:
    """Cosine and worst LSB error of each integer output against its float64 twin.

    Cosines are over a phase's whole output tensor (a prefill, or a decode batch);
    ``decode.cosine_min_seq`` is the worst single sequence of the batch, which also
    measures how well the layer's one output scale fits contexts of different lengths.
    With ``saturation`` (from :func:`compute_expected`), ``X.saturated`` counts the
    values clamped to int8 for output ``X`` (zero under a calibration that holds).
    """
    cfg = wl.config
    acc: dict[str, float] = {}
    for layer in range(len(cfg.windows)):
        p = f"attn{layer}."
        s = wl.attention_scales(layer).out
        for phase in ("prefill", "decode"):
            y, ref = expected[p + phase + ".out"], expected[p + phase + ".ref"]
            acc[p + phase + ".cosine"] = cosine(y * s, ref)
            if phase == "decode":
                acc[p + "decode.cosine_min_seq"] = min(
                    cosine(a * s, b) for a, b in zip(y, ref, strict=True)
                )
            acc[p + phase + ".max_lsb_error"] = lsb_error(y, ref, s)
        proj = expected[p + "proj.out"], expected[p + "proj.ref"]
        s_x = wl.projection_scales(layer).hidden
        acc[p + "proj.cosine"] = cosine(proj[0] * s_x, proj[1])
        acc[p + "proj.max_lsb_error"] = lsb_error(*proj, s_x)
    s_out = wl.moe_scales().out
    acc["moe.cosine"] = cosine(expected["moe.out"] * s_out, expected["moe.ref"])
    for name, counts in (saturation or {}).items():
        acc[name.removesuffix(".out") + ".saturated"] = float(counts.saturated)
    acc["moe.topk_equal"] = float(np.array_equal(expected["moe.experts"],
                                                 expected["moe.ref_experts"]))
    return acc
