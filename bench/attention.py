"""Attention on one tile (Verilator): prefill utilisation, decode against its bandwidth
bound, and where the cycles go.

The gpt-oss-shaped miniature's full-causal layer (16 query heads on 2 KV heads, head
dim 32, 16-token pages) runs on one N = 8 tile: a prefill of 32 prompt tokens, then
decode steps at a context of 1024 tokens (the cache filled through the KV port), every
output checked bit-exact against golden.

- utilisation (prefill) = useful MACs / (N² x cycles the GEMM engine is busy);
  ``_overall`` divides by every cycle of the program instead.
- bandwidth bound (decode) = distinct KV bytes the step must read / N bytes per cycle
  (the K and V pages reach the tensor core through one scratchpad port, one word per
  cycle); the ratio is the step's cycles over that bound. The compute bound = MACs / N²
  (P·V counts once: its two limbs are joined into one 16-bit A operand, one pass); with
  8 query heads per KV head on an 8 x 8 array the two bounds are close, so
  ``roofline_ratio`` = cycles / the larger bound is reported beside it.
- phase shares: the tile's exclusive cycle counters (GEMM engine alone busy, vector
  engine alone, both, DMA, none = the sequencer fetching or waiting) over all cycles.
"""

from __future__ import annotations

from sim.tile_run import simulate_attention, tile_config

WORKLOAD, LAYER = "gpt-oss", 1
N = 8
PHASES = ("gemm", "vec", "gemm_vec", "dma", "stall")

TARGETS: dict[str, tuple[str, float]] = {
    "attention__prefill__utilisation": (">=", 0.85),
    "attention__decode__bound_ratio": ("<=", 1.15),
}


def figures(result: dict, n: int = N) -> dict:
    """Bench metrics from a :func:`simulate_attention` result."""
    out: dict = {}
    prefill = [p for p in result["phases"] if p["phase"] == "prefill"]
    decode = [p for p in result["phases"] if p["phase"] == "decode"]
    for name, runs in (("prefill", prefill), ("decode", decode)):
        if not runs:
            continue
        cycles = sum(p["counters"]["cycles"] for p in runs)
        for phase in PHASES:
            share = sum(p["counters"][phase] for p in runs) / cycles
            out[f"attention__{name}__share_{phase}"] = round(share, 4)
    if prefill:
        p = prefill[0]
        c, macs = p["counters"], p["summary"]["macs"]
        busy = c["gemm"] + c["gemm_vec"]
        out["attention__prefill__cycles"] = c["cycles"]
        out["attention__prefill__utilisation"] = round(macs / (n * n * busy), 4)
        out["attention__prefill__utilisation_overall"] = round(macs / (n * n * c["cycles"]), 4)
    if decode:
        cycles = sum(p["counters"]["cycles"] for p in decode) / len(decode)
        bound = sum(p["summary"]["kv_bytes_unique"] / n for p in decode) / len(decode)
        compute = sum(p["summary"]["macs"] / (n * n) for p in decode) / len(decode)
        out["attention__decode__cycles_per_token"] = round(cycles, 1)
        out["attention__decode__bound_cycles"] = round(bound, 1)
        out["attention__decode__bound_ratio"] = round(cycles / bound, 3)
        out["attention__decode__compute_bound_cycles"] = round(compute, 1)
        out["attention__decode__roofline_ratio"] = round(cycles / max(bound, compute), 3)
        out["attention__decode__context"] = decode[0]["context"]
    speeds = [p["cycles_per_s"] for p in result["phases"] if p["cycles_per_s"]]
    if speeds:
        out["sim__tile__cycles_per_s"] = round(min(speeds))
    return out


def run(quick: bool) -> dict:
    config = tile_config(WORKLOAD, n=N)
    prefill, context, steps = (16, 256, 1) if quick else (32, 1024, 2)
    result = simulate_attention(config, WORKLOAD, LAYER, prefill=prefill, context=context,
                                steps=steps, seed=1)
    out = figures(result)
    print(f"  {WORKLOAD} layer {LAYER}: prefill {prefill} tokens in "
          f"{out['attention__prefill__cycles']} cycles (utilisation "
          f"{out['attention__prefill__utilisation']}), decode at {context + 1}: "
          f"{out['attention__decode__cycles_per_token']} cycles/token = "
          f"{out['attention__decode__bound_ratio']} x bound", flush=True)
    return out
