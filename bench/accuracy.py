"""Accuracy of what the chip runs: the outputs of compiled chip runs against float64.

Each run of a fixed spread (workloads, both gpt-oss layers, seeds, batches, prompt
lengths, contexts that are not page multiples, head dims and query-per-KV-head ratios)
is compiled for the default 2x2 chip (``compiler.chip.layer_rounds``, the MoE layer too
where it fits the chip) and measured by ``compiler.chip.accuracy``: every job's golden
output — which ``serrano sim`` checks the RTL against bit for bit — against its float64
twin on the same int8 inputs. No simulation: the figures are those of the functional
models, which the RTL reproduces exactly.
"""

from __future__ import annotations

from compiler.chip import accuracy, layer_rounds
from golden.expected import accuracy as golden_accuracy
from golden.expected import compute_expected
from golden.workloads import generate, get_workload
from sim.chip_run import chip_config

#: (workload, shape overrides, layer, batch, prefill, context, steps, seed[, moe]): the
#: MoE layer runs after each round where it fits the chip, unless ``moe`` says "off".
SPREAD = [
    ("gpt-oss", {}, 0, 1, 17, 0, 2, 1),
    ("gpt-oss", {}, 1, 2, 32, 257, 2, 2),
    ("gpt-oss", {}, 1, 3, 0, 300, 1, 3),
    ("gpt-oss", {}, 1, 1, 96, 0, 1, 1),  # the longest prompt a program holds
    ("gpt-oss", {}, 1, 1, 1, 0, 3, 2),
    ("gpt-oss", {}, 0, 2, 0, 1400, 1, 3),
    ("gpt-oss", {"head_dim": 24, "v_head_dim": 24}, 1, 2, 17, 45, 1, 1),
    ("gpt-oss", {"head_dim": 40, "v_head_dim": 40}, 0, 1, 0, 77, 2, 2),
    ("gpt-oss", {"kv_heads": 16}, 1, 1, 17, 33, 1, 3),  # 1 query head per KV head
    ("gpt-oss", {"heads": 6, "kv_heads": 2}, 1, 3, 17, 150, 1, 1),  # 3 per KV head
    ("deepseek-r1", {}, 0, 2, 17, 200, 1, 1),
    # Attention alone: beside the MoE layer's working space a tile keeps KV pages for
    # about 400 of its tokens.
    ("deepseek-r1", {}, 0, 1, 0, 1023, 2, 2, "off"),
    ("kimi-k2", {}, 0, 1, 1, 333, 2, 3),
    ("kimi-k2", {}, 0, 3, 0, 2047, 1, 1),
    ("tiny", {}, 0, 2, 11, 13, 3, 2),
    ("tiny", {}, 1, 3, 1, 0, 2, 3),
]
QUICK = [0, 1, 6, 10, 14]

#: Decode contexts past what the default chip's KV cache holds, measured on the golden
#: models alone (the same calibration; the chip runs the same integer model).
LONG_CONTEXTS = (2048, 4096)

TARGETS = {
    "accuracy__golden__long_context_cosine_min": (">=", 0.999),
    "accuracy__chip__attention_cosine_min": (">=", 0.999),
    "accuracy__chip__attention_max_lsb": ("<=", 3),
    "accuracy__chip__saturated_share": ("<=", 0),
    "accuracy__chip__moe_cosine_min": (">=", 0.99),
}


def measure(workload: str, overrides: dict, layer: int, batch: int, prefill: int,
            context: int, steps: int, seed: int, moe: str = "sparse") -> dict[str, dict]:
    """:func:`compiler.chip.accuracy` of one run on the default chip (with the MoE layer
    unless ``moe`` is "off" or the layer does not fit the chip: then attention alone)."""
    cfg = get_workload(workload, **overrides)
    try:
        config = chip_config(cfg, moe=moe)
    except ValueError:  # the MoE layer does not fit a 2x2 chip
        config, moe = chip_config(cfg, moe="off"), "off"
    rounds = layer_rounds(config, cfg, layer, batch=batch, prefill=prefill, context=context,
                          steps=steps, seed=seed, moe=moe)
    return accuracy(rounds)


def long_context_cosine(workload: str, context: int) -> float:
    """Worst attention cosine of the workload's decode batch at ``context`` (every layer,
    its prompt of 128 tokens sharing the calibration), golden against float64."""
    wl = generate(workload, decode_context_lens=(context,), prefill_tokens=128, moe_tokens=1)
    figures = golden_accuracy(wl, compute_expected(wl))
    return min(v for k, v in figures.items()
               if k.startswith("attn") and k.endswith("cosine") and ".proj." not in k)


def run(quick: bool) -> dict:
    spread = [SPREAD[i] for i in QUICK] if quick else SPREAD
    attention, moe, saturated, outputs = [], [], 0, 0
    for entry in spread:
        for phase, figures in measure(*entry).items():
            if not phase.endswith("proj"):  # the projection's clamps count below
                (moe if phase.endswith("moe") else attention).append(figures)
            saturated += figures["saturated"]
            outputs += figures["outputs"]
    long = [long_context_cosine(w, c) for w in ("gpt-oss", "deepseek-r1", "kimi-k2")
            for c in (LONG_CONTEXTS[-1:] if quick else LONG_CONTEXTS)]
    return {
        "accuracy__golden__long_context_cosine_min": min(long),
        "accuracy__chip__runs": len(spread),
        "accuracy__chip__attention_cosine_min": min(a["cosine"] for a in attention),
        "accuracy__chip__attention_output_cosine_min": min(a["cosine_min_output"]
                                                           for a in attention),
        "accuracy__chip__attention_max_lsb": max(a["max_lsb_error"] for a in attention),
        "accuracy__chip__saturated_share": saturated / max(outputs, 1),
        "accuracy__chip__moe_cosine_min": min(a["cosine"] for a in moe),
        "accuracy__chip__moe_max_lsb": max(a["max_lsb_error"] for a in moe),
    }
