"""The ``serrano`` command line.

    serrano sim [options]    attention prefill + decode on one tile, checked against golden
    serrano gemm [options]   one GEMM on the tensor core alone

Until the chip exists (issue 6), the default design is one tile and the default workload
the gpt-oss-shaped miniature's attention; ``serrano COMMAND --help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rtl.tensor_core import MAX_N, MIN_N
from tb.runner import SIMULATORS, SimulationFailed


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"a probability in [0, 1) is needed, not {text}")
    return value


def _at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, else the error names ``what``."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"a {what} integer is needed, not {text}")
        return value
    return parse


_positive = _at_least(1, "positive")
_non_negative = _at_least(0, "non-negative")


def _array_size(text: str) -> int:
    value = int(text)
    if not MIN_N <= value <= MAX_N:
        raise argparse.ArgumentTypeError(f"the array size must be {MIN_N}..{MAX_N}, not {text}")
    return value


def _area_line(design: str) -> str:
    from synth import load_area

    area = load_area(design)
    if not area:
        return f"not measured (run `make synth ARGS='--only {design}'`)"
    parts = [
        f"{area.get('ecp5_lut4', '?')} LUT4",
        f"{area.get('ecp5_ff', '?')} FF",
        f"{area.get('ecp5_mult18', '?')} MULT18X18D",
        f"{area.get('ecp5_ebr', '?')} EBR",
    ]
    fmax = area.get("ecp5_fmax_mhz")
    parts.append(f"Fmax {fmax:.1f} MHz" if fmax else "Fmax not measured")
    return "ECP5-85F: " + ", ".join(parts) + f"; {area.get('generic_cells', '?')} generic cells"


def _workload(text: str) -> str:
    from golden.workloads import WORKLOADS

    if text not in WORKLOADS:
        raise argparse.ArgumentTypeError(f"unknown workload {text!r}; known: "
                                         f"{', '.join(WORKLOADS)}")
    return text


def _shares(counters: dict) -> str:
    total = counters["cycles"] or 1
    names = (("gemm", "GEMM"), ("vec", "vector"), ("gemm_vec", "both"), ("dma", "DMA"),
             ("stall", "sequencer/stall"))
    return ", ".join(f"{label} {counters[key] / total:.0%}" for key, label in names)


def sim(args: argparse.Namespace) -> int:
    """Attention on one tile: prefill, then decode steps; report cycles and utilisation."""
    from bench.attention import figures
    from golden.workloads import get_workload
    from tb.tile_run import simulate_attention, tile_config

    cfg = get_workload(args.workload)
    if not 0 <= args.layer < len(cfg.windows):
        print(f"serrano sim: workload {args.workload} has attention layers "
              f"0..{len(cfg.windows) - 1}, not {args.layer}", file=sys.stderr)
        return 2
    n = args.array
    needed = max(args.prefill, args.context) + args.steps
    try:
        config = tile_config(args.workload, n=n, max_context=args.max_context)
        if args.max_context is None and needed > config.num_pages // config.kv_sequences \
                * config.page_size:
            config = tile_config(args.workload, n=n, max_context=needed)
    except ValueError as error:
        print(f"serrano sim: {error}", file=sys.stderr)
        return 2
    window = cfg.windows[args.layer]
    print(f"serrano sim: one tile, N={n} ({n * n} MAC/cycle), {args.workload} attention layer "
          f"{args.layer} ({cfg.heads} query / {cfg.kv_heads} KV heads, head dim "
          f"{cfg.head_dim}, {'window ' + str(window) if window else 'full causal'}"
          f"{', sinks' if cfg.sinks else ''}): prefill {args.prefill} tokens, then "
          f"{args.steps} decode steps from context {max(args.prefill, args.context)}; "
          f"seed {args.seed}, simulator {args.sim}", flush=True)
    try:
        result = simulate_attention(config, args.workload, args.layer, prefill=args.prefill,
                                    context=args.context, steps=args.steps, seed=args.seed,
                                    idle=args.idle, stall=args.stall, simulator=args.sim,
                                    waves=args.waves)
        passed = True
    except (SimulationFailed, ValueError) as failure:
        print(f"\nresult       FAIL\n{failure}")
        result, passed = {}, False
    if passed:
        metrics = figures(result, n)
        phases = result["phases"]
        outputs = sum(p["outputs"] for p in phases)
        rows = [("result", f"PASS: all {outputs} int8 outputs of {len(phases)} programs "
                           "bit-exact with golden.attention")]
        for p in phases:
            c, s = p["counters"], p["summary"]
            busy = c["gemm"] + c["gemm_vec"]
            line = (f"{c['cycles']} cycles, {p['instructions']} instructions; "
                    f"{s['macs']} MACs")
            if p["phase"] == "prefill":
                line += (f", utilisation {s['macs'] / (n * n * max(busy, 1)):.3f} of GEMM-busy "
                         f"cycles ({s['macs'] / (n * n * c['cycles']):.3f} of all)")
            else:
                bound = s["kv_bytes_unique"] / n
                compute = s["macs"] / (n * n)
                line += (f"; KV {s['kv_bytes_unique']} B: bandwidth bound {bound:.0f} "
                         f"cycles ({c['cycles'] / bound:.2f}x), compute bound {compute:.0f} "
                         f"({c['cycles'] / compute:.2f}x)")
            rows.append((f"{p['phase']} @{p['context']}", line))
            rows.append(("", "phases: " + _shares(c)))
        if "attention__decode__cycles_per_token" in metrics:
            rows.append(("decode", f"{metrics['attention__decode__cycles_per_token']:.0f} "
                                   f"cycles/token, {metrics['attention__decode__bound_ratio']}"
                                   " x its bandwidth bound (target <= 1.15)"))
        rows += [
            ("stimulus", f"host streams: idle {args.idle:.0%}, backpressure {args.stall:.0%}"),
            ("simulation", f"{args.sim}: {metrics.get('sim__tile__cycles_per_s', 0):,} "
                           "cycles/s (slowest program, build excluded)"),
            ("area", _area_line("tile")),
        ]
        if args.waves:
            rows.append(("waves", result.get("waves_file") or "none written"))
        print()
        for label, text in rows:
            print(f"{label:<12} {text}")
        result = {**result, "metrics": metrics}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"passed": passed, **result}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if passed else 1


def gemm(args: argparse.Namespace) -> int:
    """One GEMM on the tensor core alone."""
    from tb.gemm_run import simulate_gemm

    n, m, k, p = args.array, args.m, args.k, args.p
    print(f"serrano gemm: tensor core N={n} ({n * n} MAC/cycle), GEMM {m} x {k} x {p} "
          f"int8 -> int32, seed {args.seed}, simulator {args.sim}", flush=True)
    try:
        result = simulate_gemm(n, m, k, p, seed=args.seed, idle=args.idle, stall=args.stall,
                               simulator=args.sim, waves=args.waves)
        passed = True
    except SimulationFailed as failure:
        print(f"\nresult       FAIL\n{failure}")
        result, passed = {}, False

    if passed:
        rows = [
            ("result", f"PASS: all {m * p} outputs bit-exact with golden.gemm"),
            ("cycles", f"{result['cycles']} from start to done; "
                       f"{result['span_cycles']} from first operand in to last result out"),
            ("utilisation", f"{result['utilisation']:.4f} = {result['macs']} MACs / "
                            f"({n}² x {result['span_cycles']} cycles)"),
            ("stimulus", f"idle {args.idle:.0%} on A/B, backpressure {args.stall:.0%} on C"),
            ("simulation", f"{args.sim}: {result['cycles_per_s']:,.0f} cycles/s "
                           f"({result['wall_s']:.3f} s for the run, build excluded)"),
            ("area", _area_line(f"tensor_core_n{n}")),
        ]
        if args.waves:
            rows.append(("waves", result.get("waves_file") or "none written"))
        print()
        for label, text in rows:
            print(f"{label:<12} {text}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"passed": passed, **result}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="serrano", description="serrano: cycle-accurate RTL model of an inference accelerator"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim_parser = commands.add_parser(
        "sim", help="attention prefill + decode on one tile, checked against golden",
        description="Simulate attention on one tile (cocotb + Verilator by default): a "
                    "prefill of a prompt, then decode steps that append each token's K/V "
                    "to the paged KV cache; every output is compared bit for bit with "
                    "golden.attention; prints cycles, utilisation, the decode bandwidth "
                    "bound, the cycle breakdown by phase, simulation speed and area.",
    )
    sim_parser.add_argument("--workload", type=_workload, default="gpt-oss",
                            help="miniature workload (tiny, gpt-oss, deepseek-r1, kimi-k2; "
                                 "default gpt-oss)")
    sim_parser.add_argument("--layer", type=_non_negative, default=1,
                            help="attention layer of the workload (default 1: gpt-oss's "
                                 "full-causal layer; 0 is its sliding-window layer)")
    sim_parser.add_argument("--array", type=_array_size, default=8, metavar="N",
                            help="tensor core and vector unit size N (default 8)")
    sim_parser.add_argument("--prefill", type=_non_negative, default=32,
                            help="prompt tokens to prefill (default 32; 0: no prefill)")
    sim_parser.add_argument("--context", type=_non_negative, default=256,
                            help="tokens in the KV cache before the first decode step; "
                                 "those beyond the prompt are appended directly (default 256)")
    sim_parser.add_argument("--steps", type=_non_negative, default=4,
                            help="decode steps, each appending one token (default 4)")
    sim_parser.add_argument("--max-context", type=_positive, default=None,
                            help="size the tile's KV cache for this many tokens (default: "
                                 "tb.tile_run.tile_config's, 1056 tokens with 16-token pages, "
                                 "or what the run needs if more; one build per size)")
    sim_parser.add_argument("--seed", type=int, default=1,
                            help="seed of the workload tensors and the stall generators")
    sim_parser.add_argument("--idle", type=_probability, default=0.0,
                            help="probability that a host stream withholds a beat each cycle")
    sim_parser.add_argument("--stall", type=_probability, default=0.0,
                            help="probability that a host response stream is not ready")
    sim_parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                            help="simulator (default verilator)")
    sim_parser.add_argument("--waves", action="store_true",
                            help="record waves (in the run directory under sim_build/)")
    sim_parser.add_argument("--json", type=Path, help="also write the figures to this file")
    sim_parser.set_defaults(handler=sim)

    gemm_parser = commands.add_parser(
        "gemm", help="simulate one GEMM on the tensor core alone and report",
        description="Simulate a GEMM on the tensor core (cocotb + Verilator by default), "
                    "check every output against the golden model and print cycles, "
                    "utilisation, simulation speed and area (when `make synth` has run).",
    )
    gemm_parser.add_argument("--array", type=_array_size, default=8, metavar="N",
                             help=f"tensor core size N ({MIN_N}..{MAX_N}, default 8)")
    gemm_parser.add_argument("--m", type=_positive, default=64, help="rows of A (default 64)")
    gemm_parser.add_argument("--k", type=_positive, default=64,
                             help="inner dimension (default 64)")
    gemm_parser.add_argument("--p", type=_positive, default=64,
                             help="columns of B (default 64)")
    gemm_parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    gemm_parser.add_argument("--idle", type=_probability, default=0.0,
                             help="probability that an operand beat is withheld each cycle")
    gemm_parser.add_argument("--stall", type=_probability, default=0.0,
                             help="probability that the result stream is not ready each cycle")
    gemm_parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                             help="simulator (default verilator)")
    gemm_parser.add_argument("--waves", action="store_true",
                             help="record FST waves (in the run directory under sim_build/)")
    gemm_parser.add_argument("--json", type=Path, help="also write the figures to this file")
    gemm_parser.set_defaults(handler=gemm)

    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
