"""Chip benchmarks: the default chip (2 x 2, N = 8) on the gpt-oss-shaped miniature.

A decoder layer for a batch of 2 under ``local`` placement (prefill of 32 tokens, one
decode step from contexts 256/200 — ``compiler.chip.contexts``; attention then MoE, the
experts' weights streamed from the memory channels), and the same prefill and decode
step under ``striped`` and ``far`` placement (the MoE layer with its weights resident, so
that their decode jobs hand their outputs to it as local's do): the local/striped and
local/far decode speedups are the ratios of their decode attention cycles at the same
contexts (the MoE layer does not depend on where KV pages live); ``far`` also gives the
KV bytes a decode step loads from the memory channels. The agent loop: 3 turns
after a 32-token prompt (tool results of 8 tokens, answers of 2), the KV cache kept (hit)
or evicted and prefilled again (miss), end-to-end cycles of the decoder layer.
Simulation speed: chip cycles over the rounds' wall time (Verilator, cocotb polling every
64 cycles; build and host transfers excluded), of that run and of gpt-oss's layer for a
batch of 8 on a 4 x 4 chip (``chip__sim_4x4__cycles_per_s``). Energy (docs/energy.md):
the access model's pJ per token of a whole decode step under each placement (its
attention rounds and the local run's MoE rounds) and local over striped and far; the
cell-toggle proxy of two decode steps of attention for the batch (no prefill: contexts
256/192) under local and striped placement on the SAIF-traced build of the same chip,
E(local) / E(striped). The other
miniatures: their attention alone (their MoE layers do not fit a 2 x 2 chip), one build
each.
"""

from __future__ import annotations

from compiler.chip import agent_schedule
from golden.workloads import get_workload
from sim.chip_run import chip_config, chip_figures, round_bounds, round_energy, simulate_layer

WORKLOAD, LAYER, K, N, BATCH = "gpt-oss", 1, 2, 8, 2
#: Miniatures benchmarked by their attention alone, at the default chip.
ATTENTION_ONLY = ("tiny", "deepseek-r1", "kimi-k2")

TARGETS: dict[str, tuple[str, float]] = {
    "chip__sim__cycles_per_s": (">=", 50_000),
    "chip__sim_4x4__cycles_per_s": (">=", 20_000),
    "chip__gpt-oss__decode__memory_bound_ratio": ("<=", 1.3),
}


def attention_bound_ratio(result: dict, config) -> float:
    """A run's decode attention rounds' cycles over the largest of their roofline bounds
    (``sim.chip_run.round_bounds``, summed over the rounds)."""
    rounds = [r for r in result["rounds"] if r["phase"] == "decode"]
    bounds = [round_bounds(r, config) for r in rounds]
    largest = max(sum(b[name] for b in bounds) for name in bounds[0])
    return round(sum(r["cycles"] for r in rounds) / max(largest, 1), 3)


def run(quick: bool) -> dict:
    config = chip_config(WORKLOAD, k=K, n=N)
    context = 64 if quick else 256
    local = simulate_layer(config, WORKLOAD, LAYER, batch=BATCH, prefill=32, context=context,
                           steps=1, placement="local")
    # The other placements with the MoE layer too (its weights resident: faster, the same
    # attention rounds), their decode jobs handing it their outputs as local's do.
    striped, far = (simulate_layer(config, WORKLOAD, LAYER, batch=BATCH, prefill=32,
                                   context=context, steps=1, placement=placement,
                                   weights="resident")
                    for placement in ("striped", "far"))
    lf, sf, ff = (chip_figures(run, config) for run in (local, striped, far))
    out_far = {"chip__kv_local_over_far__decode_speedup": round(
        ff["chip__decode__attention_cycles"] / lf["chip__decode__attention_cycles"], 3),
        "chip__far__decode_kv_bytes_per_step": ff["chip__decode__memory_bytes_per_token"],
        "chip__far__decode__memory_bound_ratio": attention_bound_ratio(far, config)}
    out = {f"chip__{WORKLOAD}__{key.split('__', 1)[1]}": value for key, value in lf.items()
           if key.startswith(("chip__prefill__", "chip__decode__"))
           and not key.endswith("__phases")}
    out["chip__sim__cycles_per_s"] = lf["chip__sim__cycles_per_s"]
    out["chip__kv_local_over_striped__decode_speedup"] = round(
        sf["chip__decode__attention_cycles"] / lf["chip__decode__attention_cycles"], 3)
    out["chip__striped__decode_kv_words"] = sf["chip__network__kv_words"]
    out |= out_far

    # A whole decode step's energy per token under each placement (the access model): the
    # placement's attention rounds and the local run's projection and MoE rounds (they
    # do not depend on where KV pages live).
    def step_pj(result, phase):
        return sum(sum(round_energy(r, config).values()) for r in result["rounds"]
                   if r["phase"] == phase)

    moe = step_pj(local, "decode-proj") + step_pj(local, "decode-moe")
    step = {name: (step_pj(result, "decode") + moe) / BATCH
            for name, result in (("local", local), ("striped", striped), ("far", far))}
    for name, pj in step.items():
        out[f"chip__{name}__decode_energy_per_token"] = round(pj)
    for name in ("striped", "far"):
        out[f"chip__kv_local_over_{name}__energy_ratio"] = round(step["local"] / step[name], 3)

    # The cell-toggle proxy of the decode steps' attention under each placement
    # (SAIF-traced build).
    toggles = {}
    for placement in ("local", "striped"):
        result = simulate_layer(config, WORKLOAD, LAYER, batch=BATCH, context=context,
                                steps=2, placement=placement, moe="off", activity=True)
        toggles[placement] = result["energy"].total
        out[f"chip__{placement}__decode_attention_toggles_per_token"] = round(
            result["energy"].total / (2 * BATCH))
    out["chip__kv_local_over_striped__attention_toggle_ratio"] = round(
        toggles["local"] / toggles["striped"], 3)

    # The other miniatures' attention (prefill 32, one decode step), one build each.
    for name in () if quick else ATTENTION_ONLY:
        wl, chip = get_workload(name), chip_config(name, k=K, n=N, moe="off")
        fits = min(context, chip.tile.max_pages * chip.tile.page_size - 1)  # tiny: 63
        result = simulate_layer(chip, name, len(wl.windows) - 1, batch=BATCH, prefill=32,
                                context=fits, steps=1, moe="off")
        out[f"chip__{name}__decode__context"] = fits
        figures = chip_figures(result, chip)
        out[f"chip__{name}__prefill__attention_cycles"] = figures["chip__prefill__cycles"]
        out[f"chip__{name}__decode__attention_cycles_per_token"] = \
            figures["chip__decode__cycles_per_token"]

    # Simulation speed of a 4 x 4 chip: gpt-oss for a batch of 8 (16 jobs, one a tile).
    if not quick:
        large = chip_config(WORKLOAD, k=4, n=N)
        result = simulate_layer(large, WORKLOAD, LAYER, batch=8, prefill=32, context=context,
                                steps=1)
        out["chip__sim_4x4__cycles_per_s"] = chip_figures(result, large)["chip__sim__cycles_per_s"]

    # The agent loop: 3 turns (prompt 32, tool results 8, answers 2), attention + MoE.
    cycles = {}
    for cache in ("hit", "miss"):
        schedule = agent_schedule(3, 32, 8, 2, cache)
        result = simulate_layer(config, WORKLOAD, LAYER, schedule=schedule)
        cycles[cache] = sum(r["cycles"] for r in result["rounds"])
        out[f"chip__agent_loop__{cache}_cycles"] = cycles[cache]
    out["chip__agent_loop__hit_over_miss__speedup"] = round(cycles["miss"] / cycles["hit"], 3)
    return out
