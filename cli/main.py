"""The ``serrano`` command line.

    serrano sim [options]    a decoder layer (attention + MoE) for a batch on the chip,
                             prefill and decode, checked against golden: the report
    serrano agent [options]  an agent loop on the chip: KV cache kept vs recomputed
    serrano sweep [options]  one decode step over design points: JSON, Pareto plots
    serrano serve [options]  requests served over a concurrency sweep: latencies,
                             throughput per energy, Pareto fronts, matched comparisons
    serrano tile [options]   attention prefill + decode on one tile (every head on it)
    serrano gemm [options]   one GEMM on the tensor core alone

``serrano COMMAND --help`` lists the options (:mod:`cli.options`); the report's rows are
:mod:`cli.report`'s.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import asdict, replace
from pathlib import Path

from cli import options, report
from cli.serve import add_parser as add_serve_parser
from cli.sweep import add_parser as add_sweep_parser
from sim.processes import stop_descendants
from sim.runner import SimulationFailed
from spec.params import MAX_N, MIN_N
from synth.designs import TILE_DESIGNS


def tile(args: argparse.Namespace) -> int:
    """Attention on one tile: prefill, then decode steps; report cycles and utilisation."""
    from bench.attention import figures
    from sim.tile_run import simulate_attention

    try:
        cfg, config = _tile_design(args)
    except ValueError as error:
        print(f"serrano tile: {error}", file=sys.stderr)
        return 2
    n = args.array
    window = cfg.windows[args.layer]
    print(f"serrano tile: one tile, N={n} ({n * n} MAC/cycle), {args.workload} attention layer "
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
        report.print_rows(_tile_rows(args, result, metrics))
        result = {**result, "metrics": metrics}
    if args.json and not report.write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def _tile_design(args: argparse.Namespace):
    """The workload and the tile's design point: KV cache sized for the run unless
    ``--max-context`` says otherwise (then a run that does not fit is refused)."""
    from golden.workloads import get_workload
    from sim.tile_run import tile_config

    cfg = get_workload(args.workload)
    if args.layer is None:
        args.layer = len(cfg.windows) - 1
    if not 0 <= args.layer < len(cfg.windows):
        raise ValueError(f"workload {args.workload} has attention layers "
                         f"0..{len(cfg.windows) - 1}, not {args.layer}")
    needed = max(args.prefill, args.context) + args.steps
    if needed == 0:
        raise ValueError("nothing to simulate: give prefill tokens, a context or decode steps")
    config = tile_config(args.workload, n=args.array, max_context=args.max_context)
    capacity = config.num_pages // config.kv_sequences * config.page_size
    if needed > capacity and args.max_context is None:
        config = tile_config(args.workload, n=args.array, max_context=needed)
    elif needed > capacity:
        raise ValueError(f"a context of {needed} tokens does not fit the KV cache "
                         f"({capacity} tokens per sequence with --max-context "
                         f"{args.max_context}); give a larger --max-context")
    return cfg, config


def _tile_rows(args: argparse.Namespace, result: dict, metrics: dict) -> list:
    """The report of a passed ``serrano tile`` run: per program cycles and bounds."""
    n = args.array
    phases = result["phases"]
    outputs = sum(p["outputs"] for p in phases)
    rows = [("result", f"PASS: all {outputs} int8 outputs of {len(phases)} programs "
                       "bit-exact with golden.attention")]
    for p in phases:
        c, s = p["counters"], p["summary"]
        busy = c["gemm"] + c["gemm_vec"]
        line = f"{c['cycles']} cycles, {p['instructions']} instructions; {s['macs']} MACs"
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
        rows.append(("", "phases: " + report.shares(c)))
    if "attention__decode__cycles_per_token" in metrics:
        rows.append(("decode", f"{metrics['attention__decode__cycles_per_token']:.0f} "
                               f"cycles/token, {metrics['attention__decode__bound_ratio']}"
                               " x its bandwidth bound (target <= 1.15)"))
    rows += [
        ("stimulus", f"host streams: idle {args.idle:.0%}, backpressure {args.stall:.0%}"),
        ("simulation", f"{args.sim}: {metrics.get('sim__tile__cycles_per_s', 0):,} "
                       "cycles/s (slowest program, build excluded)"),
        ("area", report.area_line("tile")),
    ]
    if args.waves:
        rows.append(("waves", result.get("waves_file") or "none written"))
    return rows


def sim(args: argparse.Namespace) -> int:
    """A decoder layer for a batch on the chip: prefill, then decode steps; the report."""
    from compiler.chip import KvCacheFull
    from sim.chip_run import chip_figures, simulate_layer
    from sim.profile import profile

    if args.fault_seed is not None and args.inject_faults is None:
        print("serrano sim: --fault-seed needs --inject-faults", file=sys.stderr)
        return 2
    faults = args.inject_faults and replace(
        args.inject_faults, seed=1 if args.fault_seed is None else args.fault_seed)
    try:
        cfg, config, rounds = _compile_layer(args)
    except ValueError as error:
        hint = (f" with --max-context {args.max_context or 'default'}; give a larger "
                "--max-context" if isinstance(error, KvCacheFull) else "")
        print(f"serrano sim: {error}{hint}", file=sys.stderr)
        return 2
    _print_sim_header(args, cfg, len(rounds))
    outcome = report.with_progress(
        lambda progress: simulate_layer(
            config, cfg, args.layer, batch=args.batch, prefill=args.prefill,
            context=args.context, steps=args.steps, placement=args.placement,
            seed=args.seed, moe=args.moe, simulator=args.sim, waves=args.waves,
            progress=progress, dump=args.dump, activity=args.energy,
            threads=options.threads_of(args), rounds=rounds, faults=faults,
            prefill_chunk=args.prefill_chunk, moe_tokens=args.moe_tokens, weights=args.weights,
            profile=args.profile))
    stopped = outcome.get("result", {}).get("faults", {}).get("stopped")
    if "failure" in outcome:
        print(f"\nresult       FAIL\n{outcome['failure']}")
        result, passed = {}, False
    elif stopped:
        result, passed = outcome["result"], False
        report.print_rows([("result", f"STOPPED: {stopped}"),
                           *report.fault_rows(result["faults"])])
    else:
        result, passed = outcome["result"], True
        metrics = chip_figures(result, config)
        rows, phase_accuracy = _sim_rows(args, config, rounds, result, metrics)
        if args.profile:
            result["profile"] = profile(rounds, result["rounds"], args.profile)
            rows += report.profile_rows(result["profile"], args.profile)
        report.print_rows(rows)
        result = {**result, "metrics": metrics, "accuracy": phase_accuracy}
        if result.get("energy"):
            result["energy"] = asdict(result["energy"])
    if args.json and not report.write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def _compile_layer(args: argparse.Namespace):
    """The workload (with any custom shape), the chip's design point and the layer's
    rounds, compiled once: a mapping the chip cannot take fails here (ValueError),
    before anything is built, and the simulation takes these rounds."""
    from compiler.chip import layer_rounds
    from golden.workloads import get_workload
    from sim.chip_run import chip_config

    overrides = {name: getattr(args, name) for name, _ in options.SHAPE_OPTIONS
                 if getattr(args, name) is not None}
    cfg = get_workload(args.workload, **overrides)
    if args.layer is None:
        args.layer = len(cfg.windows) - 1
    if not 0 <= args.layer < len(cfg.windows):
        raise ValueError(f"workload {args.workload} has attention layers "
                         f"0..{len(cfg.windows) - 1}, not {args.layer}")
    config = chip_config(cfg, k=args.mesh, n=args.array, max_context=args.max_context,
                         moe=args.moe, moe_tokens=args.moe_tokens,
                         memory_bandwidth=args.memory_bandwidth, kv_rows=args.kv_rows)
    rounds = layer_rounds(config, cfg, args.layer, batch=args.batch, prefill=args.prefill,
                          context=args.context, steps=args.steps, placement=args.placement,
                          seed=args.seed, moe=args.moe, prefill_chunk=args.prefill_chunk,
                          moe_tokens=args.moe_tokens, weights=args.weights)
    return cfg, config, rounds


def _print_sim_header(args: argparse.Namespace, cfg, rounds: int) -> None:
    from compiler.chip import contexts

    k, n = args.mesh, args.array
    window = cfg.windows[args.layer]
    print(f"serrano sim: {k}x{k} chip of N={n} tiles ({k * k} x {n * n} MAC/cycle), "
          f"{cfg.name} attention layer {args.layer} ({cfg.heads} query / {cfg.kv_heads} KV "
          f"heads, head dim {cfg.head_dim}, "
          f"{'window ' + str(window) if window else 'full causal'}), batch {args.batch}, "
          f"placement {args.placement}: prefill {args.prefill} tokens per sequence"
          f"{f' in chunks of {args.prefill_chunk}' if args.prefill > args.prefill_chunk else ''}"
          ", then "
          f"{args.steps} decode steps from contexts "
          f"{list(contexts(args.batch, args.context, args.prefill))}; {rounds} rounds; "
          f"seed {args.seed}, simulator {args.sim}", flush=True)


def _sim_rows(args: argparse.Namespace, config, rounds, result: dict, metrics: dict):
    """The report of a passed ``serrano sim`` run, and its accuracy per phase (added to
    ``metrics`` as ``chip__<phase>__accuracy_*``)."""
    from compiler.chip import accuracy

    n, tiles = args.array, args.mesh * args.mesh
    fmax, fmax_text = report.fmax_line(n)
    layer = ("golden.attention, golden.decoder and golden.moe" if args.moe != "off"
             else "golden.attention")
    rows = [("result", f"PASS: all {metrics['outputs']} int8 outputs of "
                       f"{len(result['rounds'])} rounds bit-exact with {layer}")]
    rows += _phase_rows(args, metrics, fmax)
    phase_accuracy = accuracy(rounds)
    rows += report.accuracy_rows(phase_accuracy)
    for phase, figures in phase_accuracy.items():
        for key in ("cosine", "cosine_min_output", "max_lsb_error", "saturated",
                    "saturated_share"):
            metrics[f"chip__{phase.replace('-', '_')}__accuracy_{key}"] = figures[key]
    if args.moe != "off":
        rows.append(("MoE", _moe_line(args.moe, args.moe_tokens, result["rounds"], metrics)))
    tile_area = (report.area_line(TILE_DESIGNS[n], f" per tile (FPGA size), x {tiles}")
                 if n in TILE_DESIGNS else
                 f"not measured: synth/designs.py has no N = {n} tile")
    rows += [
        ("network", f"{metrics['chip__network__flits']:,} flits injected by the tiles; "
                    f"{metrics['chip__network__kv_words']:,} KV words moved by "
                    f"{args.placement} placement, {metrics['chip__network__moe_words']:,} "
                    "MoE words (tokens, expert outputs)"),
        ("memory", _memory_line(config, args, metrics)),
        ("host", _host_line(metrics)),
        ("clock", fmax_text),
        ("energy", report.access_energy_line(metrics)),
        ("", report.energy_line(result.get("energy"), args.batch * (args.prefill + args.steps))),
        ("simulation", f"{args.sim}: {metrics['chip__sim__cycles_per_s']:,.0f} chip "
                       "cycles/s (the rounds' cycles over their wall time, build and "
                       "host transfers excluded)"),
        ("area", tile_area),
    ]
    if "faults" in result:
        rows += report.fault_rows(result["faults"])
    if args.dump:
        rows.append(("dump", report.dump_line(args.dump,
                                              vars(args) | {"chip": asdict(config)})))
    return rows, phase_accuracy


def _memory_line(config, args: argparse.Namespace, metrics: dict) -> str:
    """The chip's memory channels, what the programs moved to and from them, and what of the
    run's data movement is not counted."""
    from compiler.chip import check_weights

    if not config.memory_nodes:
        return ("no memory channels; weights, tokens and KV pages go through the host port "
                "(next line)")
    bandwidth = config.memory_bytes_per_cycle
    nodes = ", ".join(f"({x}, {y})" for x, y in config.memory_nodes)
    line = (f"{len(config.memory_nodes)} channels at {nodes}, {bandwidth} byte/cycle in all, "
            f"{config.memory_latency}-cycle latency; ")
    streamed = args.moe != "off" and check_weights(args.weights, args.moe,
                                                   config) == "streamed"
    what = ([] if args.placement != "far" else ["KV pages (far placement)"]) + (
        ["MoE weights"] if streamed else [])
    labels = (("prefill", "memory_bytes", "in prefill"),
              ("decode", "memory_bytes_per_token", "per decode step"))
    handed = [f"{metrics[f'chip__{phase}__memory_handoff_bytes']:,} B {label}"
              for phase, _, label in labels
              if metrics.get(f"chip__{phase}__memory_handoff_bytes")]
    if what or handed:
        host = (["tokens", "constants"] + ([] if streamed or args.moe == "off" else
                                            ["MoE weights"])
                + ["KV appends" + (" (into the channels)" if args.placement == "far" else "")])
        moved = [f"{metrics[f'chip__{phase}__{key}']:,} B {label}"
                 for phase, key, label in labels if f"chip__{phase}__{key}" in metrics]
        parts = [f"{' and '.join(what)} loaded from them"] if what else []
        if handed:
            parts.append("attention outputs an attention round stored in them for its step's "
                         f"later projection rounds to load ({', '.join(handed)}, stored and "
                         "loaded)")
        return line + (f"{', and '.join(parts)}, within the count ({', '.join(moved)} in "
                       "all); outside it, the host's transfers (next line, docs/chip.md): "
                       "the memory image once, before the first round, and before each "
                       f"round the {', '.join(host)}")
    return line + ("not used by these programs: weights, tokens and KV pages go through the "
                   "host port before their round (next line, docs/chip.md)")


def _host_line(metrics: dict) -> str:
    """What the host wrote before the rounds and read back after them: the programs and
    the memory image once, before the first round; per phase, bytes by kind and the
    cycles the transfers took (measured; outside the rounds' cycles, and the phase's
    cycles with them)."""
    parts, totals = [], []
    for phase, label, name in (("prefill", "prefill", "cycles"),
                               ("decode", "per decode step", "cycles_per_token")):
        if f"chip__{phase}__host_bytes" not in metrics:
            continue
        items = []
        for kind, what, part, which in (
                ("program", "changed program words", None, ""),
                ("scratchpad", "scratchpad words", "attention",
                 "attention outputs written back, not handed over on chip"),
                ("kv", "KV appends", "kv_setup", "set up the context the run starts from")):
            items.append(f"{what} {metrics[f'chip__{phase}__host_{kind}_bytes']:,}")
            share = metrics.get(f"chip__{phase}__host_{part}_bytes", 0) if part else 0
            if share:
                items[-1] += f", of which {share:,} {which}"
        kinds = ", ".join(items)
        parts.append(f"{label} {metrics[f'chip__{phase}__host_bytes']:,} B in ({kinds}), "
                     f"{metrics[f'chip__{phase}__host_output_bytes']:,} B of outputs out: "
                     f"{metrics[f'chip__{phase}__host_cycles']:,} cycles")
        totals.append(f"{label} {metrics[f'chip__{phase}__{name}_with_host']:,}")
    written = [f"the {what} {metrics[f'chip__host__{key}_once_bytes']:,} B in "
               f"{metrics[f'chip__host__{key}_once_cycles']:,} cycles"
               for key, what in (("programs", "programs"), ("memory", "memory image"))
               if metrics.get(f"chip__host__{key}_once_bytes")]
    once = (f"once, before the first round (in no phase): {', '.join(written)}; "
            if written else "")
    return ("the host's transfers before and after each round, the tiles idle, outside the "
            "rounds' cycles (through the host port; the memory image and far placement's "
            "KV appends through the memory channels' write port): " + once + "; ".join(parts)
            + f" (with them: {', '.join(totals)} cycles)")


def _moe_line(dispatch: str, tokens: int, rounds: list[dict], metrics: dict) -> str:
    """What the MoE rounds (of up to ``tokens`` tokens) and the projection rounds before
    them executed against a sparse dispatch's MACs (the tiles' counters), and how."""
    moe = [r for r in rounds if r["phase"].endswith(("moe", "proj"))]
    ratio = sum(r["macs"] for r in moe) / max(sum(r["macs_sparse"] for r in moe), 1)
    metrics["moe__executed_over_sparse_macs"] = round(ratio, 4)
    how = ("sparse dispatch: each token to its experts' tiles by indexed DMA, each expert "
           "over the tokens it received" if dispatch == "sparse" else
           "dense-masked: every expert over every token")
    waits = [f"{metrics[key]:.0%} in {phase}" for phase in ("prefill", "decode")
             if (key := f"chip__{phase}__moe_network_wait_share") in metrics]
    return (f"{how}, in rounds of up to {tokens} tokens; the tiles counted {ratio:.2f}x the "
            "MACs of the projection, the router and each token's top-k experts "
            "(docs/moe_mapping.md); waiting on the network or memory: "
            f"{', '.join(waits)} of the rounds' tile-cycles")


def _phase_rows(args: argparse.Namespace, metrics: dict, fmax: float | None) -> list:
    """Prefill and decode: cycles, their split, utilisation, tokens/s at ``fmax``."""
    rows = []
    for phase, name, label in (("prefill", "cycles", "time-to-first-token proxy"),
                               ("decode", "cycles_per_token", "inter-token latency proxy")):
        if f"chip__{phase}__{name}" not in metrics:
            continue
        cycles = metrics[f"chip__{phase}__{name}"]
        split = f"attention {metrics[f'chip__{phase}__attention_cycles']:,}"
        if f"chip__{phase}__projection_cycles" in metrics:
            split += f" + projection {metrics[f'chip__{phase}__projection_cycles']:,}"
        if f"chip__{phase}__moe_cycles" in metrics:
            split += f" + MoE {metrics[f'chip__{phase}__moe_cycles']:,}"
        line = (f"{cycles:,} cycles{' per token' if phase == 'decode' else ''} "
                f"({label}; {split}); utilisation "
                f"{metrics[f'chip__{phase}__utilisation']:.3f} of the chip's peak")
        if fmax:
            seconds = cycles / (fmax * 1e6)
            tokens = args.batch * (args.prefill if phase == "prefill" else 1)
            line += f"; {tokens / seconds:,.0f} tokens/s at {fmax:.1f} MHz"
        rows.append((phase, line))
        rows.append(("", "phases (all tiles): "
                         + report.shares(metrics[f"chip__{phase}__phases"])))
        rows.append(("", _roofline_line(phase, metrics)))
    return rows


#: How the report names the roofline's bounds (``sim.chip_run.round_bounds``).
_BOUND_NAMES = {"compute": "compute", "tile_compute": "busiest tile's compute",
                "memory": "memory (busiest channel)", "streaming": "scratchpad streaming",
                "injection": "memory-node injection", "network": "busiest router's links"}


def _roofline_line(phase: str, metrics: dict) -> str:
    """The phase's lower bounds in cycles and its cycles over the largest."""
    bounds = ", ".join(f"{label} {metrics[f'chip__{phase}__{b}_bound_cycles']:,}"
                       for b, label in _BOUND_NAMES.items())
    largest = metrics[f"chip__{phase}__largest_bound"]
    line = (f"roofline: {bounds} cycles; {metrics[f'chip__{phase}__memory_bound_ratio']:.2f}x "
            f"the largest ({largest})")
    if phase == "prefill" and "chip__prefill__crossover_tokens" in metrics:
        line += (f"; with the same weights streamed once a step, prefill steps of "
                 f"{metrics['chip__prefill__crossover_tokens']:,} tokens would be "
                 "compute-bound")
    return line


def agent(args: argparse.Namespace) -> int:
    """The agent loop with the KV cache kept (hit) and evicted (miss): end-to-end cycles."""
    from compiler.chip import agent_schedule, layer_rounds, round_kind
    from golden.workloads import get_workload
    from sim.chip_run import chip_config, simulate_layer

    try:
        cfg = get_workload(args.workload)
        layer = len(cfg.windows) - 1 if args.layer is None else args.layer
        if not 0 <= layer < len(cfg.windows):
            raise ValueError(f"workload {args.workload} has attention layers "
                             f"0..{len(cfg.windows) - 1}, not {layer}")
        config = chip_config(cfg, k=args.mesh, n=args.array, moe=args.moe,
                             moe_tokens=args.moe_tokens, memory_bandwidth=args.memory_bandwidth)
        schedules = {cache: agent_schedule(args.turns, args.prompt, args.tool, args.answer,
                                           cache) for cache in ("hit", "miss")}
        # Compiled once, before any build: what does not fit fails here.
        compiled = {cache: layer_rounds(config, cfg, layer, moe=args.moe, schedule=schedule,
                                        seed=args.seed, prefill_chunk=args.prefill_chunk,
                                        moe_tokens=args.moe_tokens, weights=args.weights)
                    for cache, schedule in schedules.items()}
    except ValueError as error:
        print(f"serrano agent: {error}", file=sys.stderr)
        return 2
    k = args.mesh
    print(f"serrano agent: {k}x{k} chip of N={args.array} tiles, {cfg.name} layer {layer}"
          f"{'' if args.moe == 'off' else f' + MoE ({args.moe})'}: {args.turns} turns of "
          f"(tool result {args.tool} "
          f"tokens -> answer {args.answer} tokens) after a {args.prompt}-token prompt; the KV "
          f"cache kept (hit) or evicted and recomputed (miss); seed {args.seed}", flush=True)
    totals, results = {}, {}
    for cache, schedule in schedules.items():
        outcome = report.with_progress(
            lambda progress, schedule=schedule, rounds=compiled[cache]: simulate_layer(
                config, cfg, layer, moe=args.moe, schedule=schedule, seed=args.seed,
                simulator=args.sim, waves=args.waves, progress=progress,
                threads=options.threads_of(args), rounds=rounds,
                prefill_chunk=args.prefill_chunk, moe_tokens=args.moe_tokens, weights=args.weights),
            prefix=f"{cache}: ")
        if "failure" in outcome:
            print(f"\nresult       FAIL ({cache})\n{outcome['failure']}")
            return 1
        result = outcome["result"]
        rounds = result["rounds"]
        attention, projection, moe = (sum(r["cycles"] for r in rounds
                                          if round_kind(r["phase"]) == kind)
                                      for kind in ("", "proj", "moe"))
        totals[cache] = attention + projection + moe
        results[cache] = {"rounds": rounds, "cycles": totals[cache],
                          "attention_cycles": attention, "projection_cycles": projection,
                          "moe_cycles": moe}
        print(f"  {cache}: {len(rounds)} rounds, every output bit-exact", flush=True)
    speedup = totals["miss"] / totals["hit"]
    print()
    for cache, text in (("hit", "cache kept: each tool result prefilled over it"),
                        ("miss", "cache evicted: the context prefilled again every turn")):
        r = results[cache]
        print(f"{cache:<12} {r['cycles']:,} cycles end to end (attention "
              f"{r['attention_cycles']:,} + projection {r['projection_cycles']:,} + MoE "
              f"{r['moe_cycles']:,}); {text}")
    print(f"{'hit/miss':<12} {speedup:.2f}x faster with the cache kept")
    if args.json and not report.write_json(args, {"passed": True, **results,
                                           "chip__agent_loop__hit_over_miss__speedup":
                                           round(speedup, 3)}):
        return 1
    return 0


def gemm(args: argparse.Namespace) -> int:
    """One GEMM on the tensor core alone."""
    from sim.gemm_run import simulate_gemm

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
            ("area", report.area_line(f"tensor_core_n{n}")),
        ]
        if args.waves:
            rows.append(("waves", result.get("waves_file") or "none written"))
        report.print_rows(rows)
    if args.json and not report.write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (the process's arguments by default), check the output paths,
    run the command; its exit status."""
    parser = argparse.ArgumentParser(
        prog="serrano", description="serrano: cycle-accurate RTL model of an inference accelerator"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_sim_parser(commands)
    _add_agent_parser(commands)
    add_sweep_parser(commands)
    add_serve_parser(commands)
    _add_tile_parser(commands)
    _add_gemm_parser(commands)

    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand, with its usage
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = options.check_output_paths(args)
    if problem:
        print(f"serrano {args.command}: {problem}", file=sys.stderr)
        return 2
    return args.handler(args)


def _add_sim_parser(commands) -> None:
    parser = commands.add_parser(
        "sim", help="a decoder layer for a batch on the chip (prefill + decode), checked "
                    "against golden: the architect's report",
        description="Simulate the chip (a KxK mesh of tiles, cocotb + Verilator by "
                    "default) running a decoder layer of a workload for a batch of "
                    "sequences: attention (a prefill of each prompt, then decode steps, each "
                    "sequence at its own context; (sequence, KV head) jobs placed on tiles, "
                    "KV pages placed by --placement) followed by the MoE layer after each "
                    "step on the attention outputs projected into the residual stream "
                    "(experts spread over the tiles, tokens multicast). Every output is "
                    "compared bit for bit with golden.attention, golden.decoder and "
                    "golden.moe. Prints prefill cycles (time-to-first-token proxy), decode "
                    "cycles per token (inter-token latency proxy), utilisation, phase "
                    "shares, the outputs' accuracy against float64 and saturated values per "
                    "phase, network traffic, tokens/s at the measured ECP5 Fmax, simulation "
                    "speed and area.",
    )
    parser.add_argument("--layer", type=options.non_negative, default=None,
                        help="attention layer (default: the workload's last, e.g. "
                             "gpt-oss's full-causal layer 1)")
    parser.add_argument("--mesh", type=options.mesh, default=2, metavar="KxK",
                        help="mesh of tiles (default 2x2; 1x1 is one tile)")
    options.add_memory_bandwidth_option(parser)
    parser.add_argument("--placement", type=options.placement, default="local",
                        help="KV pages on the tile computing their head (local, default), "
                             "spread over the tiles and fetched over the network "
                             "(striped), or kept in the memory channels and loaded by "
                             "every job (far)")
    parser.add_argument("--batch", type=options.positive, default=2,
                        help="sequences decoded together, each with its own context "
                             "(default 2)")
    parser.add_argument("--prefill", type=options.non_negative, default=32,
                        help="prompt tokens prefilled per sequence (default 32; 0: none)")
    options.add_prefill_chunk_option(parser)
    parser.add_argument("--context", type=options.non_negative, default=256,
                        help="tokens of the longest sequence before its first decode "
                             "step; the others have a little less (default 256)")
    parser.add_argument("--steps", type=options.non_negative, default=2,
                        help="decode steps, each appending one token per sequence "
                             "(default 2)")
    parser.add_argument("--max-context", type=options.positive, default=None,
                        help="size the tiles' KV caches for this many tokens per "
                             "sequence (default 4096, or 64 when the workload's pages "
                             "are smaller than N, e.g. tiny at N = 8, at most what the "
                             "block table maps; one build per size)")
    options.add_kv_rows_option(parser)
    for name, what in options.SHAPE_OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=options.dimension, default=None,
                                help=f"custom shape: {what} (default: the workload's)")
    options.add_moe_options(parser, "after every phase step")
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="seed of the workload's tensors: one layer's weights, "
                             "each sequence's tokens from its own stream")
    parser.add_argument("--energy", action="store_true",
                        help="measure the cell-toggle energy proxy too: toggle counts (a "
                             "SAIF-traced build) weighted by synthesised cells "
                             "(docs/energy.md); the access model is always reported")
    parser.add_argument("--profile", type=options.positive, nargs="?", const=16, default=0,
                        metavar="CYCLES",
                        help="note each running tile's pc every CYCLES cycles (default 16) "
                             "and report, per phase, what held the sequencers (a WAIT on "
                             "an engine or on arriving words, or an instruction being "
                             "issued) and the instructions that held them longest; the "
                             "simulation runs slower (docs/chip.md#profile)")
    parser.add_argument("--dump", type=Path, metavar="DIR",
                        help="write every job's inputs, weights and scales, golden and "
                             "RTL outputs to DIR in the golden file format (docs/chip.md); "
                             "DIR must be new or empty")
    parser.add_argument("--force", action="store_true",
                        help="with --dump: empty a used DIR first")
    parser.add_argument("--inject-faults", type=options.fault_rates, metavar="RATE[,double=RATE]",
                        help="flip bits of stored scratchpad words before every round, on "
                             "a fault-injection build: each word the round reads (and does "
                             "not write) gets a single-bit fault with probability RATE, a "
                             "double-bit one with the double RATE; single faults must be "
                             "corrected (outputs bit-exact), a double stops the run with an "
                             "error (docs/chip.md, Faults)")
    parser.add_argument("--fault-seed", type=options.non_negative, default=None, metavar="S",
                        help="seed of the fault positions (default 1; with --inject-faults)")
    options.add_run_options(parser)
    options.add_threads_option(parser)
    parser.set_defaults(handler=sim)


def _add_agent_parser(commands) -> None:
    parser = commands.add_parser(
        "agent", help="an agent loop on the chip, KV cache kept (hit) vs recomputed (miss)",
        description="Simulate one sequence's agent loop on the chip twice: a prompt is "
                    "prefilled and answered, then each turn appends a tool result to the "
                    "context and decodes an answer. With the KV cache kept (hit) the tool "
                    "result is prefilled over the cached context (an extend step); with it "
                    "evicted (miss) the whole context is prefilled again. Every output is "
                    "checked against golden; prints the end-to-end cycles of both and their "
                    "ratio.",
    )
    parser.add_argument("--layer", type=options.non_negative, default=None,
                        help="attention layer (default: the workload's last)")
    parser.add_argument("--mesh", type=options.mesh, default=2, metavar="KxK",
                        help="mesh of tiles (default 2x2)")
    options.add_memory_bandwidth_option(parser)
    parser.add_argument("--turns", type=options.positive, default=3,
                        help="turns, the first answering the prompt (default 3)")
    parser.add_argument("--prompt", type=options.positive, default=32,
                        help="prompt tokens (default 32)")
    parser.add_argument("--tool", type=options.positive, default=8,
                        help="tokens of each tool result (default 8)")
    parser.add_argument("--answer", type=options.positive, default=2,
                        help="tokens decoded per answer (default 2)")
    options.add_prefill_chunk_option(parser)
    options.add_moe_options(parser, "after every step")
    options.add_run_options(parser)
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="seed of the tensors (default 1)")
    options.add_threads_option(parser)
    parser.set_defaults(handler=agent)


def _add_tile_parser(commands) -> None:
    parser = commands.add_parser(
        "tile", help="attention prefill + decode on one tile, checked against golden",
        description="Simulate attention on one tile (cocotb + Verilator by default): a "
                    "prefill of a prompt, then decode steps that append each token's K/V "
                    "to the paged KV cache; every output is compared bit for bit with "
                    "golden.attention; prints cycles, utilisation, the decode bandwidth "
                    "bound, the cycle breakdown by phase, simulation speed and area.",
    )
    parser.add_argument("--layer", type=options.non_negative, default=None,
                        help="attention layer of the workload (default: its last, e.g. "
                             "gpt-oss's full-causal layer 1; 0 is its sliding-window "
                             "layer)")
    parser.add_argument("--prefill", type=options.non_negative, default=32,
                        help="prompt tokens to prefill (default 32; 0: no prefill)")
    parser.add_argument("--context", type=options.non_negative, default=256,
                        help="tokens in the KV cache before the first decode step; "
                             "those beyond the prompt are appended directly (default 256)")
    parser.add_argument("--steps", type=options.non_negative, default=4,
                        help="decode steps, each appending one token (default 4)")
    parser.add_argument("--max-context", type=options.positive, default=None,
                        help="size the tile's KV cache for this many tokens (default: "
                             "sim.tile_run.tile_config's, 1056 tokens with 16-token pages, "
                             "or what the run needs if more; one build per size)")
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="seed of the workload tensors and the stall generators")
    parser.add_argument("--idle", type=options.probability, default=0.0,
                        help="probability that a host stream withholds a beat each cycle")
    parser.add_argument("--stall", type=options.probability, default=0.0,
                        help="probability that a host response stream is not ready")
    options.add_run_options(parser)
    parser.set_defaults(handler=tile)


def _add_gemm_parser(commands) -> None:
    parser = commands.add_parser(
        "gemm", help="simulate one GEMM on the tensor core alone and report",
        description="Simulate a GEMM on the tensor core (cocotb + Verilator by default), "
                    "check every output against the golden model and print cycles, "
                    "utilisation, simulation speed and area (when `make synth` has run).",
    )
    parser.add_argument("--array", type=options.array_size, default=8, metavar="N",
                        help=f"tensor core size N ({MIN_N}..{MAX_N}, default 8)")
    parser.add_argument("--m", type=options.dimension, default=64, help="rows of A (default 64)")
    parser.add_argument("--k", type=options.dimension, default=64,
                        help="inner dimension (default 64)")
    parser.add_argument("--p", type=options.dimension, default=64,
                        help="columns of B (default 64)")
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="random seed (default 1)")
    parser.add_argument("--idle", type=options.probability, default=0.0,
                        help="probability that an operand beat is withheld each cycle")
    parser.add_argument("--stall", type=options.probability, default=0.0,
                        help="probability that the result stream is not ready each cycle")
    options.add_output_options(parser)
    parser.set_defaults(handler=gemm)


def entry() -> None:
    """The ``serrano`` command: :func:`main`, stopped cleanly by SIGINT or SIGTERM (a
    terminal's Ctrl-C, a job scheduler's or an IDE's stop): every process the command
    started is ended with it, its locks are released (they die with the process), and
    it exits 130 or 143 with one line. A build stopped half way leaves no stamp, so the
    next run builds again."""

    def stop(signum: int, _frame) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop_descendants()
        name = signal.Signals(signum).name
        print(f"\nserrano: stopped by {name}; every process it started is ended",
              file=sys.stderr, flush=True)
        os._exit(128 + signum)  # the simulation's thread cannot be joined

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    sys.exit(main())


if __name__ == "__main__":
    entry()
