"""The ``serrano`` command line.

    serrano sim [options]    a decoder layer (attention + MoE) for a batch on the chip,
                             prefill and decode, checked against golden: the report
    serrano agent [options]  an agent loop on the chip: KV cache kept vs recomputed
    serrano sweep [options]  one decode step over design points: JSON, Pareto plots
    serrano tile [options]   attention prefill + decode on one tile (every head on it)
    serrano gemm [options]   one GEMM on the tensor core alone

``serrano COMMAND --help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from rtl.tensor_core import MAX_N, MIN_N
from tb.processes import stop_descendants
from tb.runner import SIMULATORS, SimulationFailed


def _probability(text: str) -> float:
    """A stall or idle probability the harness can draw: 0 to 255/256, in steps of 1/256."""
    from tb.harness_driver import MAX_PROBABILITY

    value = float(text)
    if not 0.0 <= value <= MAX_PROBABILITY:
        raise argparse.ArgumentTypeError(
            f"a probability in [0, {MAX_PROBABILITY:.4f}] is needed (the harness draws in "
            f"steps of 1/256), not {text}")
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


def _tile_array_size(text: str) -> int:
    """A tile's N: the tensor core's range, and a power of two (the vector unit's lanes,
    the scratchpad's word layout)."""
    value = _array_size(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"a tile's array size must be a power of two, "
                                         f"{MIN_N}..{MAX_N}, not {text}")
    return value


#: Largest GEMM dimension a tile's instruction takes (12-bit fields): the bound of the
#: shape options, so an absurd shape is refused before its tensors are generated.
MAX_DIM = (1 << 12) - 1


def _dimension(text: str) -> int:
    value = _positive(text)
    if value > MAX_DIM:
        raise argparse.ArgumentTypeError(f"at most {MAX_DIM} (a GEMM instruction's 12-bit "
                                         f"field), not {text}")
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
    if fmax:
        parts.append(f"Fmax {fmax:.1f} MHz")
    elif area.get("ecp5_fits") == 0:
        parts.append("does not fit the 85F, so no place and route")
    else:
        parts.append("Fmax not measured")
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


def tile(args: argparse.Namespace) -> int:
    """Attention on one tile: prefill, then decode steps; report cycles and utilisation."""
    from bench.attention import figures
    from golden.workloads import get_workload
    from tb.tile_run import simulate_attention, tile_config

    cfg = get_workload(args.workload)
    if args.layer is None:
        args.layer = len(cfg.windows) - 1
    if not 0 <= args.layer < len(cfg.windows):
        print(f"serrano tile: workload {args.workload} has attention layers "
              f"0..{len(cfg.windows) - 1}, not {args.layer}", file=sys.stderr)
        return 2
    n = args.array
    needed = max(args.prefill, args.context) + args.steps
    try:
        if needed == 0:
            raise ValueError("nothing to simulate: give prefill tokens, a context or "
                             "decode steps")
        config = tile_config(args.workload, n=n, max_context=args.max_context)
        capacity = config.num_pages // config.kv_sequences * config.page_size
        if needed > capacity and args.max_context is None:
            config = tile_config(args.workload, n=n, max_context=needed)
        elif needed > capacity:
            raise ValueError(f"a context of {needed} tokens does not fit the KV cache "
                             f"({capacity} tokens per sequence with --max-context "
                             f"{args.max_context}); give a larger --max-context")
    except ValueError as error:
        print(f"serrano tile: {error}", file=sys.stderr)
        return 2
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
    if args.json and not write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def _mesh(text: str) -> int:
    """``KxK`` (a square mesh, 1..8) -> k."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or parts[0] != parts[1]:
        raise argparse.ArgumentTypeError(f"the mesh is given as KxK (square), e.g. 2x2, "
                                         f"not {text!r}")
    k = int(parts[0])
    if not 1 <= k <= 8:
        raise argparse.ArgumentTypeError(f"the mesh side must be 1..8, not {k}")
    return k


#: Workload fields a custom shape may override from the command line.
SHAPE_OPTIONS = (("heads", "query heads"), ("kv_heads", "KV heads"),
                 ("head_dim", "key/query head dimension"), ("experts", "routed experts"),
                 ("top_k", "experts per token"))


#: The whole-tile synthesis designs (synth/designs.py), by array size.
TILE_DESIGNS = {8: "tile", 4: "tile_n4"}


def _fmax_line(n: int) -> tuple[float | None, str]:
    """The clock the report converts cycles to time with, from build/synth.json: the
    measured ECP5 Fmax of the N = ``n`` tile placed whole; else the lower of the slowest
    block measured alone (an upper bound) and a tile of another size placed whole (an
    estimate); blocks not measured yet are named."""
    from synth import load_area

    own = TILE_DESIGNS.get(n)
    tile = (load_area(own) if own else None) or {}
    if tile.get("ecp5_fmax_mhz"):
        return tile["ecp5_fmax_mhz"], f"{tile['ecp5_fmax_mhz']:.1f} MHz ({own}, ECP5)"
    blocks, missing = {}, []
    for design in ("tensor_core_n8", "vector_unit", "scratchpad", "sequencer", "gemm_engine",
                   "network_interface", "router_v2_d6"):
        fmax = (load_area(design) or {}).get("ecp5_fmax_mhz")
        if fmax:
            blocks[design] = fmax
        else:
            missing.append(design)
    others = {size: (load_area(design) or {}).get("ecp5_fmax_mhz")
              for size, design in TILE_DESIGNS.items() if size != n}
    others = {size: fmax for size, fmax in others.items() if fmax}
    if not blocks and not others:
        return None, "not measured (run `make synth`)"
    slowest = min(blocks, key=blocks.get) if blocks else None
    other = min(others, key=others.get) if others else None
    if other is not None and (slowest is None or others[other] < blocks[slowest]):
        line = (f"{others[other]:.1f} MHz: an estimate, the N = {other} tile placed whole "
                f"({TILE_DESIGNS[other]}); the N = {n} tile's Fmax is not measured")
        if slowest is not None:
            line += f"; the slowest block measured alone: {slowest}, {blocks[slowest]:.1f} MHz"
        clock = others[other]
    else:
        line = (f"{blocks[slowest]:.1f} MHz: an upper bound, the slowest block measured alone "
                f"({slowest}); the whole tile's Fmax is not measured")
        clock = blocks[slowest]
    if missing:
        line += f"; blocks not measured yet: {', '.join(missing)} (`make synth`)"
    return clock, line


def _with_progress(simulate, prefix: str = "") -> dict:
    """``simulate(progress_file)`` in a thread, echoing the lines the simulation appends
    to the file (one per round) as they come; returns {"result": ...} or {"failure": ...}."""
    import threading

    progress = Path(tempfile.mkstemp(prefix="serrano-progress-")[1])
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = simulate(progress)
        except (SimulationFailed, ValueError) as failure:
            outcome["failure"] = failure

    worker = threading.Thread(target=run)
    worker.start()
    shown = 0
    while worker.is_alive():
        worker.join(1.0)
        lines = progress.read_text().splitlines()
        for line in lines[shown:]:
            print(f"  {prefix}{line}", flush=True)
        shown = len(lines)
    progress.unlink(missing_ok=True)
    return outcome


def sim(args: argparse.Namespace) -> int:
    """A decoder layer for a batch on the chip: prefill, then decode steps; the report."""
    from compiler.chip import KvCacheFull, accuracy, contexts, layer_rounds
    from golden.workloads import get_workload
    from tb.chip_run import chip_config, chip_figures, simulate_layer

    overrides = {name: getattr(args, name) for name, _ in SHAPE_OPTIONS
                 if getattr(args, name) is not None}
    try:
        cfg = get_workload(args.workload, **overrides)
        if args.layer is None:
            args.layer = len(cfg.windows) - 1
        if not 0 <= args.layer < len(cfg.windows):
            raise ValueError(f"workload {args.workload} has attention layers "
                             f"0..{len(cfg.windows) - 1}, not {args.layer}")
        config = chip_config(cfg, k=args.mesh, n=args.array, max_context=args.max_context,
                             moe=args.moe)
        # Compile once before simulating: a mapping the chip cannot take fails here.
        rounds = layer_rounds(config, cfg, args.layer, batch=args.batch,
                              prefill=args.prefill, context=args.context, steps=args.steps,
                              placement=args.placement, seed=args.seed, moe=args.moe)
    except ValueError as error:
        hint = (f" with --max-context {args.max_context or 'default'}; give a larger "
                "--max-context" if isinstance(error, KvCacheFull) else "")
        print(f"serrano sim: {error}{hint}", file=sys.stderr)
        return 2
    k, n, tiles = args.mesh, args.array, args.mesh * args.mesh
    starts = contexts(args.batch, args.context, args.prefill)
    window = cfg.windows[args.layer]
    print(f"serrano sim: {k}x{k} chip of N={n} tiles ({tiles} x {n * n} MAC/cycle), "
          f"{cfg.name} attention layer {args.layer} ({cfg.heads} query / {cfg.kv_heads} KV "
          f"heads, head dim {cfg.head_dim}, "
          f"{'window ' + str(window) if window else 'full causal'}), batch {args.batch}, "
          f"placement {args.placement}: prefill {args.prefill} tokens per sequence, then "
          f"{args.steps} decode steps from contexts {list(starts)}; {len(rounds)} rounds; "
          f"seed {args.seed}, simulator {args.sim}", flush=True)

    outcome = _with_progress(
        lambda progress: simulate_layer(
            config, cfg, args.layer, batch=args.batch, prefill=args.prefill,
            context=args.context, steps=args.steps, placement=args.placement,
            seed=args.seed, moe=args.moe, simulator=args.sim, waves=args.waves,
            progress=progress, dump=args.dump, activity=args.energy,
            threads=threads_of(args)))
    if "failure" in outcome:
        print(f"\nresult       FAIL\n{outcome['failure']}")
        result, passed = {}, False
    else:
        result, passed = outcome["result"], True
        metrics = chip_figures(result, k, n)
        fmax, fmax_text = _fmax_line(n)
        layer = ("golden.attention, golden.decoder and golden.moe" if args.moe
                 else "golden.attention")
        rows = [("result", f"PASS: all {metrics['outputs']} int8 outputs of "
                           f"{len(result['rounds'])} rounds bit-exact with {layer}")]
        for phase, name, label in (("prefill", "cycles", "time-to-first-token proxy"),
                                   ("decode", "cycles_per_token", "inter-token latency proxy")):
            if f"chip__{phase}__{name}" not in metrics:
                continue
            cycles = metrics[f"chip__{phase}__{name}"]
            split = f"attention {metrics[f'chip__{phase}__attention_cycles']:,}"
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
            rows.append(("", "phases (all tiles): " + _shares(metrics[f"chip__{phase}__phases"])))
        phase_accuracy = accuracy(rounds)
        rows += _accuracy_rows(phase_accuracy)
        for phase, figures in phase_accuracy.items():
            for key in ("cosine", "cosine_min_output", "max_lsb_error", "saturated",
                        "saturated_share"):
                metrics[f"chip__{phase.replace('-', '_')}__accuracy_{key}"] = figures[key]
        if args.moe:
            ratio = max(r.get("dense_over_sparse", 0) for r in result["rounds"]
                        if r["phase"].endswith("moe"))
            rows.append(("MoE", f"dense-masked: the experts compute every token, {ratio:.1f}x "
                                "the MACs of a sparse dispatch (docs/moe_mapping.md)"))
        rows += [
            ("network", f"{metrics['chip__network__flits']:,} flits injected; "
                        f"{metrics['chip__network__kv_words']:,} KV words moved by "
                        f"{args.placement} placement, {metrics['chip__network__moe_words']:,} "
                        "MoE words (tokens, expert outputs)"),
            ("clock", fmax_text),
            ("energy", _energy_line(result.get("energy"),
                                    args.batch * (args.prefill + args.steps))),
            ("simulation", f"{args.sim}: {metrics['chip__sim__cycles_per_s']:,.0f} chip "
                           "cycles/s (the rounds' cycles over their wall time, build and "
                           "host transfers excluded)"),
            ("area", (_area_line(TILE_DESIGNS[n]) + f" per tile (FPGA size), x {tiles}"
                      if n in TILE_DESIGNS else
                      f"not measured: synth/designs.py has no N = {n} tile")),
        ]
        if args.dump:
            rows.append(("dump", _dump_line(args.dump, vars(args) | {"chip": asdict(config)})))
        print()
        for label, text in rows:
            print(f"{label:<12} {text}")
        result = {**result, "metrics": metrics, "accuracy": phase_accuracy}
        if result.get("energy"):
            result["energy"] = asdict(result["energy"])
    if args.json and not write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def _accuracy_rows(phases: dict[str, dict]) -> list[tuple[str, str]]:
    """The report's accuracy rows: per phase, the run's outputs (bit-exact with the RTL)
    against their float64 twins (compiler.chip.accuracy, docs/numerics.md)."""
    rows = [("accuracy", "the run's outputs against float64 on the same int8 inputs "
                         "(cosine over the phase's outputs; worst LSB; saturated values):")]
    for phase, a in phases.items():
        saturated = (f"{a['saturated']:,} of {a['outputs']:,} requantised values saturated"
                     if a["saturated"] else f"none of {a['outputs']:,} requantised values "
                                            "saturated")
        rows.append(("", f"{phase + ':':<12} cosine {a['cosine']:.5f} (worst output "
                         f"{a['cosine_min_output']:.5f}), worst {a['max_lsb_error']:.2f} "
                         f"LSB, {saturated}"))
    return rows


def _energy_line(energy, tokens: int) -> str:
    """The report's energy row: the toggle-count proxy per token (tb.energy), or how to
    get it."""
    if energy is None:
        return ("not measured: add --energy (a SAIF-traced build, a one-off Yosys "
                "synthesis of the chip, a run about 40x slower; docs/energy.md)")
    return (f"{energy.total / tokens:,.0f} cell-toggles per token ({tokens} tokens, the "
            f"whole run with its host transfers; a relative unit: compare design points "
            f"only, docs/energy.md); {energy.shares()}")


def _dump_line(root: Path, options: dict) -> str:
    """Write ``root/run.json`` (the options and design point of a dumped run), check the
    dump's RTL outputs against its golden ones, and say what was written."""
    from golden.io import compare, load_expected

    (root / "run.json").write_text(json.dumps(
        {key: value for key, value in options.items() if key != "handler"},
        indent=2, default=str) + "\n")
    groups = sorted(d for d in root.iterdir() if (d / "manifest.json").is_file())
    outputs = wrong = 0
    for group in groups:
        mismatches = compare(load_expected(group), group / "rtl")
        outputs += len(mismatches)
        wrong += sum(mismatches.values())
    return (f"{root}: {len(groups)} workload directories (inputs, weights, scales; golden "
            f"outputs in expected/, the RTL's in rtl/), {outputs} outputs, {wrong} elements "
            "differ")


def agent(args: argparse.Namespace) -> int:
    """The agent loop with the KV cache kept (hit) and evicted (miss): end-to-end cycles."""
    from compiler.chip import agent_schedule, layer_rounds
    from golden.workloads import get_workload
    from tb.chip_run import chip_config, simulate_layer

    try:
        cfg = get_workload(args.workload)
        layer = len(cfg.windows) - 1 if args.layer is None else args.layer
        if not 0 <= layer < len(cfg.windows):
            raise ValueError(f"workload {args.workload} has attention layers "
                             f"0..{len(cfg.windows) - 1}, not {layer}")
        config = chip_config(cfg, k=args.mesh, n=args.array, moe=args.moe)
        schedules = {cache: agent_schedule(args.turns, args.prompt, args.tool, args.answer,
                                           cache) for cache in ("hit", "miss")}
        for schedule in schedules.values():  # compile once: what does not fit fails here
            layer_rounds(config, cfg, layer, moe=args.moe, schedule=schedule, seed=args.seed)
    except ValueError as error:
        print(f"serrano agent: {error}", file=sys.stderr)
        return 2
    k = args.mesh
    print(f"serrano agent: {k}x{k} chip of N={args.array} tiles, {cfg.name} layer {layer}"
          f"{' + MoE' if args.moe else ''}: {args.turns} turns of (tool result {args.tool} "
          f"tokens -> answer {args.answer} tokens) after a {args.prompt}-token prompt; the KV "
          f"cache kept (hit) or evicted and recomputed (miss); seed {args.seed}", flush=True)
    totals, results = {}, {}
    for cache, schedule in schedules.items():
        outcome = _with_progress(
            lambda progress, schedule=schedule: simulate_layer(
                config, cfg, layer, moe=args.moe, schedule=schedule, seed=args.seed,
                simulator=args.sim, waves=args.waves, progress=progress,
                threads=threads_of(args)), prefix=f"{cache}: ")
        if "failure" in outcome:
            print(f"\nresult       FAIL ({cache})\n{outcome['failure']}")
            return 1
        result = outcome["result"]
        rounds = result["rounds"]
        attention = sum(r["cycles"] for r in rounds if not r["phase"].endswith("moe"))
        moe = sum(r["cycles"] for r in rounds if r["phase"].endswith("moe"))
        totals[cache] = attention + moe
        results[cache] = {"rounds": rounds, "cycles": attention + moe,
                          "attention_cycles": attention, "moe_cycles": moe}
        print(f"  {cache}: {len(rounds)} rounds, every output bit-exact", flush=True)
    speedup = totals["miss"] / totals["hit"]
    print()
    for cache, text in (("hit", "cache kept: each tool result prefilled over it"),
                        ("miss", "cache evicted: the context prefilled again every turn")):
        r = results[cache]
        print(f"{cache:<12} {r['cycles']:,} cycles end to end (attention "
              f"{r['attention_cycles']:,} + MoE {r['moe_cycles']:,}); {text}")
    print(f"{'hit/miss':<12} {speedup:.2f}x faster with the cache kept")
    if args.json and not write_json(args, {"passed": True, **results,
                                           "chip__agent_loop__hit_over_miss__speedup":
                                           round(speedup, 3)}):
        return 1
    return 0


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
    if args.json and not write_json(args, {"passed": passed, **result}):
        return 1
    return 0 if passed else 1


def _add_threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_at_most_cores, default=1,
                        help="Verilator threads evaluating the chip (default 1; a separate "
                             "build). 2 runs the 2 x 2 chip up to 1.7x faster on two idle "
                             "cores, and several times slower when other jobs share them: "
                             "a waiting thread spins")


def _at_most_cores(text: str) -> int:
    threads, cores = _positive(text), os.cpu_count() or 1
    if threads > cores:
        raise argparse.ArgumentTypeError(f"{threads} threads on {cores} cores would spin "
                                         "against each other")
    return threads


def threads_of(args: argparse.Namespace) -> int:
    """Verilator threads for a chip run (Icarus runs on one)."""
    return args.threads if args.sim == "verilator" else 1


def _add_run_options(parser: argparse.ArgumentParser, *, workload_default: str = "gpt-oss"
                     ) -> None:
    """Options every simulating command shares: workload, array size, simulator, waves,
    JSON output."""
    parser.add_argument("--workload", type=_workload, default=workload_default,
                        help="miniature workload (tiny, gpt-oss, deepseek-r1, kimi-k2; "
                             f"default {workload_default})")
    parser.add_argument("--array", type=_tile_array_size, default=8, metavar="N",
                        help="tensor core and vector unit size N (a power of two, default 8)")
    parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                        help="simulator (default verilator)")
    parser.add_argument("--waves", action="store_true",
                        help="record waves (in the run directory under sim_build/)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="serrano", description="serrano: cycle-accurate RTL model of an inference accelerator"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim_parser = commands.add_parser(
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
    sim_parser.add_argument("--layer", type=_non_negative, default=None,
                            help="attention layer (default: the workload's last, e.g. "
                                 "gpt-oss's full-causal layer 1)")
    sim_parser.add_argument("--mesh", type=_mesh, default=2, metavar="KxK",
                            help="mesh of tiles (default 2x2; 1x1 is one tile)")
    sim_parser.add_argument("--placement", choices=("local", "striped"), default="local",
                            help="KV pages on the tile computing their head (local, default)"
                                 " or spread over the tiles and fetched over the network "
                                 "(striped)")
    sim_parser.add_argument("--batch", type=_positive, default=2,
                            help="sequences decoded together, each with its own context "
                                 "(default 2)")
    sim_parser.add_argument("--prefill", type=_non_negative, default=32,
                            help="prompt tokens prefilled per sequence (default 32; 0: none)")
    sim_parser.add_argument("--context", type=_non_negative, default=256,
                            help="tokens of the longest sequence before its first decode "
                                 "step; the others have a little less (default 256)")
    sim_parser.add_argument("--steps", type=_non_negative, default=2,
                            help="decode steps, each appending one token per sequence "
                                 "(default 2)")
    sim_parser.add_argument("--max-context", type=_positive, default=None,
                            help="size the tiles' KV caches for this many tokens per "
                                 "sequence (default 2048, or 64 when the workload's pages "
                                 "are smaller than N, e.g. tiny at N = 8, at most what the "
                                 "block table maps; one build per size)")
    for name, what in SHAPE_OPTIONS:
        sim_parser.add_argument(f"--{name.replace('_', '-')}", type=_dimension, default=None,
                                help=f"custom shape: {what} (default: the workload's)")
    sim_parser.add_argument("--no-moe", dest="moe", action="store_false",
                            help="attention alone (the MoE layer is run after every phase "
                                 "step by default)")
    sim_parser.add_argument("--seed", type=_non_negative, default=1,
                            help="seed of the workload's tensors: one layer's weights, "
                                 "each sequence's tokens from its own stream")
    sim_parser.add_argument("--energy", action="store_true",
                            help="measure the energy proxy: toggle counts (a SAIF-traced "
                                 "build) weighted by synthesised cells (docs/energy.md)")
    sim_parser.add_argument("--dump", type=Path, metavar="DIR",
                            help="write every job's inputs, weights and scales, golden and "
                                 "RTL outputs to DIR in the golden file format (docs/chip.md); "
                                 "DIR must be new or empty")
    sim_parser.add_argument("--force", action="store_true",
                            help="with --dump: empty a used DIR first")
    _add_run_options(sim_parser)
    _add_threads_option(sim_parser)
    sim_parser.set_defaults(handler=sim)

    agent_parser = commands.add_parser(
        "agent", help="an agent loop on the chip, KV cache kept (hit) vs recomputed (miss)",
        description="Simulate one sequence's agent loop on the chip twice: a prompt is "
                    "prefilled and answered, then each turn appends a tool result to the "
                    "context and decodes an answer. With the KV cache kept (hit) the tool "
                    "result is prefilled over the cached context (an extend step); with it "
                    "evicted (miss) the whole context is prefilled again. Every output is "
                    "checked against golden; prints the end-to-end cycles of both and their "
                    "ratio.",
    )
    agent_parser.add_argument("--layer", type=_non_negative, default=None,
                              help="attention layer (default: the workload's last)")
    agent_parser.add_argument("--mesh", type=_mesh, default=2, metavar="KxK",
                              help="mesh of tiles (default 2x2)")
    agent_parser.add_argument("--turns", type=_positive, default=3,
                              help="turns, the first answering the prompt (default 3)")
    agent_parser.add_argument("--prompt", type=_positive, default=32,
                              help="prompt tokens (default 32)")
    agent_parser.add_argument("--tool", type=_positive, default=8,
                              help="tokens of each tool result (default 8)")
    agent_parser.add_argument("--answer", type=_positive, default=2,
                              help="tokens decoded per answer (default 2)")
    agent_parser.add_argument("--no-moe", dest="moe", action="store_false",
                              help="attention alone (the MoE layer follows every step by "
                                   "default)")
    _add_run_options(agent_parser)
    agent_parser.add_argument("--seed", type=_non_negative, default=1,
                              help="seed of the tensors (default 1)")
    _add_threads_option(agent_parser)
    agent_parser.set_defaults(handler=agent)

    from tb.sweep import add_parser as add_sweep_parser

    _add_threads_option(add_sweep_parser(commands, _workload, _mesh, _tile_array_size, _positive,
                                         _non_negative, SIMULATORS))

    tile_parser = commands.add_parser(
        "tile", help="attention prefill + decode on one tile, checked against golden",
        description="Simulate attention on one tile (cocotb + Verilator by default): a "
                    "prefill of a prompt, then decode steps that append each token's K/V "
                    "to the paged KV cache; every output is compared bit for bit with "
                    "golden.attention; prints cycles, utilisation, the decode bandwidth "
                    "bound, the cycle breakdown by phase, simulation speed and area.",
    )
    tile_parser.add_argument("--layer", type=_non_negative, default=None,
                            help="attention layer of the workload (default: its last, e.g. "
                                 "gpt-oss's full-causal layer 1; 0 is its sliding-window "
                                 "layer)")
    tile_parser.add_argument("--prefill", type=_non_negative, default=32,
                            help="prompt tokens to prefill (default 32; 0: no prefill)")
    tile_parser.add_argument("--context", type=_non_negative, default=256,
                            help="tokens in the KV cache before the first decode step; "
                                 "those beyond the prompt are appended directly (default 256)")
    tile_parser.add_argument("--steps", type=_non_negative, default=4,
                            help="decode steps, each appending one token (default 4)")
    tile_parser.add_argument("--max-context", type=_positive, default=None,
                            help="size the tile's KV cache for this many tokens (default: "
                                 "tb.tile_run.tile_config's, 1056 tokens with 16-token pages, "
                                 "or what the run needs if more; one build per size)")
    tile_parser.add_argument("--seed", type=_non_negative, default=1,
                            help="seed of the workload tensors and the stall generators")
    tile_parser.add_argument("--idle", type=_probability, default=0.0,
                            help="probability that a host stream withholds a beat each cycle")
    tile_parser.add_argument("--stall", type=_probability, default=0.0,
                            help="probability that a host response stream is not ready")
    _add_run_options(tile_parser)
    tile_parser.set_defaults(handler=tile)

    gemm_parser = commands.add_parser(
        "gemm", help="simulate one GEMM on the tensor core alone and report",
        description="Simulate a GEMM on the tensor core (cocotb + Verilator by default), "
                    "check every output against the golden model and print cycles, "
                    "utilisation, simulation speed and area (when `make synth` has run).",
    )
    gemm_parser.add_argument("--array", type=_array_size, default=8, metavar="N",
                             help=f"tensor core size N ({MIN_N}..{MAX_N}, default 8)")
    gemm_parser.add_argument("--m", type=_dimension, default=64, help="rows of A (default 64)")
    gemm_parser.add_argument("--k", type=_dimension, default=64,
                             help="inner dimension (default 64)")
    gemm_parser.add_argument("--p", type=_dimension, default=64,
                             help="columns of B (default 64)")
    gemm_parser.add_argument("--seed", type=_non_negative, default=1,
                             help="random seed (default 1)")
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

    args, extra = parser.parse_known_args(argv)
    if extra:  # said by the subcommand, with its usage
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = check_output_paths(args)
    if problem:
        print(f"serrano {args.command}: {problem}", file=sys.stderr)
        return 2
    return args.handler(args)


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


def write_json(args: argparse.Namespace, figures: dict) -> bool:
    """Write ``figures`` to ``args.json`` (its folders made); a failure is said as what it
    is, after the run's own report (False)."""
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    except OSError as error:
        print(f"serrano {args.command}: the run's figures were not written to {args.json}: "
              f"{error.strerror or error}", file=sys.stderr)
        return False
    print(f"\nwrote {args.json}")
    return True


def _unwritable(path: Path) -> str | None:
    """Why a file could not be created at ``path`` (None if it could): the nearest
    existing folder on its way must be a writable folder."""
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    try:  # a probe: permissions, a read-only or pseudo file system alike
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return f"{folder} is not writable ({error.strerror or error})"
    return None


def check_output_paths(args: argparse.Namespace) -> str | None:
    """Check every output path of a command before anything is built or simulated:
    ``--json`` (a file), ``--plot`` (a prefix of files), ``--dump`` (an empty or new
    folder; with ``--force`` a used one is emptied first). Returns the problem, if any."""
    for name in ("json", "plot"):
        path = getattr(args, name, None)
        if path is None:
            continue
        if path.is_dir():
            return f"--{name} {path} is a folder, not a file"
        if (reason := _unwritable(path)) is not None:
            return f"cannot write --{name} {path}: {reason}"
        if path.exists() and not os.access(path, os.W_OK):
            return f"cannot write --{name} {path}: the file is not writable"
    dump = getattr(args, "dump", None)
    if dump is not None:
        if dump.exists() and not dump.is_dir():
            return f"--dump {dump} is a file, not a folder"
        if dump.is_dir() and any(dump.iterdir()):
            if not args.force:
                return (f"--dump {dump} holds an earlier run's files; give an empty or new "
                        "folder, or --force to empty it first")
            try:
                shutil.rmtree(dump)
            except OSError as error:
                return f"cannot empty --dump {dump}: {error.strerror or error}"
        if (reason := _unwritable(dump / "run.json")) is not None:
            return f"cannot write --dump {dump}: {reason}"
    return None


if __name__ == "__main__":
    entry()
