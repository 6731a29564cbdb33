"""Reliability benchmark: bit flips in the default chip's scratchpads during the default
decoder layer (gpt-oss miniature, 2 x 2, N = 8, batch 2, prefill 32, one decode step from
contexts 256/200, local placement), on the fault-injection build (:mod:`sim.faults`).

Single-bit faults at a rate of 0.005 per word a round reads, before every round, one run
per seed of two (with the weights streamed, the words the host stores before a round are
the tokens, constants and KV pages, about 650 faults a run): how many were injected (each
in a word read afterwards) and the share that survived: their round
finished with every output bit-exact, the tile's scratchpad corrected at least one read
per fault, and each fault was still in its word afterwards (a round where any of that
fails stops the run, and its faults count as injected, not survived). Double-bit faults
at 1e-3 per word, one run per seed of five: the share detected (the run stopped with the
uncorrectable-ECC error at the round holding them, never a wrong output passed on).
``--quick``: the tiny miniature at higher rates.
"""

from __future__ import annotations

from compiler.chip import layer_rounds
from sim.chip_run import chip_config, simulate_layer
from sim.faults import FaultPlan

TARGETS: dict[str, tuple[str, float]] = {
    "reliability__single_bit_faults_injected": (">=", 1000),
    "reliability__single_bit_faults_survived_share": (">=", 1.0),
    "reliability__double_bit_faults_detected_share": (">=", 1.0),
}

SINGLE_SEEDS = (1, 2)
DOUBLE_SEEDS = (1, 2, 3, 4, 5)


def run(quick: bool) -> dict:
    workload, single, double = ("tiny", 0.2, 0.02) if quick else ("gpt-oss", 0.005, 1e-3)
    config = chip_config(workload, k=2, n=8)
    layer = dict(batch=2, prefill=32 if not quick else 3, context=256 if not quick else 8,
                 steps=1, placement="local")
    # Compiled once: every run below simulates the same rounds.
    layer["rounds"] = layer_rounds(config, workload, 1, **layer)
    def counts(plans, *keys) -> list[int]:
        """Each of the fault logs' ``keys``, summed over one run of the layer a plan."""
        runs = [simulate_layer(config, workload, 1, **layer, faults=plan)["faults"]
                for plan in plans]
        return [sum(run[key] for run in runs) for key in keys]

    injected, survived = counts([FaultPlan(single, seed=seed) for seed in SINGLE_SEEDS],
                                "single_injected", "single_survived")
    doubles, detected = counts([FaultPlan(0.0, double, seed=seed) for seed in DOUBLE_SEEDS],
                               "double_injected", "double_detected")
    return {
        "reliability__single_bit_faults_injected": injected,
        "reliability__single_bit_faults_survived_share":
            round(survived / injected, 4) if injected else None,
        "reliability__double_bit_faults_injected": doubles,
        "reliability__double_bit_faults_detected_share":
            round(detected / doubles, 4) if doubles else None,
    }
