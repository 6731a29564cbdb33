"""Long-context benchmarks: a 2,048-token prompt on the default chip (2 x 2, N = 8).

gpt-oss's full-attention layer (1) for one sequence: the prompt prefilled in chunks of
``compiler.chip.PREFILL_CHUNK`` tokens (each an extend step over the cache the chunks
before it filled; attention programs with loops over the key blocks once the straight
program would not fit the program memory), the MoE layer (sparse, the experts'
weights resident: written by the host before the first round, so the figures are the chip's
compute; streamed, every chunk's MoE rounds would wait about 0.9 M cycles on the memory
channels, ``bench/moe.py``) after each chunk, then
two decode steps at contexts 2,049 and 2,050; every output bit-exact with golden. Its
sliding-window layer (0, window 128) prefills the same prompt, attention alone (its
chunks see at most 9 key blocks each, so the run is short; the MoE layer is the same
as layer 1's). Each chunk's attention outputs go to its MoE round over the mesh (a
chunk of one sequence makes one MoE round), so the host writes none of them back
(``host_attention_bytes``, among the ``host_bytes`` it writes into the tiles before the
prefill's rounds). Only two of the four tiles compute attention (one sequence, two KV
heads), so the prefill's utilisation of the chip's peak is at most about 0.5 in the
attention rounds.

``--quick``: a 192-token prompt.
"""

from __future__ import annotations

from sim.chip_run import chip_config, chip_figures, simulate_layer

WORKLOAD, K, N = "gpt-oss", 2, 8

TARGETS: dict[str, tuple[str, float]] = {}


def run(quick: bool) -> dict:
    prompt = 192 if quick else 2048
    name = "prefill" if quick else f"prefill_{prompt}"
    config = chip_config(WORKLOAD, k=K, n=N)
    out: dict = {}
    full = chip_figures(simulate_layer(config, WORKLOAD, 1, batch=1, prefill=prompt,
                                       steps=2, weights="resident"), config)
    for key in ("cycles", "attention_cycles", "projection_cycles", "moe_cycles",
                "utilisation", "host_bytes", "host_attention_bytes"):
        out[f"chip__{WORKLOAD}__{name}__{key}"] = full[f"chip__prefill__{key}"]
    out[f"chip__{WORKLOAD}__{name}__decode_cycles_per_token"] = \
        full["chip__decode__cycles_per_token"]
    window = chip_figures(simulate_layer(config, WORKLOAD, 0, batch=1, prefill=prompt,
                                         steps=1, moe="off"), config)
    out[f"chip__{WORKLOAD}__window_{name}__attention_cycles"] = window["chip__prefill__cycles"]
    out[f"chip__{WORKLOAD}__window_{name}__utilisation"] = window["chip__prefill__utilisation"]
    out["chip__long_context__sim_cycles_per_s"] = full["chip__sim__cycles_per_s"]
    return out
