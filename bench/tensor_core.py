"""Tensor core utilisation over K, and simulator speed (Verilator against Icarus).

Utilisation = useful MACs / (N² x cycles from the first operand in to the last result
out), on a GEMM of 8N x K x 8N: 64 N x N output tiles streamed back to back, no stalls.
Simulator speed = simulated cycles / wall seconds of the same harness run (a 8N x 64N x 8N
GEMM at N = 8) in both simulators, measured in the same process one after the other.
"""

from __future__ import annotations

import shutil

from sim.gemm_run import memory_depth, simulate_gemm

K_MULTIPLES = (1, 4, 8, 64)
SIZES = (8, 16)

TARGETS: dict[str, tuple[str, float]] = {
    f"tensor_core__utilisation__n{n}_k{k}n": (">=", 0.95)
    for n in SIZES
    for k in K_MULTIPLES
    if k >= 8  # the design target holds for K >= 8N
}
TARGETS["sim__verilator_over_icarus__ratio"] = (">=", 30.0)


def _utilisation(quick: bool) -> dict[str, float]:
    metrics = {}
    for n in SIZES:
        multiples = [k for k in K_MULTIPLES if not quick or k in (1, 8)]
        depth = memory_depth(64 * max(multiples) * n)  # one build for the whole sweep
        for k in multiples:
            result = simulate_gemm(n, 8 * n, k * n, 8 * n, seed=1, simulator="verilator",
                                   depth=depth)
            key = f"tensor_core__utilisation__n{n}_k{k}n"
            metrics[key] = round(result["utilisation"], 5)
            print(f"  N={n:<2} K={k:>2}N: utilisation {result['utilisation']:.4f} "
                  f"({result['span_cycles']} cycles)", flush=True)
    return metrics


def _simulator_speed(quick: bool) -> dict[str, float | None]:
    n = 8
    k = (8 if quick else 64) * n
    speeds: dict[str, float | None] = {}
    for simulator in ("verilator", "icarus"):
        if simulator == "icarus" and shutil.which("iverilog") is None:
            print("  Icarus Verilog (iverilog) is not installed: no Icarus figure "
                  "(apt-get install iverilog)", flush=True)
            speeds[simulator] = None
            continue
        result = simulate_gemm(n, 8 * n, k, 8 * n, seed=1, simulator=simulator)
        speeds[simulator] = round(result["cycles_per_s"], 1)
        print(f"  {simulator}: {result['cycles']} cycles in {result['wall_s']:.3f} s = "
              f"{result['cycles_per_s']:.0f} cycles/s", flush=True)
    ratio = (
        round(speeds["verilator"] / speeds["icarus"], 2)
        if speeds["verilator"] and speeds["icarus"]
        else None
    )
    return {
        "sim__verilator__cycles_per_s": speeds["verilator"],
        "sim__icarus__cycles_per_s": speeds["icarus"],
        "sim__verilator_over_icarus__ratio": ratio,
    }


def run(quick: bool) -> dict:
    return _utilisation(quick) | _simulator_speed(quick)
