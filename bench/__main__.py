"""``python -m bench``: run the benchmarks, write build/bench.json, print a table."""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

from bench import MODULES
from spec import provenance

BENCH_JSON = Path("build/bench.json")


def _meets(value, rule) -> str:
    if rule is None or value is None:
        return ""
    op, bound = rule
    ok = value >= bound if op == ">=" else value <= bound
    return f"{op} {bound:g}  {'ok' if ok else 'MISSED'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--only", action="append", choices=MODULES, help="run only this benchmark (repeatable)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller sweeps, for checking the benchmarks run"
    )
    parser.add_argument("--json", type=Path, default=BENCH_JSON, help="where to merge the metrics")
    args = parser.parse_args(argv)

    modules = {name: importlib.import_module(f"bench.{name}") for name in MODULES}
    targets: dict = {}
    for module in modules.values():  # every target, also of metrics kept from earlier runs
        targets.update(module.TARGETS)
    measured: dict = {}
    for name in args.only or MODULES:
        print(f"[bench] {name} ...", flush=True)
        start = time.perf_counter()
        measured.update(modules[name].run(quick=args.quick))
        print(f"[bench] {name} done in {time.perf_counter() - start:.1f} s", flush=True)
    # Read now, not at the start: what another bench run wrote meanwhile is kept.
    metrics: dict = json.loads(args.json.read_text()) if args.json.exists() else {}
    metrics.update(measured)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    provenance.record(args.json, measured)

    width = max(len(k) for k in metrics)
    print(f"\n{'metric':<{width}}  {'value':>14}  target")
    for key in sorted(metrics):
        value = metrics[key]
        shown = "n/a" if value is None else f"{value:.6g}" if isinstance(value, float) else value
        print(f"{key:<{width}}  {shown:>14}  {_meets(value, targets.get(key))}")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
