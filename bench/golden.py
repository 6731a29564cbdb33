"""Golden-model speed over the miniature workloads: seconds per golden decode step at
context 4096 (every attention layer) and per MoE layer call. Their accuracy is
``bench.accuracy``'s: measured on what the chip runs."""

from __future__ import annotations

import time

from golden.attention import attention_decode
from golden.kv_cache import PagedKVCache
from golden.moe import moe_layer
from golden.workloads import generate

WORKLOADS = ("gpt-oss", "deepseek-r1", "kimi-k2")
STEP_CONTEXT = 4096

TARGETS: dict = {}


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
    metrics: dict = {}
    for name in WORKLOADS:
        # Speed: one decode step (batch 1, all heads, every attention layer) at 4096.
        wl = generate(name, decode_context_lens=(STEP_CONTEXT,), prefill_tokens=16, moe_tokens=1)
        t = wl.tensors

        def decode_step(wl=wl, t=t) -> None:
            for layer, window in enumerate(wl.config.windows):
                p = f"attn{layer}."
                attention_decode(
                    t[p + "q_decode"], PagedKVCache(t[p + "k_pages"], t[p + "v_pages"]),
                    t[p + "block_table"], t[p + "context_lens"],
                    wl.attention_scales(layer), window=window, sinks=wl.sinks(layer),
                )

        def moe_step(wl=wl, t=t) -> None:
            moe_layer(t["moe.x"], wl.moe_weights(), wl.moe_scales(), wl.config.top_k)

        repeats = 2 if quick else 5
        metrics[f"golden__attention__decode_s_per_step_{_slug(name)}"] = _seconds(
            decode_step, repeats)
        metrics[f"golden__moe__s_per_token_{_slug(name)}"] = _seconds(moe_step, repeats)
    return metrics
