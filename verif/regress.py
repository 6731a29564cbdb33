"""``make regress`` (``python -m verif.regress``): the suite, every random test over many seeds.

A *random test* takes the ``seed`` fixture (tests/conftest.py); the regression runs each
for seeds ``B … B+N-1`` and every other test once, the ``nightly`` ones included
(``--random-only``: the random tests alone), under pytest-xdist, or one deterministic shard of them
(``--shard i/k``: every k-th test of the collection order, so k machines — a CI matrix,
a Slurm array — split one regression between them). Per shard it writes, under
``build/regress/shard-<i>-of-<k>/``, the JUnit XML and the functional coverage every
process sampled (:mod:`sim.coverage`). A failing seed is run again alone with waves
(``WAVES=1``: FST for the cocotb tests) and the one command that reproduces it is
printed. Then it merges the coverage of every shard of the same ``k`` found there and
prints a summary (pass rate per test, seeds, wall time, cover points); ``build/regress.json``
holds the same with ``regress__pass_rate`` and ``coverage__bins_hit_share``.

``--merge`` only merges and summarises the shards already in ``build/regress/`` (the
last job of a CI matrix, after collecting every shard's directory).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from sim import coverage

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "regress"
REPORT = ROOT / "build" / "regress.json"
#: The seed's part of a parametrized test id (``s7``, first, last or between others).
_SEED_ID = re.compile(r"(?:^|-)s(\d+)(?=-|$)")


def _shard_dir(out: Path, index: int, count: int) -> Path:
    return out / f"shard-{index}-of-{count}"


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/k"`` -> (i, k), 1 <= i <= k; ValueError otherwise (also for ``--shard``)."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"shard {text!r}: expected i/k, e.g. 2/4") from None
    if not 1 <= index <= count:
        raise ValueError(f"shard {text!r}: need 1 <= i <= k")
    return index, count


def _shard_arg(text: str) -> tuple[int, int]:
    try:
        return parse_shard(text)
    except ValueError as why:
        raise argparse.ArgumentTypeError(str(why)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be at least 1")
    return value


def run_shard(args) -> float:
    """Run this shard's tests; return the wall time in seconds."""
    index, count = args.shard
    directory = _shard_dir(args.out, index, count)
    subprocess.run(["rm", "-rf", str(directory)], check=True)
    (directory / "coverage").mkdir(parents=True)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nightly",
               f"--seeds={args.seeds}", f"--seed-base={args.seed_base}",
               f"--shard={index}/{count}", f"--junitxml={directory / 'junit.xml'}",
               "-o", "junit_family=xunit1", "-q"]
    if args.jobs > 1:
        command += ["-n", str(args.jobs), "--dist", "loadgroup"]
    if args.select:
        command += ["-k", args.select]
    if args.random_only:
        command += ["-m", "seeded"]
    print(f"[regress] shard {index}/{count}: seeds {args.seed_base}..."
          f"{args.seed_base + args.seeds - 1}, {args.jobs} worker(s)", flush=True)
    env = os.environ | {coverage.ENV: str(directory / "coverage")}
    start = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, check=False)
    wall = time.monotonic() - start
    (directory / "run.json").write_text(json.dumps({
        "seeds": args.seeds, "seed_base": args.seed_base, "shard": [index, count],
        "wall_s": wall, "select": args.select, "random_only": args.random_only}, indent=2))
    return wall


def results(directory: Path) -> list[dict]:
    """One row per test run of a shard's JUnit XML: node id, test, seed, outcome, time."""
    path = directory / "junit.xml"
    if not path.exists():
        return []
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module, name = case.get("classname", ""), case.get("name", "")
        if not module:  # a module that failed to import: the name is the module
            module, name = name, ""
        module = module.replace(".", "/") + ".py"
        test, _, ids = name.partition("[")
        ids = ids.rstrip("]")
        match = _SEED_ID.search(ids)
        seed = int(match.group(1)) if match else None
        rest = _SEED_ID.sub("", ids).strip("-")
        outcome = ("failed" if case.find("failure") is not None or case.find("error") is not None
                   else "skipped" if case.find("skipped") is not None else "passed")
        nodeid = f"{module}::{name}" if name else module
        rows.append({"nodeid": nodeid, "test": (f"{module}::{test}" if test else module)
                     + (f"[{rest}]" if rest else ""), "seed": seed, "outcome": outcome,
                     "time_s": float(case.get("time", 0.0))})
    return rows


def reproduce(row: dict) -> str:
    """The command that runs one failing test at its seed again, with waves."""
    seeds = "" if row["seed"] is None else f"--seeds 1 --seed-base {row['seed']} "
    return (f"WAVES=1 .venv/bin/python -m pytest -p no:cacheprovider {seeds}"
            f"{shlex.quote(row['nodeid'])}")


def rerun_with_waves(rows: list[dict], limit: int) -> list[dict]:
    failures = [r for r in rows if r["outcome"] == "failed"]
    out = []
    for row in failures[:limit]:
        command = reproduce(row)
        print(f"[regress] re-running {row['nodeid']} with waves:\n  {command}", flush=True)
        start = time.time()
        done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                              text=True, check=False)
        waves = sorted(str(p.relative_to(ROOT)) for pattern in ("*.fst", "*.vcd")
                       for p in (ROOT / "sim_build").rglob(pattern)
                       if p.stat().st_mtime >= start)
        for path in waves:
            print(f"  waves: {path}")
        out.append({**row, "command": command, "failed_again": done.returncode != 0,
                    "log_tail": done.stdout[-3000:], "waves": waves})
    for row in failures[limit:]:
        out.append({**row, "command": reproduce(row)})
    return out


def summarise(out: Path, count: int) -> dict:
    """Merge every shard of ``count`` in ``out``; print and return the summary."""
    shards = sorted(out.glob(f"shard-*-of-{count}"))
    if not shards:
        raise SystemExit(f"[regress] no shard of {count} in {out}; run make regress first")
    rows, wall, meta = [], 0.0, []
    for shard in shards:
        rows += results(shard)
        if (shard / "run.json").exists():
            info = json.loads((shard / "run.json").read_text())
            meta.append(info)
            wall = max(wall, info["wall_s"])
    files = sorted(p for shard in shards for p in (shard / "coverage").glob("*.yml"))
    merged = out / f"coverage-of-{count}.yml"
    cover = coverage.merge(files, merged) if files else {
        "points": {}, "bins_hit": 0, "bins_total": 0, "bins_hit_share": 0.0}

    per_test: dict[str, dict] = defaultdict(lambda: {"runs": 0, "passed": 0, "seeds": set(),
                                                      "time_s": 0.0})
    for row in rows:
        entry = per_test[row["test"]]
        entry["runs"] += 1
        entry["passed"] += row["outcome"] == "passed"
        entry["seeds"].add(row["seed"])
        entry["time_s"] += row["time_s"]
    ran = [r for r in rows if r["outcome"] != "skipped"]
    passed = sum(r["outcome"] == "passed" for r in ran)
    width = max((len(t) for t in per_test), default=10)
    print(f"\n{'test':<{width}}  {'seeds':>5}  {'pass rate':>9}  {'time (s)':>8}")
    for test, e in sorted(per_test.items()):
        print(f"{test:<{width}}  {len(e['seeds']):>5}  {e['passed'] / e['runs']:>9.2%}  "
              f"{e['time_s']:>8.1f}")
    print(f"\n{len(ran)} runs of {len(per_test)} tests in {len(shards)} shard(s) of {count}: "
          f"{passed} passed ({passed / len(ran) if ran else 0:.2%}), wall {wall:.0f} s "
          f"(the slowest shard)")
    print(f"coverage: {cover['bins_hit']} of {cover['bins_total']} bins hit "
          f"({cover['bins_hit_share']:.2%}), {merged}")
    for point, bins in cover["points"].items():
        missed = [str(b) for b, hits in bins.items() if hits == 0]
        hit = len(bins) - len(missed)
        print(f"  {point:<22} {hit:>3}/{len(bins):<3}" + (f"  missed: {', '.join(missed)}"
                                                         if missed else ""))
    return {
        "regress__pass_rate": passed / len(ran) if ran else 0.0,
        "coverage__bins_hit_share": cover["bins_hit_share"],
        "runs": len(ran), "passed": passed, "wall_s": wall,
        "shards": [m["shard"] for m in meta],
        "seeds": sorted({m["seed_base"] + i for m in meta for i in range(m["seeds"])}),
        "tests": {t: {"runs": e["runs"], "passed": e["passed"], "seeds": len(e["seeds"]),
                      "time_s": round(e["time_s"], 2)} for t, e in sorted(per_test.items())},
        "coverage": {"bins_hit": cover["bins_hit"], "bins_total": cover["bins_total"],
                     "points": cover["points"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verif.regress",
        description="Run every random test (those taking the `seed` fixture) over many "
                    "seeds; JUnit XML, merged functional coverage, build/regress.json.")
    parser.add_argument("--seeds", type=_positive, default=4, help="seeds per test (default 4)")
    parser.add_argument("--seed-base", type=int, default=1,
                        help="first seed (default 1; make test runs seed 0)")
    parser.add_argument("--shard", type=_shard_arg, default=(1, 1), metavar="I/K",
                        help="run shard I of K (1-based; default 1/1: everything)")
    parser.add_argument("--jobs", type=_positive, default=2, help="pytest-xdist workers")
    parser.add_argument("-k", dest="select", default="",
                        help="only tests matching this pytest -k expression")
    parser.add_argument("--random-only", action="store_true",
                        help="only the random tests (skip the tests without a seed)")
    parser.add_argument("--reruns", type=int, default=3,
                        help="failing seeds re-run with waves (default 3)")
    parser.add_argument("--merge", action="store_true",
                        help="only merge the shards of K already in the output directory")
    parser.add_argument("--out", type=Path, default=OUT,
                        help="directory of the shards and the merged coverage "
                             "(default build/regress)")
    parser.add_argument("--report", type=Path, default=REPORT,
                        help="the summary as JSON (default build/regress.json)")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()

    index, count = args.shard
    failures = []
    if not args.merge:
        run_shard(args)
        failures = rerun_with_waves(results(_shard_dir(args.out, index, count)), args.reruns)
    summary = summarise(args.out, count)
    summary["failures"] = failures or [
        {**r, "command": reproduce(r)}
        for shard in sorted(args.out.glob(f"shard-*-of-{count}")) for r in results(shard)
        if r["outcome"] == "failed"]
    for failure in summary["failures"]:
        print(f"FAILED {failure['nodeid']} (seed {failure['seed']})\n"
              f"  reproduce: {failure['command']}")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(summary, indent=2, default=str))
    print(f"[regress] wrote {args.report}")
    return 1 if summary["failures"] or not summary["runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
