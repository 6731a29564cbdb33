"""Golden-model accuracy (integer vs float64) and speed, over the miniature workloads.

For each model-shaped workload and each decode context (up to 4096) a workload is
generated with that context (scales calibrated on it), every attention layer is run in
prefill and decode, and the MoE layer once. Reported: the worst attention cosine and
LSB error, the worst MoE cosine, and seconds per golden decode step at context 4096.
"""

from __future__ import annotations

import time

import numpy as np

from golden.attention import attention_decode
from golden.expected import accuracy, compute_expected
from golden.kv_cache import PagedKVCache
from golden.moe import moe_layer
from golden.workloads import generate

WORKLOADS = ("gpt-oss", "deepseek-r1", "kimi-k2")
CONTEXTS = (1, 2, 15, 16, 17, 129, 1000, 2047, 4096)
QUICK_CONTEXTS = (1, 17, 4096)
STEP_CONTEXT = 4096

TARGETS = {
    "golden__attention__cosine_min": (">=", 0.999),
    "golden__attention__max_lsb_error": ("<=", 3),
    "golden__moe__cosine_min": (">=", 0.99),
}


def _slug(name: str) -> str:
    return name.replace("-", "_")


def _seconds(fn, repeats: int) -> float:
    fn()  # warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def run(quick: bool) -> dict:
    contexts = QUICK_CONTEXTS if quick else CONTEXTS
    cos_attn, lsb_attn, cos_moe = [], [], []
    metrics: dict = {}
    for name in WORKLOADS:
        for context in contexts:
            wl = generate(name, decode_context_lens=(context,),
                          prefill_tokens=min(context, 256), moe_tokens=32)
            acc = accuracy(wl, compute_expected(wl))
            cos_attn += [v for k, v in acc.items() if k.startswith("attn") and "cosine" in k]
            lsb_attn += [v for k, v in acc.items() if k.endswith("max_lsb_error")]
            cos_moe.append(acc["moe.cosine"])
        # Speed: one decode step (batch 1, all heads, every attention layer) at 4096.
        wl = generate(name, decode_context_lens=(STEP_CONTEXT,), prefill_tokens=16, moe_tokens=1)
        t = wl.tensors

        def decode_step(wl=wl, t=t) -> None:
            for layer, window in enumerate(wl.config.windows):
                p = f"attn{layer}."
                attention_decode(
                    t[p + "q_decode"], PagedKVCache(t[p + "k_pages"], t[p + "v_pages"]),
                    t[p + "block_table"], t[p + "context_lens"],
                    wl.attention_scales(layer, "decode"), window=window, sinks=wl.sinks(layer),
                )

        def moe_step(wl=wl, t=t) -> None:
            moe_layer(t["moe.x"], wl.moe_weights(), wl.moe_scales(), wl.config.top_k)

        repeats = 2 if quick else 5
        metrics[f"golden__attention__decode_s_per_step_{_slug(name)}"] = _seconds(
            decode_step, repeats)
        metrics[f"golden__moe__s_per_token_{_slug(name)}"] = _seconds(moe_step, repeats)
    metrics["golden__attention__cosine_min"] = float(np.min(cos_attn))
    metrics["golden__attention__max_lsb_error"] = float(np.max(lsb_attn))
    metrics["golden__moe__cosine_min"] = float(np.min(cos_moe))
    return metrics
