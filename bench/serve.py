"""Serving on the default chip with 32 block-table rows a tile (``serve.design``: gpt-oss,
2 x 2, N = 8, 36 layers at the assumed 1 GHz; docs/serving.md): the cost models' error
and InferenceX-style matched comparisons.

- ``serve__cost_model_error_p95_{cycles,energy}``: the local design point's cost model
  on the RTL runs left out of its fit (p95 over their steps of |predicted - measured| /
  measured); ``serve__{striped,far}__cost_model_error_p95_*`` the striped and far
  ones'.
- ``serve__c{1,32}__{ttft_p50_s,tpot_p99_s,interactivity,tokens_per_j}``: the fixed
  trace (64 requests, 256 input / 64 output tokens nominal) at concurrency 1 and at the
  most sequences the chip holds (32), local placement, phase rounds.
- ``serve__matched_{lo,hi}__local_over_striped__throughput_per_energy``: local
  placement's tokens per joule over striped's at 25 % and 75 % of the interactivity
  range both fronts cover (concurrency 1, 2, 4, 8, 16, 32); the same for
  ``chunked_over_rounds`` (chunked prefill against phase rounds, local) and
  ``split_over_rounds`` (a spatial split, 2 prefill and 2 decode tiles, against phase
  rounds, local);
  ``serve__matched_{lo,hi}__local_over_striped__e2e_speedup``: striped's end-to-end p50
  over local's at 25 % and 75 % of the throughput range both cover; the same for
  ``local_over_far`` (KV pages in the memory channels, loaded by every step).
- ``serve__agent_loop__cost_model_error_{cycles,energy}``: the local cost model on
  ``bench/chip.py``'s agent loop run on the chip (KV kept and evicted; a schedule of
  prefill, extend and decode steps it was not fitted to): |predicted - measured| /
  measured over the whole loop, the larger of the two.
- ``serve__agent__e2e_p90_hit_over_miss``: agent conversations (16 of 4 turns,
  256-token prompts, 64-token tool results, 32-token answers, 0.5 s tool calls,
  concurrency 16: more context than the KV pages hold, so some caches are evicted),
  p90 of a task's end to end with the prefix cache over without (< 1: kept caches
  finish tasks sooner); ``serve__agent__kv_hit_rate`` the share of prefix tokens reused.
"""

from __future__ import annotations

from compiler.chip import agent_schedule
from serve.cost import step_totals
from serve.design import Design, prepare
from serve.metrics import compare, fronts, summarise
from serve.scheduler import serve
from serve.trace import agent_trace, fixed_trace

CLOCK_HZ = 1e9
CONCURRENCY = (1, 2, 4, 8, 16, 32)

TARGETS: dict[str, tuple[str, float]] = {
    "serve__cost_model_error_p95_cycles": ("<=", 0.05),
}


def _sweep(prepared, requests, policy: str = "rounds") -> list[dict]:
    return [{"concurrency": c, **summarise(serve(
        requests, prepared.model, prepared.capacity, concurrency=c,
        windows=prepared.windows, clock_hz=CLOCK_HZ, policy=policy))}
        for c in CONCURRENCY if c <= prepared.capacity.max_sequences]


def _agent_loop(prepared) -> dict:
    """``bench/chip.py``'s agent loop (3 turns after a 32-token prompt, tool results of 8
    tokens, answers of 2), KV kept and evicted, run on the chip and priced by the cost
    model round by round (each MoE round at the routing it had): the model's error on
    a schedule it was not fitted to, extend steps over a kept cache included."""
    errors: dict[str, list[float]] = {"cycles": [], "energy": []}
    for cache in ("hit", "miss"):
        totals = step_totals(prepared.model, prepared.simulate(
            schedule=agent_schedule(3, 32, 8, 2, cache)))
        for kind, (measured, predicted) in (("cycles", (0, 1)), ("energy", (2, 3))):
            m, p = (sum(t[i] for t in totals) for i in (measured, predicted))
            errors[kind].append(abs(p - m) / m)
    return {f"serve__agent_loop__cost_model_error_{kind}": round(max(values), 4)
            for kind, values in errors.items()}


def run(quick: bool = False) -> dict:
    out: dict = {}
    local = prepare(Design())
    striped = prepare(Design(placement="striped"))
    far = prepare(Design(placement="far"))
    for name, p in (("", local), ("striped__", striped), ("far__", far)):
        for kind in ("cycles", "energy"):
            out[f"serve__{name}cost_model_error_p95_{kind}"] = \
                p.model.calibration[f"error_p95_{kind}"]
    requests = fixed_trace(256, 64, 16 if quick else 64)
    runs = {"local": _sweep(local, requests), "striped": _sweep(striped, requests),
            "far": _sweep(far, requests), "chunked": _sweep(local, requests, "chunked"),
            "split": _sweep(local, requests, "split")}
    for r in (runs["local"][0], runs["local"][-1]):
        c = r["concurrency"]
        out[f"serve__c{c}__ttft_p50_s"] = round(r["ttft_p50_s"], 4)
        out[f"serve__c{c}__tpot_p99_s"] = round(r["tpot_p99_s"], 5)
        out[f"serve__c{c}__interactivity"] = round(r["interactivity"], 2)
        out[f"serve__c{c}__tokens_per_j"] = round(r["tokens_per_j"])
    f = {name: fronts(r) for name, r in runs.items()}
    for other, base, label in (("local", "striped", "local_over_striped"),
                               ("local", "far", "local_over_far"),
                               ("chunked", "local", "chunked_over_rounds"),
                               ("split", "local", "split_over_rounds")):
        c = compare(f[base], f[other])
        for kind, name in (("throughput_per_energy", "throughput_per_energy"),
                           ("e2e_latency_speedup", "e2e_speedup")):
            for (_, ratio), where in zip(c[kind] or [(0, None)] * 2, ("lo", "hi"),
                                         strict=True):
                out[f"serve__matched_{where}__{label}__{name}"] = \
                    None if ratio is None else round(ratio, 3)
    agents = agent_trace(16, 4, prompt=256, tool=64, answer=32, tool_wait=0.5)
    figures = {cache: summarise(serve(agents, local.model, local.capacity, concurrency=16,
                                      windows=local.windows, clock_hz=CLOCK_HZ,
                                      prefix_cache=cache))
               for cache in (True, False)}
    out["serve__agent__e2e_p90_hit_over_miss"] = round(
        figures[True]["task_e2e_p90_s"] / figures[False]["task_e2e_p90_s"], 3)
    out["serve__agent__kv_hit_rate"] = round(figures[True]["kv_hit_rate"], 3)
    if not quick:
        out.update(_agent_loop(local))
    return out
