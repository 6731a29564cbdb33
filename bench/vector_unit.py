"""Vector unit: online-softmax throughput in logits per cycle (target: N per cycle).

A program of attention rows (``tb.vector_unit_tb.attention_program``: 3 blocks of 2N keys
per row, d_v = N) runs on the vector unit at N = 8 in Verilator with no idle and no
backpressure; every result is checked against golden. Elements per cycle = visible
logits processed (LOGIT lanes enabled) / cycles from the first op in to the last result
out. The sequence per block is LOGIT (+max) beats, one alpha EXP, P EXP (+sum) beats, two
RESCALEs; per row RECIP, DIV (which waits for the RECIP's 8-cycle pipeline) and REQUANT.
"""

from __future__ import annotations

from sim.vector_unit_run import simulate_program

N = 8

TARGETS: dict[str, tuple[str, float]] = {
    "vector_unit__softmax__elements_per_cycle": (">=", float(N)),
}


def run(quick: bool) -> dict:
    result = simulate_program(N, "attention", seed=1, count=400 if quick else 1600)
    per_cycle = result["logits"] / result["span_cycles"]
    lanes = result["beats"] / result["span_cycles"]
    print(f"  N={N}: {result['logits']} logits, {result['beats']} ops in "
          f"{result['span_cycles']} cycles = {per_cycle:.2f} logits/cycle, "
          f"{lanes:.3f} ops/cycle", flush=True)
    return {
        "vector_unit__softmax__elements_per_cycle": round(per_cycle, 3),
        "vector_unit__softmax__ops_per_cycle": round(lanes, 4),
    }
