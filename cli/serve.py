"""``serrano serve``: requests served on a design point over a concurrency sweep —
TTFT, TPOT, end to end, interactivity, throughput per chip and per energy — with the
Pareto fronts and matched comparisons of several design points or policies
(docs/serving.md).

Each design point's step costs come from a cost model calibrated on the cycle-accurate
chip (``serve.design``); a run of the scheduler then takes seconds. ``--shard i/k``
runs every k-th point of the sweep, and ``--merge`` rebuilds the fronts and
comparisons from shards' JSON files.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from cli import options

#: The clock a cycle count is turned into time at, unless ``--clock``: an assumption,
#: a clock an ASIC of this kind reaches, stated in every report.
DEFAULT_CLOCK_HZ = 1e9


def clock(text: str) -> float | str:
    """``--clock``: a frequency in Hz (e.g. 1e9) or ``fpga`` (the synthesised tile's)."""
    if text == "fpga":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a clock in Hz (e.g. 1e9) or fpga, not {text}")
    return value


def shard(text: str) -> tuple[int, int]:
    """``--shard i/k``: the i-th of k shards, 0 <= i < k."""
    try:
        i, k = (int(part) for part in text.split("/"))
    except ValueError:
        i = k = -1
    if not 0 <= i < k:
        raise argparse.ArgumentTypeError(f"a shard i/k with 0 <= i < k, not {text}")
    return i, k


def add_parser(commands) -> argparse.ArgumentParser:
    """Register ``serrano serve``."""
    from serve.design import SERVE_KV_ROWS
    from serve.scheduler import POLICIES

    parser = commands.add_parser(
        "serve", help="requests served over a concurrency sweep: latency, interactivity, "
                      "throughput per energy, Pareto fronts and matched comparisons",
        description="Serve a trace of requests (InferenceX-style fixed lengths by default, "
                    "agent conversations with --agent, or a JSONL --trace) at each "
                    "concurrency, with continuous batching, on every design point "
                    "(--placement x --policy); print per-run latencies and throughputs, "
                    "and, for several design points, each one's throughput per energy at "
                    "matched interactivity and end-to-end latency at matched throughput "
                    "against the first. Step costs come from a cost model calibrated on "
                    "the RTL (saved under build/serve/; the first run of a design point "
                    "simulates it for a few minutes).")
    parser.add_argument("--workload", type=options.workload, default="gpt-oss",
                        help="miniature workload (default gpt-oss)")
    parser.add_argument("--mesh", type=options.mesh, default=2, metavar="KxK",
                        help="mesh (default 2x2)")
    parser.add_argument("--array", type=options.tile_array_size, default=8, metavar="N",
                        help="tensor core size (default 8)")
    options.add_memory_bandwidth_option(parser)
    options.add_kv_rows_option(parser, SERVE_KV_ROWS)
    parser.add_argument("--placement", type=options.list_of(options.placement),
                        default=["local"], metavar="P[,P]",
                        help="KV placements, a design point each (default local)")
    parser.add_argument("--policy", type=options.list_of(options.policy), default=["rounds"],
                        metavar="P[,P]",
                        help=f"prefill/decode policies ({', '.join(POLICIES)}), a design "
                             "point each (default rounds)")
    parser.add_argument("--chunk", type=options.positive, default=32,
                        help="prompt tokens per prefill chunk (default 32)")
    parser.add_argument("--prefill-tiles", type=options.list_of(options.positive),
                        default=None, metavar="T[,T]",
                        help="--policy split's prefill tiles, the first T (the others "
                             "decode), a design point each (default half the tiles)")
    parser.add_argument("--concurrency", type=options.list_of(options.positive),
                        default=None, metavar="C[,C]",
                        help="requests in flight at once (default 1, 2, 3, 4, 6, 8, 12, 16, "
                             "24, 32, up to the sequences the chip holds)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="a JSONL trace (docs/serving.md#traces)")
    source.add_argument("--agent", action="store_true",
                        help="agent conversations (--conversations, --turns, --prompt, "
                             "--tool-tokens, --answer, --tool-wait) instead of fixed lengths")
    parser.add_argument("--isl", type=options.positive, default=256,
                        help="nominal input tokens of the fixed trace (default 256)")
    parser.add_argument("--osl", type=options.positive, default=64,
                        help="nominal output tokens of the fixed trace (default 64)")
    parser.add_argument("--requests", type=options.positive, default=64,
                        help="requests of the fixed trace (default 64)")
    parser.add_argument("--conversations", type=options.positive, default=8,
                        help="agent conversations (default 8)")
    parser.add_argument("--turns", type=options.positive, default=4,
                        help="model calls per conversation (default 4)")
    parser.add_argument("--prompt", type=options.positive, default=256,
                        help="tokens of a conversation's first prompt (default 256)")
    parser.add_argument("--tool-tokens", type=options.positive, default=64,
                        help="tokens of each tool result (default 64)")
    parser.add_argument("--answer", type=options.positive, default=32,
                        help="tokens of each answer (default 32)")
    parser.add_argument("--tool-wait", type=options.seconds(False), default=0.5,
                        help="seconds each tool call takes (default 0.5)")
    parser.add_argument("--burst", type=options.positive, default=1,
                        help="agent conversations that start together (default 1)")
    parser.add_argument("--gap", type=options.seconds(False), default=0.0,
                        help="seconds between two bursts of agent conversations "
                             "(default 0: all start at once)")
    parser.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                        help="free a finished turn's KV cache at once (every later turn of "
                             "its conversation prefills its whole prompt again: a miss)")
    parser.add_argument("--layers", type=options.positive, default=None,
                        help="decoder layers a token passes (default the model's: 36 for "
                             "gpt-oss, 61 for deepseek-r1 and kimi-k2)")
    parser.add_argument("--clock", type=clock, default=DEFAULT_CLOCK_HZ,
                        help="clock in Hz, or fpga for the synthesised tile's Fmax "
                             f"(default {DEFAULT_CLOCK_HZ:.0e}, an assumed ASIC clock)")
    parser.add_argument("--slo", type=options.seconds(True), default=None, metavar="S",
                        help="end-to-end seconds beyond which a request counts as a timeout")
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="seed of the generated trace (default 1)")
    parser.add_argument("--write-trace", type=Path, default=None, metavar="FILE",
                        help="also write the trace served as JSONL")
    parser.add_argument("--recalibrate", action="store_true",
                        help="calibrate the cost models again even if saved")
    parser.add_argument("--shard", type=shard, default=None, metavar="i/k",
                        help="run only every k-th (design point, concurrency) run, from i")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                        help="no simulation: merge the runs of shards' --json files, print "
                             "the fronts and comparisons")
    parser.add_argument("--json", type=Path, default=None, help="write the runs as JSON")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write the Pareto plots to this PNG")
    options.add_threads_option(parser)
    parser.set_defaults(handler=serve, sim="verilator")
    return parser


def _trace(args: argparse.Namespace):
    from serve.trace import agent_trace, fixed_trace, read_trace

    if args.trace is not None:
        return read_trace(args.trace)
    if args.agent:
        return agent_trace(args.conversations, args.turns, args.prompt, args.tool_tokens,
                           args.answer, args.tool_wait, burst=args.burst, gap=args.gap,
                           seed=args.seed)
    return fixed_trace(args.isl, args.osl, args.requests, seed=args.seed)


def serve(args: argparse.Namespace) -> int:
    """Calibrate (or load) each design point, serve the trace at each concurrency, print
    and write the runs, fronts and comparisons."""
    from serve.design import Design, prepare
    from serve.metrics import summarise
    from serve.scheduler import serve as schedule
    from serve.trace import TraceError, write_trace

    if args.merge:
        return _merge(args)
    tiles = args.mesh ** 2
    if args.prefill_tiles is not None and "split" not in args.policy:
        print("serrano serve: --prefill-tiles is for --policy split", file=sys.stderr)
        return 2
    if "split" in args.policy and tiles < 2:
        print("serrano serve: --policy split needs 2 tiles or more (one prefills, one "
              "decodes)", file=sys.stderr)
        return 2
    splits = args.prefill_tiles or [tiles // 2]
    for t in splits:
        if not 1 <= t < tiles:
            print(f"serrano serve: --prefill-tiles {t}: 1 to {tiles - 1} of the {tiles} "
                  "tiles (the others decode)", file=sys.stderr)
            return 2
    # (policy, its prefill tiles): a split for each --prefill-tiles.
    policies = [(policy, t) for policy in args.policy
                for t in (splits if policy == "split" else [None])]
    try:
        requests = _trace(args)
    except (TraceError, ValueError, OSError) as error:
        print(f"serrano serve: {error}", file=sys.stderr)
        return 2
    if args.write_trace:
        try:
            write_trace(args.write_trace, requests)
        except OSError as error:
            print(f"serrano serve: --write-trace {args.write_trace}: {error.strerror or error}",
                  file=sys.stderr)
            return 2
    clock_hz, clock_text = _clock(args)
    if clock_hz is None:
        print(f"serrano serve: --clock fpga: {clock_text}", file=sys.stderr)
        return 2
    designs = [(Design(args.workload, args.mesh, args.array, placement,
                       args.memory_bandwidth, kv_rows=args.kv_rows), policy)
               for placement in args.placement for policy in policies]
    prepared = {}
    try:
        for design, _ in designs:
            if design not in prepared:
                prepared[design] = prepare(design, args.layers, args.recalibrate,
                                           threads=options.threads_of(args))
    except ValueError as error:
        print(f"serrano serve: {error}", file=sys.stderr)
        return 2
    first = next(iter(prepared.values()))
    limit = first.capacity.max_sequences
    concurrency = args.concurrency or [c for c in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
                                       if c <= limit]
    runs = [(design, policy, c) for design, policy in designs for c in concurrency]
    if args.shard:
        i, k = args.shard
        runs = runs[i::k]
    tokens = sum(r.input + r.output for r in requests)
    print(f"serrano serve: {len(requests)} requests ({tokens:,} tokens), {args.workload} of "
          f"{len(first.windows)} layers at {clock_text}; the chip holds {limit} sequences "
          f"({args.kv_rows} block-table rows a tile); "
          f"{len(runs)} run{'s' * (len(runs) != 1)}", flush=True)
    for p in prepared.values():
        cal = p.model.calibration
        calibrated = cal.get("runs", [])
        host = (sum(r["host_cycles"] for r in calibrated)
                / max(sum(r["cycles"] for r in calibrated), 1))
        print(f"  {p.design.label()}: cost model from {len(calibrated)} RTL runs, held-out "
              f"error p95 {_percent(cal.get('error_p95_cycles'))} cycles, "
              f"{_percent(cal.get('error_p95_energy'))} energy; not priced: the host port's "
              f"transfers around the rounds, {host:.0%} more cycles in these runs, mostly "
              "their set-up (docs/serving.md)", flush=True)
    print(_HEADER, flush=True)
    results = []
    for design, (policy, prefill_tiles), c in runs:
        p = prepared[design]
        outcomes = schedule(requests, p.model, p.capacity, concurrency=c, windows=p.windows,
                            clock_hz=clock_hz, policy=policy, chunk=args.chunk,
                            prefix_cache=args.prefix_cache, prefill_tiles=prefill_tiles)
        figures = summarise(outcomes, args.slo)
        name = policy if prefill_tiles is None else \
            f"split {prefill_tiles}+{tiles - prefill_tiles}"
        result = {"design": asdict(design), "label": f"{design.label()} {name}",
                  "policy": policy, "concurrency": c,
                  **({} if prefill_tiles is None else {"prefill_tiles": prefill_tiles}),
                  **figures}
        results.append(result)
        print(_row(result), flush=True)
    document = {"workload": args.workload, "clock_hz": clock_hz, "layers": len(first.windows),
                "requests": len(requests), "calibration": {
                    p.design.label(): p.model.calibration for p in prepared.values()},
                "runs": results}
    return _finish(args, document)


def _clock(args: argparse.Namespace) -> tuple[float | None, str]:
    if args.clock != "fpga":
        text = f"{args.clock / 1e9:g} GHz" + (" (assumed)" if args.clock == DEFAULT_CLOCK_HZ
                                               else "")
        return args.clock, text
    from cli.report import fmax_line

    fmax, text = fmax_line(args.array)
    return (fmax * 1e6, text) if fmax else (None, text)


_HEADER = (f"{'design':<28} {'conc':>4} {'done':>5} {'TTFT p50':>9} {'TPOT p50':>9} "
           f"{'e2e p50':>8} {'e2e p99':>8} {'tok/s/user':>10} {'tok/s':>8} {'tok/J':>8} "
           f"{'hit':>5}")


def _row(r: dict) -> str:
    def s(value):
        return "-" if value is None else f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"

    def n(value, fmt):
        return "-" if value is None else format(value, fmt)
    return (f"{r['label']:<28} {r['concurrency']:>4} {r['completed']:>5} "
            f"{s(r['ttft_p50_s']):>9} {s(r['tpot_p50_s']):>9} {s(r['e2e_p50_s']):>8} "
            f"{s(r['e2e_p99_s']):>8} {n(r['interactivity'], '.1f'):>10} "
            f"{n(r['tokens_per_s'], ',.0f'):>8} {n(r['tokens_per_j'], ',.0f'):>8} "
            f"{n(r['kv_hit_rate'], '.2f'):>5}"
            + (f"  {r['timeouts']} over the SLO" if r.get("timeouts") else "")
            + (f"  {r['failed']} failed: {r['failures'][0]}" if r["failed"] else ""))


def _percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def comparisons(runs: list[dict]) -> list[dict]:
    """Every design point (label) against the first (:func:`serve.metrics.compare`), at
    25 % and 75 % of the interactivity and throughput ranges both fronts cover."""
    from serve.metrics import compare, fronts

    labels = list(dict.fromkeys(r["label"] for r in runs))
    f = {label: fronts([r for r in runs if r["label"] == label]) for label in labels}
    out = []
    for label in labels[1:]:
        c = compare(f[labels[0]], f[label])
        out.append({"design": label, "against": labels[0],
                    "throughput_per_energy": [{"interactivity": x, "ratio": ratio}
                                              for x, ratio in c["throughput_per_energy"]],
                    "e2e_latency_speedup": [{"tokens_per_s": x, "ratio": ratio}
                                            for x, ratio in c["e2e_latency_speedup"]]})
    return out


def _finish(args: argparse.Namespace, document: dict) -> int:
    runs = document["runs"]
    document["comparisons"] = comparisons(runs)
    for c in document["comparisons"]:
        print(f"\n{c['design']} against {c['against']}:")
        for item in c["throughput_per_energy"]:
            print(f"  tokens per joule at {item['interactivity']:.1f} tokens/s/user: "
                  f"{_ratio(item['ratio'])} the first's")
        for item in c["e2e_latency_speedup"]:
            print(f"  end-to-end p50 at {item['tokens_per_s']:,.0f} tokens/s: the first's is "
                  f"{_ratio(item['ratio'])} this one's")
        if not c["throughput_per_energy"]:
            print("  the fronts cover no common interactivity")
        if not c["e2e_latency_speedup"]:
            print("  the fronts cover no common throughput")
    try:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(document, indent=1) + "\n")
            print(f"wrote {args.json}")
        if args.plot:
            plot(runs, args.plot)
            print(f"wrote {args.plot}")
    except OSError as error:
        print(f"serrano serve: the figures were not written ({error})", file=sys.stderr)
        return 1
    failed = sum(r["failed"] for r in runs)
    return 1 if failed and failed == sum(r["requests"] for r in runs) else 0


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _merge(args: argparse.Namespace) -> int:
    documents = []
    for path in args.merge:
        try:
            documents.append(json.loads(path.read_text()))
            documents[-1]["runs"]  # noqa: B018 - a shard's file has runs
        except OSError as error:
            print(f"serrano serve: --merge {path}: cannot read it ({error.strerror})",
                  file=sys.stderr)
            return 2
        except (ValueError, KeyError, TypeError) as error:
            print(f"serrano serve: --merge {path}: not a serve JSON file ({error})",
                  file=sys.stderr)
            return 2
    keys = {(d.get("workload"), d.get("clock_hz"), d.get("layers"), d.get("requests"))
            for d in documents}
    if len(keys) > 1:
        print("serrano serve: --merge: the files served different workloads, clocks, "
              "layers or traces", file=sys.stderr)
        return 2
    runs = [r for d in documents for r in d["runs"]]
    merged = {**documents[0], "runs": runs,
              "calibration": {k: v for d in documents
                              for k, v in d.get("calibration", {}).items()}}
    print(_HEADER)
    for r in runs:
        print(_row(r))
    return _finish(args, merged)


def plot(runs: list[dict], path: Path) -> None:
    """Throughput per energy against interactivity and against end-to-end latency, one
    front per design."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = sorted((r for r in runs if r["label"] == label and r["tokens_per_j"]),
                      key=lambda r: r["concurrency"])
        if not mine:
            continue
        left.plot([r["interactivity"] for r in mine], [r["tokens_per_j"] for r in mine],
                  "o-", label=label)
        right.plot([r["e2e_p50_s"] for r in mine], [r["tokens_per_j"] for r in mine],
                   "o-", label=label)
        for r in mine:
            left.annotate(str(r["concurrency"]), (r["interactivity"], r["tokens_per_j"]),
                          fontsize=7, xytext=(3, 3), textcoords="offset points")
    left.set_xlabel("interactivity (tokens/s per user)")
    right.set_xlabel("end-to-end latency p50 (s)")
    for ax in (left, right):
        ax.set_ylabel("throughput per energy (tokens/J, access model)")
        ax.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    left.set_title("labels: concurrency")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
