"""``make results`` (``python -m verif.results``): the result tables of README.md and
docs/results.md, generated from the reports under ``build/``.

A generated table sits between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``
and says which command measured its figures and when (``spec.provenance``). A table
whose report is missing is left as it is, and the run says so: a fresh clone keeps the
committed figures until it measures its own. A benchmark report that holds only some
figures (``make bench ARGS='--only chip'``) updates those: the figures it lacks keep
their rows of docs/results.md's table, each with the date and command that measured it,
and the README's headline takes them from there too.

    make bench && make mutate && make synth && make results  # then commit README.md, docs/
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path

from bench import MODULES
from spec import provenance
from synth import DESIGNS, metric_name
from synth.designs import PNR_TARGET_MHZ
from synth.flow import DEFAULT_FREQ_MHZ

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
#: The headline figures in README.md: (bench metric, what it is).
HEADLINES = [
    ("chip__gpt-oss__prefill__cycles", "`make sim`'s chip, prefill of 32 tokens x 2 "
                                       "sequences, decoder layer (cycles)"),
    ("chip__gpt-oss__decode__cycles_per_token", "the same, one decode step (cycles)"),
    ("chip__gpt-oss__decode__memory_bound_ratio", "that step's cycles over its largest "
                                                  "roofline bound"),
    ("chip__gpt-oss__decode__energy_per_token_pj", "that step's energy per token, access "
                                                   "model (pJ)"),
    ("chip__sim__cycles_per_s", "Verilator, chip cycles simulated per second"),
    ("chip__agent_loop__hit_over_miss__speedup", "agent loop, KV cache kept over recomputed"),
    ("serve__matched_lo__local_over_far__throughput_per_energy",
     "serving gpt-oss, KV in the computing tile over KV in the memory channels: tokens per "
     "joule at matched interactivity (25 % of the range)"),
    ("serve__matched_lo__local_over_far__e2e_speedup",
     "the same, end-to-end p50 latency far over local at matched throughput"),
    ("accuracy__chip__attention_cosine_min", "attention outputs against float64, worst cosine"),
    ("accuracy__chip__moe_cosine_min", "MoE outputs against float64, worst cosine"),
    ("tensor_core__utilisation__n8_k64n", "tensor core utilisation, N = 8, long K"),
    ("reliability__single_bit_faults_injected", "single-bit faults injected into stored "
                                                "words the chip reads, the default layer "
                                                "with one decode step"),
    ("reliability__single_bit_faults_survived_share", "share of them corrected, outputs "
                                                      "bit-exact"),
    ("reliability__double_bit_faults_detected_share", "double-bit faults detected, the run "
                                                      "stopped (share)"),
]


def _shown(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _measured(entries: list[dict]) -> str:
    """'by `cmd` on date' for one source, or the commands and the date range."""
    if not entries:
        return "provenance not recorded"
    commands = sorted({e["command"] for e in entries})
    dates = sorted({e["date"] for e in entries})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    return f"measured by {', '.join(f'`{c}`' for c in commands)} on {when}"


def _targets() -> dict:
    targets: dict = {}
    for name in MODULES:
        targets.update(importlib.import_module(f"bench.{name}").TARGETS)
    return targets


def _load(name: str) -> tuple[dict, dict] | None:
    path = BUILD / f"{name}.json"
    try:
        return json.loads(path.read_text()), provenance.load(path)
    except (OSError, ValueError):
        return None


#: A generated section: its name, then its text.
_SECTION = re.compile(r"<!-- results:(\w+) -->\n(.*?)<!-- /results:\1 -->", re.S)
#: A row of the benchmark table: the metric, its value, target and when measured.
BENCH_ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \| (.*?) \| (.*?) \|$", re.M)
#: A row of the synthesis table: the design, its abc marker (when mapped with abc), its
#: figures.
SYNTH_ROW = re.compile(r"^\| `([^`]+)`( \\\*)? \| .*\|$", re.M)


def table_rows(text: str, name: str, row: re.Pattern) -> dict[str, re.Match]:
    """The rows of generated table ``name`` in ``text`` that ``row`` matches, by its
    first group (the metric, or the design; none if the table is absent)."""
    section = next((m.group(2) for m in _SECTION.finditer(text) if m.group(1) == name), "")
    return {m.group(1): m for m in row.finditer(section)}


def bench_table(metrics: dict, origin: dict, targets: dict,
                kept: dict[str, re.Match] | None = None) -> str:
    """Every benchmark figure: value, target and whether it is met, when measured; a
    figure the report lacks keeps its row from ``kept`` (:func:`table_rows` of
    ``BENCH_ROW``)."""
    kept = kept or {}
    lines = ["| metric | value | target | measured |", "|---|---:|---|---|"]
    for key in sorted(set(metrics) | set(kept)):
        if key not in metrics:
            lines.append(kept[key].group(0))
            continue
        value, rule = metrics[key], targets.get(key)
        target = ""
        if rule and value is not None:
            op, bound = rule
            met = value >= bound if op == ">=" else value <= bound
            target = f"{op} {bound:g} {'met' if met else '**missed**'}"
        entry = origin.get(key)
        when = f"{entry['date']}, `{entry['command']}`" if entry else "not recorded"
        lines.append(f"| `{key}` | {_shown(value)} | {target} | {when} |")
    return "\n".join(lines)


def headline_table(metrics: dict, origin: dict,
                   kept: dict[str, re.Match] | None = None) -> str:
    """The README's headline figures; one the report lacks from its ``kept`` row of the
    benchmark table (:func:`table_rows`), with the date and command there."""
    lines = ["| figure | value |", "|---|---:|"]
    used = []
    for key, what in HEADLINES:
        if key in metrics:
            lines.append(f"| {what} (`{key}`) | {_shown(metrics[key])} |")
            if key in origin:
                used.append(origin[key])
        elif key in (kept or {}):
            _, value, _, when = kept[key].groups()
            lines.append(f"| {what} (`{key}`) | {value} |")
            date, _, command = when.partition(", ")
            if command:
                used.append({"date": date, "command": command.strip("`")})
    return "\n".join(lines) + f"\n\n({_measured(used)}; every figure: docs/results.md.)"


def mutate_table(report: dict, origin: dict) -> str:
    entries = [origin[f"blocks.{name}"] for name in report["blocks"]
               if f"blocks.{name}" in origin]
    lines = [f"{_measured(entries)}: **{report['killed']} of "
             f"{report['mutants']} = {report['mutation__killed_share']:.3f}** "
             f"(`mutation__killed_share`, goal ≥ 0.95; Yosys seed {report['seed']}).", "",
             "| block | mutants scored | killed | share | no-op (not scored) |",
             "|---|---:|---:|---:|---:|"]
    for name, block in report["blocks"].items():
        lines.append(f"| {name} | {block['mutants']} | {block['killed']} | "
                     f"{block['killed_share']:.3f} | {len(block.get('no_op', []))} |")
    survivors = [f"{name} mutant {s['mutant']}: {s['mode']} on `{s['cell']}` "
                 f"port {s['port']} ({s['source']})"
                 for name, block in report["blocks"].items() for s in block["survivors"]]
    if survivors:
        lines += ["", "Survivors of this draw:", ""] + [f"- {s}" for s in survivors]
    no_ops = [f"{name} mutant {s['mutant']}: {s['mode']} on `{s['cell']}` ({s['source']}): "
              f"{s['no_op']}"
              for name, block in report["blocks"].items() for s in block.get("no_op", [])]
    if no_ops:
        lines += ["", "No-op mutants of this draw (not run):", ""] + [f"- {s}" for s in no_ops]
    return "\n".join(lines)


#: The synthesis table's columns: (metric of build/synth.json, heading).
SYNTH_COLUMNS = [("generic_cells", "generic cells"), ("ecp5_lut4", "LUT4"),
                 ("ecp5_ccu2c", "CCU2C"), ("ecp5_ff", "FF"), ("ecp5_mult18", "MULT18X18D"),
                 ("ecp5_ebr", "EBR"), ("ecp5_dpr16x4", "DPR16X4")]


def _fmax(design: str, metrics: dict) -> str:
    """Fmax against the target it was placed at, or why there is none."""
    def get(metric):
        return metrics.get(metric_name(design, metric))
    fmax, target = get("ecp5_fmax_mhz"), get("ecp5_fmax_target_mhz")
    if fmax is not None:
        verdict = "met" if fmax >= target else "**missed**"
        return f"{fmax:.1f} (target {target:g}, {verdict})"
    if get("ecp5_fits") == 0:
        return "does not fit the 85F"
    target = PNR_TARGET_MHZ.get(design, DEFAULT_FREQ_MHZ)
    return f"not placed and routed (target {target:g})"


def critical_path(text: str) -> str:
    """The delay, its routing share and the first and last source lines of a
    ``critical_path.txt`` (``synth.flow.format_critical_path``); "" if it has none."""
    head = re.search(r": ([\d.]+) ns \(logic .*routing ([\d.]+) ns\)", text)
    if head is None:
        return ""
    delay, routing = float(head.group(1)), float(head.group(2))
    sources = [re.sub(r"^.*?/(?=(rtl|sim|synth)/)|^.*/site-packages/", "", line.strip())
               for line in text.split("through (source lines, in path order):")[-1]
               .splitlines()[1:] if line.strip()] if "through" in text else []
    where = f"`{sources[0]}` → `{sources[-1]}`, " if sources else ""
    return f"{where}{delay:.1f} ns ({routing / delay:.0%} routing)"


def synth_table(metrics: dict, origin: dict, paths: Path = BUILD / "synth",
                kept: dict[str, re.Match] | None = None) -> str:
    """One row per registered design with figures: Yosys's cells, the ECP5 mapping,
    nextpnr's Fmax and critical path (``paths``/<design>/critical_path.txt), with the
    command and date that measured the row; a design the report lacks keeps its row
    from ``kept`` (:func:`table_rows` of ``SYNTH_ROW``)."""
    kept = kept or {}
    heads = " | ".join(h for _, h in SYNTH_COLUMNS)
    lines = [f"| design | {heads} | Fmax (MHz) | critical path | measured |",
             "|---|" + "---:|" * len(SYNTH_COLUMNS) + "---|---|---|"]
    mapped_with_abc = False
    for design in DESIGNS:
        values = [metrics.get(metric_name(design, m)) for m, _ in SYNTH_COLUMNS]
        if all(v is None for v in values):
            if design in kept:
                lines.append(kept[design].group(0))
                mapped_with_abc |= kept[design].group(2) is not None
            continue
        name = f"`{design}`"
        if metrics.get(metric_name(design, "ecp5_abc9")) == 0:
            name += " \\*"
            mapped_with_abc = True
        entry = origin.get(metric_name(design, "ecp5_lut4")) \
            or origin.get(metric_name(design, "generic_cells"))
        when = f"{entry['date']}, `{entry['command']}`" if entry else "not recorded"
        cells = " | ".join(_shown(v) for v in values)
        path = ""
        if metrics.get(metric_name(design, "ecp5_fmax_mhz")) is not None:
            try:
                path = critical_path((paths / design / "critical_path.txt").read_text())
            except OSError:
                path = "not kept"
        lines.append(f"| {name} | {cells} | {_fmax(design, metrics)} | {path} | {when} |")
    if mapped_with_abc:
        lines += ["", "\\* mapped with Yosys's `abc` instead of `abc9`, which failed on this "
                  "netlist: its LUT4 count is not comparable with the others'."]
    return "\n".join(lines)


def render() -> dict[str, str | None]:
    """Each generated section's text (None: its report is missing)."""
    sections: dict[str, str | None] = {}
    bench = _load("bench")
    try:
        text = (ROOT / "docs" / "results.md").read_text()
    except OSError:
        text = ""
    kept = table_rows(text, "bench", BENCH_ROW)
    sections["bench"] = bench_table(*bench, _targets(), kept) if bench else None
    sections["headline"] = headline_table(*bench, kept) if bench else None
    mutate = _load("mutate")
    sections["mutate"] = mutate_table(*mutate) if mutate else None
    synth = _load("synth")
    sections["synth"] = (synth_table(*synth, kept=table_rows(text, "synth", SYNTH_ROW))
                         if synth else None)
    return sections


def fill(text: str, sections: dict[str, str | None]) -> tuple[str, list[str]]:
    """``text`` with every marked section that has a rendering replaced; the names done."""
    done = []

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if sections.get(name) is None:
            return match.group(0)
        done.append(name)
        return f"<!-- results:{name} -->\n{sections[name]}\n<!-- /results:{name} -->"

    return _SECTION.sub(replace, text), done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verif.results", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path,
                        default=[ROOT / "README.md", ROOT / "docs" / "results.md"],
                        help="documents to update (default README.md docs/results.md)")
    args = parser.parse_args(argv)
    sections = render()
    for name, text in sections.items():
        if text is None:
            print(f"[results] {name}: build/{'bench' if name == 'headline' else name}.json "
                  "is missing; its table is kept as it is")
    for path in args.files:
        try:
            before = path.read_text()
        except OSError as error:
            print(f"[results] cannot read {path}: {error.strerror}", file=sys.stderr)
            return 2
        after, done = fill(before, sections)
        if after != before:
            path.write_text(after)
        print(f"[results] {path}: {', '.join(done) or 'no generated table'}"
              f"{' (updated)' if after != before else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
