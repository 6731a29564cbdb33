"""Attention on one tile as the host sees it: prefill a prompt, then decode token after
token, appending each new token's K/V to the paged cache — the programs, the KV requests
to issue before each one, and the golden output each must produce.

Pure Python (no simulator): the cocotb test, the CLI and the functional-model tests all
walk the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.attention import AttentionLayer, build_decode, build_prefill
from compiler.program import TileProgram
from golden.attention import attention_decode, attention_prefill
from golden.kv_cache import build_cache
from golden.workloads import generate
from rtl.scratchpad import KvOp
from spec.config import TileConfig

__all__ = ["Step", "attention_steps"]


@dataclass
class Step:
    """One program run: ``phase`` (prefill or decode), the tokens in the cache while it
    runs (``context``), the KV requests the host issues first, the golden output."""

    phase: str
    context: int
    program: TileProgram
    kv_requests: list[dict]
    expected: np.ndarray


class _KvHost:
    """What the host has already put into the cache: block-table entries and tokens."""

    def __init__(self):
        self.mapped: dict[tuple[int, int], int] = {}
        self.tokens = 0

    def requests(self, program: TileProgram, k: np.ndarray, v: np.ndarray) -> list[dict]:
        """MAPs for new block-table entries and APPENDs for new tokens, so that the cache
        holds ``k``/``v`` (every token so far) as ``program`` expects."""
        out = []
        for seq, index, phys in program.kv_map:
            known = self.mapped.get((seq, index))
            if known is None:
                self.mapped[seq, index] = phys
                out.append({"op": KvOp.MAP, "seq": seq, "index": index, "phys": phys})
            elif known != phys:
                raise ValueError(f"the program expects block-table entry ({seq}, {index}) at "
                                 f"page {phys}, but it holds page {known}: the page "
                                 "allocation is not stable as the context grows")
        for t in range(self.tokens, k.shape[0]):
            out += [{"op": KvOp.APPEND, "seq": s, "word": w, "data": d, "last": int(last)}
                    for s, w, d, last in program.kv.token_appends(k[t], v[t])]
        self.tokens = k.shape[0]
        return out


def attention_steps(config: TileConfig, workload: str, layer: int, *, prefill: int = 0,
                    context: int = 0, steps: int = 1, seed: int | None = None,
                    loops: bool | None = None) -> list[Step]:
    """Prefill ``prefill`` tokens (if > 0), then ``steps`` decode steps; the first decode
    step sees ``max(prefill, context)`` earlier tokens (the KV cache is filled directly
    beyond the prompt). Token tensors are the workload's prompt tensors, generated long
    enough for every step. ``loops``: as for ``compiler.attention.build_decode`` (True:
    every program with loops over its key blocks)."""
    start = max(prefill, context)
    total = start + steps
    wl = generate(workload, seed=seed, prefill_tokens=max(total, 1))
    if wl.config.page_size != config.page_size:
        raise ValueError(f"workload {workload} streams keys in pages of "
                         f"{wl.config.page_size} tokens; the tile config has page_size "
                         f"{config.page_size}")
    t = wl.tensors
    p = f"attn{layer}."
    q, k, v = t[p + "q_prefill"], t[p + "k_prefill"], t[p + "v_prefill"]
    window = wl.config.windows[layer]
    sinks = wl.sinks(layer)
    host = _KvHost()
    out = []
    if prefill:
        program = build_prefill(config, AttentionLayer.from_workload(wl, layer),
                                q[:prefill], k[:prefill], v[:prefill], loops=loops)
        expected = attention_prefill(q[:prefill], k[:prefill], v[:prefill],
                                     wl.attention_scales(layer), window=window,
                                     sinks=sinks, block_keys=config.page_size)
        out.append(Step("prefill", prefill, program,
                        host.requests(program, k[:prefill], v[:prefill]), expected))
    decode_layer = AttentionLayer.from_workload(wl, layer)
    scales = wl.attention_scales(layer)
    for position in range(start, total):
        length = position + 1
        program = build_decode(config, decode_layer, q[position], k[:length], v[:length],
                               loops=loops)
        cache, table = build_cache([k[:length]], [v[:length]], config.page_size)
        expected = attention_decode(q[position][None], cache, table, np.array([length]),
                                    scales, window=window, sinks=sinks)
        out.append(Step("decode", length, program,
                        host.requests(program, k[:length], v[:length]), expected))
    return out
