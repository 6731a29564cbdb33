"""InferenceX-style figures of a serving run, Pareto fronts and matched comparisons
(docs/serving.md#metrics).

Latencies are in seconds: TTFT (sent to first token), TPOT (the time per output token
after the first), end to end (sent to last token); each as median, p90, p95 and p99 over
the completed requests. Interactivity is 1 / median TPOT, tokens per second per user.
Throughput per chip counts input + output tokens (``tokens_per_s``) and output tokens
alone (``output_tokens_per_s``) over the run's span (first send to last completion);
throughput per energy is input + output tokens per joule of the access-energy model.
"""

from __future__ import annotations

import numpy as np

from serve.scheduler import Outcome

__all__ = ["PERCENTILES", "compare", "front", "fronts", "interpolate", "matched", "summarise"]

PERCENTILES = (50, 90, 95, 99)


def _percentiles(name: str, values: list[float]) -> dict[str, float | None]:
    return {f"{name}_p{p}_s": (float(np.percentile(values, p)) if values else None)
            for p in PERCENTILES}


def summarise(outcomes: list[Outcome], slo_s: float | None = None) -> dict:
    """The figures of one run (module docstring); with ``slo_s``, requests whose end to
    end time exceeded it count as timeouts. Agent conversations add their end to end
    time (first turn sent to last turn done), energy per task and AgentX's normalised
    interactivity (1 / p90 of end to end time over output tokens)."""
    done = [o for o in outcomes if o.failed is None]
    failed = [o for o in outcomes if o.failed is not None]
    ttft = [o.first - o.sent for o in done]
    tpot = [(o.done - o.first) / (o.request.output - 1) for o in done if o.request.output > 1]
    e2e = [o.done - o.sent for o in done]
    span = (max(o.done for o in done) - min(o.sent for o in done)) if done else 0.0
    tokens = sum(o.request.input + o.request.output for o in done)
    output = sum(o.request.output for o in done)
    energy = sum(o.energy_j for o in outcomes)
    prefix = sum(o.request.prefix for o in done)
    out = {"requests": len(outcomes), "completed": len(done), "failed": len(failed),
           "failures": sorted({o.failed for o in failed}),
           "timeouts": sum(t > slo_s for t in e2e) if slo_s is not None else None,
           **_percentiles("ttft", ttft), **_percentiles("tpot", tpot),
           **_percentiles("e2e", e2e),
           "interactivity": (1.0 / float(np.median(tpot))) if tpot else None,
           "span_s": span,
           "tokens_per_s": tokens / span if span else None,
           "output_tokens_per_s": output / span if span else None,
           "energy_j": energy,
           "energy_per_output_token_j": energy / output if output else None,
           "tokens_per_j": tokens / energy if energy else None,
           "kv_hit_rate": (sum(o.hit_tokens for o in done) / prefix) if prefix else None}
    tasks: dict[str, list[Outcome]] = {}
    for o in outcomes:
        if o.request.conversation is not None:
            tasks.setdefault(o.request.conversation, []).append(o)
    if tasks:
        complete = [turns for turns in tasks.values() if all(o.failed is None for o in turns)]
        task_e2e = [turns[-1].done - turns[0].sent for turns in complete]
        per_token = [(turns[-1].done - turns[0].sent) / sum(o.request.output for o in turns)
                     for turns in complete]
        out.update({
            "tasks": len(tasks), "tasks_completed": len(complete),
            **_percentiles("task_e2e", task_e2e),
            "task_energy_j": (float(np.mean([sum(o.energy_j for o in turns)
                                              for turns in complete])) if complete else None),
            "agent_interactivity": (1.0 / float(np.percentile(per_token, 90))
                                    if per_token else None)})
    return out


def front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The Pareto front of (x, y) points where both are better larger, by x ascending."""
    best: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not best or y > best[-1][1]:
            best.append((x, y))
    return best[::-1]


def interpolate(points: list[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` along a front sorted by x (linear between its points: monotone, since
    a front's y falls as its x rises); None outside the front's x range."""
    xs = [p[0] for p in points]
    if not points or x < xs[0] or x > xs[-1]:
        return None
    return float(np.interp(x, xs, [p[1] for p in points]))


def matched(a: list[tuple[float, float]], b: list[tuple[float, float]],
            shares: tuple[float, ...] = (0.25, 0.75)) -> list[tuple[float, float | None]]:
    """``a``'s y over ``b``'s at ``shares`` of the x range both fronts cover:
    (x, ratio) each; an empty list when the ranges do not overlap."""
    if not a or not b:
        return []
    low, high = max(a[0][0], b[0][0]), min(a[-1][0], b[-1][0])
    if low > high:
        return []
    out = []
    for share in shares:
        x = low + share * (high - low)
        ya, yb = interpolate(a, x), interpolate(b, x)
        out.append((x, ya / yb if ya is not None and yb else None))
    return out


def fronts(runs: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """One design point's fronts over its runs (:func:`summarise`'s figures): throughput
    per energy over interactivity (``energy``) and end-to-end p50 latency, negated so
    that larger is better, over throughput (``latency``)."""
    done = [r for r in runs if r["completed"] and r["interactivity"] and r["tokens_per_j"]]
    return {"energy": front([(r["interactivity"], r["tokens_per_j"]) for r in done]),
            "latency": front([(r["tokens_per_s"], -r["e2e_p50_s"]) for r in done])}


def compare(base: dict, other: dict) -> dict[str, list[tuple[float, float | None]]]:
    """``other``'s :func:`fronts` against ``base``'s: its throughput per energy over the
    base's at matched interactivity, and the base's end-to-end latency over its own at
    matched throughput (ratios > 1: ``other`` does more per joule, is faster)."""
    return {"throughput_per_energy": matched(other["energy"], base["energy"]),
            "e2e_latency_speedup": matched(base["latency"], other["latency"])}
