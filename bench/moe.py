"""MoE benchmarks: sparse dispatch against dense-masked, and the decode step's bound.

The default chip (2 x 2, N = 8) runs gpt-oss's decoder layer for a batch of 2 (prefill of
32 tokens, one decode step from contexts 256/200, ``local`` placement) three times on one
build: MoE by sparse dispatch and dense-masked with the experts' weights resident (the
host writes them before each round: the two mappings' compute compares), and sparse
with the weights streamed from the memory channels (``--weights streamed``, the
default). Figures:

- ``moe__executed_over_sparse_macs``: the MACs the tiles counted in the MoE rounds and
  the projection rounds before them (every GEMM dispatched, registers added;
  ``rtl.tile.Counters.macs``) over those of the projection, the router and each token's
  top-k experts (the sparse-dispatch work), over all the run's such rounds.
- ``moe__{prefill,decode}__dense_over_sparse_cycles``: the cycles from the attention
  outputs to the MoE layer's output, dense-masked (one round, home projecting) over
  sparse (a projection round, every tile a slice, and the MoE round), in the same run
  (``moe__{phase}__{dense,sparse}_cycles``).
- ``moe__decode__bound_ratio``: a decode step's MoE cycles (its MoE round's: the
  projection round before it is attention's output projection) over its bound, the busiest
  tile's bytes of selected-expert weights over the bytes per cycle its tensor core
  streams (N, one B word a beat): gpt-oss's expert is 3 x 128 x 64 B = 3 072 cycles at
  N = 8; ``moe__decode__bound_cycles`` that bound, ``moe__decode__chipwide_bound_cycles``
  the same bytes spread over every tile.
- ``moe__decode__tile_load_max_over_mean``: the decode step's token-expert pairs on the
  busiest tile over the mean (round-robin placement: expert e on tile e mod k²).
- ``moe__{prefill,decode}__network_wait_share``: of the MoE rounds' tile-cycles, those
  a tile's program spent held by a WAIT with no engine busy (the tiles' ``wait``
  counters: only words arriving over the network release such a WAIT).
- ``moe__{dispatch,combine}_words``: words of token rows sent to remote experts' tiles;
  of result slices sent to the other combining tiles, the gate diagonals and the output
  slices sent to home; over the run's MoE rounds (the metadata, counts and result
  tables, and the projection's rows are in ``chip__network__moe_words`` with them).
- ``moe__streamed__{prefill__cycles,decode__cycles_per_token}``: the layer with the
  weights streamed; ``moe__streamed__decode__weight_bytes_per_token``, the bytes the
  decode step loads from the memory channels per token of the batch;
  ``moe__streamed__{prefill,decode}__memory_bound_ratio``, the phase's cycles over its
  largest roofline bound (docs/chip.md#roofline: with the weights streamed, the busiest
  memory channel's bytes at its 7/16 byte per cycle);
  ``moe__streamed__prefill__crossover_tokens``, the prefill step size (its MoE rounds
  loading the weights once) at which they would turn compute-bound;
  ``moe__{streamed,resident}__decode__{energy_per_token_pj,memory_energy_share}``, the
  access model's energy of a decode step per token and the memory channels' share
  (docs/energy.md); ``..._energy_per_token_with_host_pj`` with the host port's
  transfers before and after the step's rounds (resident weights cross it before the
  first MoE round, in the prefill).
- ``chip__{deepseek-r1,kimi-k2}__...``: their decoder layer (attention + sparse MoE,
  weights streamed) on a 4 x 4 chip, prefill of 32 tokens and one decode step from
  contexts 256/200.
"""

from __future__ import annotations

from compiler.chip import layer_rounds
from golden.workloads import get_workload
from sim.chip_run import chip_config, chip_figures, simulate_layer

WORKLOAD, LAYER, K, N, BATCH = "gpt-oss", 1, 2, 8, 2
#: The large miniatures, on the smallest mesh their MoE layers fit.
LARGE = {"deepseek-r1": 4, "kimi-k2": 4}

TARGETS: dict[str, tuple[str, float]] = {
    "moe__executed_over_sparse_macs": ("<=", 1.10),
    "moe__decode__bound_ratio": ("<=", 1.3),
    "moe__prefill__dense_over_sparse_cycles": (">=", 4.0),
}


def _layer(config, workload, layer, mesh, context, moe, weights=None):
    """(compiled rounds, simulation result) of the benchmark's layer."""
    args = {"batch": BATCH, "prefill": 32, "context": context, "steps": 1,
            "placement": "local", "moe": moe, "weights": weights}
    rounds = layer_rounds(config, workload, layer, **args)
    return rounds, simulate_layer(config, workload, layer, rounds=rounds, **args)


def moe_figures(rounds, result: dict, workload: str, config) -> dict:
    """The MoE figures of a sparse run on ``config`` (see the module docstring)."""
    cfg = get_workload(workload)
    tiles, n = config.tiles, config.tile.n
    expert_bytes = 3 * cfg.hidden * cfg.ffn
    both = [(compiled, run) for compiled, run in zip(rounds, result["rounds"], strict=True)
            if run["phase"].endswith(("moe", "proj"))]
    moe = [(compiled, run) for compiled, run in both if run["phase"].endswith("moe")]
    out = {"moe__executed_over_sparse_macs": round(
        sum(run["macs"] for _, run in both) / sum(run["macs_sparse"] for _, run in both), 4)}
    figures = chip_figures(result, config)
    for phase in ("prefill", "decode"):
        out[f"moe__{phase}__network_wait_share"] = \
            figures[f"chip__{phase}__moe_network_wait_share"]
    for name in ("dispatch", "combine"):
        out[f"moe__{name}_words"] = sum(compiled.summaries[0][f"{name}_words"]
                                        for compiled, _ in moe)
    decode = [(compiled, run) for compiled, run in moe if run["phase"] == "decode-moe"]
    ratios, bounds, chipwide, spread = [], [], [], []
    for compiled, run in decode:
        load = compiled.summaries[0]["expert_load"]
        per_tile = [sum(expert_bytes for e, c in enumerate(load) if c and e % tiles == t)
                    for t in range(tiles)]
        bound = max(per_tile) / n
        bounds.append(bound)
        chipwide.append(sum(per_tile) / (tiles * n))
        ratios.append(run["cycles"] / bound)
        pairs = [sum(c for e, c in enumerate(load) if e % tiles == t) for t in range(tiles)]
        spread.append(max(pairs) / (sum(pairs) / tiles))
    if decode:
        out["moe__decode__bound_ratio"] = round(sum(ratios) / len(ratios), 3)
        out["moe__decode__bound_cycles"] = round(sum(bounds) / len(bounds))
        out["moe__decode__chipwide_bound_cycles"] = round(sum(chipwide) / len(chipwide))
        out["moe__decode__tile_load_max_over_mean"] = round(sum(spread) / len(spread), 3)
    return out


def run(quick: bool) -> dict:
    config = chip_config(WORKLOAD, k=K, n=N, moe="dense")  # one build for both
    context = 64 if quick else 256
    rounds, sparse = _layer(config, WORKLOAD, LAYER, K, context, "sparse", "resident")
    _, dense = _layer(config, WORKLOAD, LAYER, K, context, "dense", "resident")
    sf, df = chip_figures(sparse, config), chip_figures(dense, config)
    out = moe_figures(rounds, sparse, WORKLOAD, config)
    _, streamed = _layer(config, WORKLOAD, LAYER, K, context, "sparse", "streamed")
    tf = chip_figures(streamed, config)
    out["moe__streamed__prefill__cycles"] = tf["chip__prefill__cycles"]
    out["moe__streamed__decode__cycles_per_token"] = tf["chip__decode__cycles_per_token"]
    out["moe__streamed__decode__weight_bytes_per_token"] = \
        tf["chip__decode__memory_bytes_per_token"] // BATCH
    for phase in ("prefill", "decode"):
        out[f"moe__streamed__{phase}__memory_bound_ratio"] = \
            tf[f"chip__{phase}__memory_bound_ratio"]
    out["moe__streamed__prefill__crossover_tokens"] = tf["chip__prefill__crossover_tokens"]
    for name, figures in (("streamed", tf), ("resident", sf)):
        for key in ("energy_per_token_pj", "energy_per_token_with_host_pj"):
            out[f"moe__{name}__decode__{key}"] = figures[f"chip__decode__{key}"]
        out[f"moe__{name}__decode__memory_energy_share"] = round(
            figures["chip__decode__energy_memory_pj"] / figures["chip__decode__energy_pj"], 3)
    for phase in ("prefill", "decode"):
        sparse = sf[f"chip__{phase}__projection_cycles"] + sf[f"chip__{phase}__moe_cycles"]
        out[f"moe__{phase}__sparse_cycles"] = sparse
        out[f"moe__{phase}__dense_cycles"] = df[f"chip__{phase}__moe_cycles"]
        out[f"moe__{phase}__dense_over_sparse_cycles"] = round(
            df[f"chip__{phase}__moe_cycles"] / sparse, 3)
    for name, k in () if quick else LARGE.items():
        large = chip_config(name, k=k, n=N)
        _, result = _layer(large, name, len(get_workload(name).windows) - 1, k, context,
                           "sparse")
        figures = chip_figures(result, large)
        out[f"chip__{name}__mesh"] = f"{k}x{k}"
        out[f"chip__{name}__prefill__cycles"] = figures["chip__prefill__cycles"]
        out[f"chip__{name}__decode__cycles_per_token"] = figures[
            "chip__decode__cycles_per_token"]
    return out
