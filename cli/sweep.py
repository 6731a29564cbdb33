"""``serrano sweep``: one decode step of a workload over design points, as JSON and plots.

A design point is (mesh, array size, memory bandwidth) — one simulation build each —
and a run is (placement, batch) on it: the batch's sequences at their contexts, one
decode step (and
the MoE layer unless ``--no-moe``), every output checked against golden. Per run: decode
cycles per token (per-sequence speed), tokens per cycle of the chip (throughput), the
access-energy model's pJ per token (:func:`sim.chip_run.round_energy`) and with
``--energy`` the toggle-count energy proxy per token (:mod:`sim.energy`). The Pareto
plot is throughput per energy (the toggle proxy's with ``--energy``, else the access
model's) against per-sequence decode speed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cli import options
from sim.runner import SIMULATORS, SimulationFailed


def points(args: argparse.Namespace) -> list[dict]:
    """Every run of the sweep, builds outermost (each design point is built once)."""
    return [{"mesh": k, "array": n, "memory_bandwidth": bandwidth, "placement": placement,
             "batch": batch}
            for k in args.mesh for n in args.array for bandwidth in args.memory_bandwidth
            for placement in args.placement for batch in args.batch]


def run_point(args: argparse.Namespace, point: dict) -> dict:
    """Simulate one run of the sweep; its figures (or the reason it could not run)."""
    from compiler.chip import layer_rounds
    from golden.workloads import get_workload
    from sim.chip_run import chip_config, chip_figures, simulate_layer

    cfg = get_workload(args.workload)
    k, n, batch = point["mesh"], point["array"], point["batch"]
    layer = _layer(args)
    try:
        config = chip_config(cfg, k=k, n=n, moe=args.moe, moe_tokens=args.moe_tokens,
                             memory_bandwidth=point["memory_bandwidth"])
        # Compiled before building: a point the chip cannot take fails here, not after.
        rounds = layer_rounds(config, cfg, layer, batch=batch, context=args.context, steps=1,
                              placement=point["placement"], seed=args.seed, moe=args.moe,
                              moe_tokens=args.moe_tokens, weights=args.weights)
        started = time.monotonic()
        result = simulate_layer(config, cfg, layer, batch=batch, context=args.context,
                                steps=1, placement=point["placement"], seed=args.seed,
                                moe=args.moe, simulator=args.sim, activity=args.energy,
                                threads=options.threads_of(args), rounds=rounds,
                                moe_tokens=args.moe_tokens, weights=args.weights)
    except (ValueError, SimulationFailed) as error:
        return {**point, "passed": False, "error": str(error).splitlines()[0]}
    figures = chip_figures(result, config)
    cycles = figures["chip__decode__cycles_per_token"]
    out = {**point, "passed": True, "decode_cycles_per_token": cycles,
           "attention_cycles": figures["chip__decode__attention_cycles"],
           "tokens_per_kcycle": round(1000 * batch / cycles, 4),
           "tokens_per_kcycle_per_tile": round(1000 * batch / cycles / (k * k), 4),
           "utilisation": figures["chip__decode__utilisation"],
           "network_flits": figures["chip__network__flits"],
           "access_energy_per_token_pj": figures["chip__decode__energy_per_token_pj"],
           "wall_s": round(time.monotonic() - started, 1)}
    if args.energy:
        energy = result["energy"]
        out["energy_per_token"] = round(energy.total / batch)
        out["energy_blocks"] = {name: round(value) for name, value in energy.blocks.items()}
    return out


def _design(run: dict) -> str:
    """A run's design point as the plots label it."""
    bandwidth = run["memory_bandwidth"]
    return (f"{run['mesh']}x{run['mesh']} N={run['array']}"
            + (f" {bandwidth} B/cycle" if bandwidth else ""))


def plot(runs: list[dict], prefix: Path, energy: bool) -> list[Path]:
    """The Pareto view and local vs striped, as PNGs next to ``prefix``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in runs if r["passed"]]
    written: list[Path] = []
    if not done:
        return written
    fig, ax = plt.subplots(figsize=(7, 5))
    for placement, marker in (("local", "o"), ("striped", "s")):
        mine = [r for r in done if r["placement"] == placement]
        if not mine:
            continue
        x = [1000 / r["decode_cycles_per_token"] for r in mine]
        y = [r["tokens_per_kcycle"] / r["energy_per_token"] * 1e6 if energy
             else r["tokens_per_kcycle"] / r["access_energy_per_token_pj"] * 1e6
             for r in mine]
        ax.scatter(x, y, marker=marker, label=placement)
        for r, xi, yi in zip(mine, x, y, strict=True):
            ax.annotate(f"{_design(r)} B={r['batch']}", (xi, yi),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("per-sequence decode speed (tokens per 1000 cycles)")
    ax.set_ylabel("throughput per energy (tokens per 1000 cycles per 10^6 cell-toggles "
                  "per token)" if energy else
                  "throughput per energy (tokens per 1000 cycles per µJ per token, "
                  "access model)")
    ax.set_title("decode: throughput against per-sequence speed")
    ax.grid(True, alpha=0.3)
    ax.legend()
    written.append(_save(fig, prefix, "pareto"))

    pairs = sorted({(_design(r), r["batch"]) for r in done})
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.4
    for offset, placement in ((-width / 2, "local"), (width / 2, "striped")):
        values = []
        for key in pairs:
            match = [r for r in done if (_design(r), r["batch"]) == key
                     and r["placement"] == placement]
            values.append(match[0]["decode_cycles_per_token"] if match else 0)
        ax.bar([i + offset for i in range(len(pairs))], values, width, label=placement)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels([f"{design} B={b}" for design, b in pairs], fontsize=8)
    ax.set_ylabel("decode cycles per token")
    ax.set_title("KV placement: local against striped")
    ax.legend()
    written.append(_save(fig, prefix, "placement"))
    return written


def _save(fig, prefix: Path, what: str) -> Path:
    import matplotlib.pyplot as plt

    path = prefix.with_name(f"{prefix.name}_{what}.png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _layer(args: argparse.Namespace) -> int:
    """The attention layer the sweep runs (``--layer``, else the workload's last)."""
    from golden.workloads import get_workload

    layers = len(get_workload(args.workload).windows)
    return layers - 1 if args.layer is None else args.layer


def sweep(args: argparse.Namespace) -> int:
    """Run every point, print a table as it goes, write the JSON and the plots."""
    from golden.workloads import get_workload

    layers = len(get_workload(args.workload).windows)
    if not 0 <= _layer(args) < layers:
        print(f"serrano sweep: workload {args.workload} has attention layers "
              f"0..{layers - 1}, not {args.layer}", file=sys.stderr)
        return 2
    todo = points(args)
    print(f"serrano sweep: {args.workload}, one decode step from context {args.context}"
          f"{' (attention only)' if args.moe == 'off' else f', MoE {args.moe}'}, "
          f"{len(todo)} runs on "
          f"{len({(p['mesh'], p['array'], p['memory_bandwidth']) for p in todo})} design points"
          f"{', cell-toggle energy proxy on' if args.energy else ''}", flush=True)
    header = (f"{'mesh':>5} {'N':>3} {'memory':>7} {'placement':>9} {'batch':>5} "
              f"{'cycles/token':>12} "
              f"{'tokens/kcycle':>13} {'util':>6} {'µJ/token':>9}"
              + (f" {'toggles/token':>13}" if args.energy else ""))
    print(header, flush=True)
    runs = []
    for point in todo:
        r = run_point(args, point)
        runs.append(r)
        head = (f"{r['mesh']}x{r['mesh']:<3} {r['array']:>3} "
                f"{r['memory_bandwidth'] or 'default':>7} {r['placement']:>9} {r['batch']:>5}")
        if not r["passed"]:
            print(f"{head} FAIL: {r['error']}", flush=True)
            continue
        line = (f"{head} {r['decode_cycles_per_token']:>12,} {r['tokens_per_kcycle']:>13.3f} "
                f"{r['utilisation']:>6.3f} {r['access_energy_per_token_pj'] / 1e6:>9.3f}")
        if args.energy:
            line += f" {r['energy_per_token']:>13,}"
        print(line, flush=True)
    try:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"workload": args.workload, "context": args.context,
                                         "moe": args.moe, "moe_tokens": args.moe_tokens,
                                         "runs": runs}, indent=2) + "\n")
        print(f"wrote {args.json}")
        for path in plot(runs, args.plot, args.energy):
            print(f"wrote {path}")
    except OSError as error:
        print(f"serrano sweep: the runs' figures were not written ({error})", file=sys.stderr)
        return 1
    return 0 if all(r["passed"] for r in runs) else 1


def add_parser(commands) -> argparse.ArgumentParser:
    """Register ``serrano sweep``."""
    parser = commands.add_parser(
        "sweep", help="one decode step over design points: JSON and Pareto/placement plots",
        description="Simulate one decode step of a workload's last attention layer (and "
                    "its MoE layer unless --no-moe) for every combination of mesh, array "
                    "size, KV placement and batch; every output checked against golden. "
                    "Each (mesh, array) is one build. Prints a row per run and writes the "
                    "runs as JSON, a Pareto plot (throughput per energy, with --energy, "
                    "against per-sequence decode speed) and local vs striped placement.",
    )
    parser.add_argument("--workload", type=options.workload, default="gpt-oss",
                        help="miniature workload (default gpt-oss)")
    parser.add_argument("--layer", type=options.non_negative, default=None,
                        help="attention layer (default: the workload's last)")
    parser.add_argument("--mesh", type=options.list_of(options.mesh), default=[2],
                        metavar="KxK[,KxK]", help="meshes (default 2x2)")
    parser.add_argument("--array", type=options.list_of(options.tile_array_size), default=[8],
                        metavar="N[,N]", help="tensor core sizes (default 8)")
    options.add_memory_bandwidth_option(parser, many=True)
    parser.add_argument("--placement", type=options.list_of(options.placement),
                        default=["local", "striped"], metavar="P[,P]",
                        help="KV placements: local, striped, far (default local,striped)")
    parser.add_argument("--batch", type=options.list_of(options.positive), default=[1, 2, 4],
                        metavar="B[,B]", help="batch sizes (default 1,2,4)")
    parser.add_argument("--context", type=options.non_negative, default=256,
                        help="tokens of the longest sequence before the step (default 256)")
    options.add_moe_options(parser, "after every step")
    parser.add_argument("--energy", action="store_true",
                        help="measure the cell-toggle energy proxy of every run too "
                             "(SAIF-traced builds)")
    parser.add_argument("--seed", type=options.non_negative, default=1,
                        help="seed of the tensors (default 1)")
    parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                        help="simulator (default verilator)")
    parser.add_argument("--json", type=Path, default=Path("build/sweep.json"),
                        help="where the runs go (default build/sweep.json)")
    parser.add_argument("--plot", type=Path, default=Path("build/sweep"),
                        help="plot prefix: PREFIX_pareto.png, PREFIX_placement.png "
                             "(default build/sweep)")
    options.add_threads_option(parser)
    parser.set_defaults(handler=sweep)
    return parser
