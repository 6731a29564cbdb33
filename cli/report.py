"""The command line's report: the rows a run prints (area, clock, phase shares,
accuracy, energy, dump), progress lines while a simulation runs, the JSON file."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

from sim.runner import SimulationFailed
from synth.designs import TILE_DESIGNS


def print_rows(rows: list[tuple[str, str]]) -> None:
    """A report: one labelled row per line, after a blank line."""
    print()
    for label, text in rows:
        print(f"{label:<12} {text}")


def profile_rows(phases: dict[str, dict], period: int) -> list[tuple[str, str]]:
    """``--profile``'s rows (:func:`sim.profile.profile`): per phase the tile-cycles by
    what held the sequencers, and the instruction that held a tile longest."""
    rows = [("profile", f"each running tile's pc every {period} cycles; tile-cycles by what "
                        "held its sequencer (the JSON lists the longest-held instructions)")]
    for phase, p in phases.items():
        total = max(p["tile_cycles"], 1)
        shares = ", ".join(f"{name} {cycles / total:.1%}"
                           for name, cycles in list(p["holders"].items())[:5])
        rows.append(("", f"{phase}: {p['tile_cycles']:,} tile-cycles: {shares}"))
        if p["hot"]:
            h = p["hot"][0]
            rows.append(("", f"  longest: round {h['round']} tile {h['tile']} pc {h['pc']}, "
                             f"{h['cycles']:,} cycles: {h['instruction']}"))
    return rows


def area_line(design: str, per: str = "") -> str:
    """The area ``make synth`` measured for ``design`` (``per`` after it: what it is
    the area of), or how to measure it."""
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
    return ("ECP5-85F: " + ", ".join(parts)
            + f"; {area.get('generic_cells', '?')} generic cells{per}")


def shares(counters: dict) -> str:
    total = counters["cycles"] or 1
    names = (("gemm", "GEMM"), ("vec", "vector"), ("gemm_vec", "both"), ("dma", "DMA"),
             ("stall", "sequencer/stall"))
    text = ", ".join(f"{label} {counters[key] / total:.0%}" for key, label in names)
    return text + (f" (waiting on the network or memory {counters['wait'] / total:.0%})"
                   if "wait" in counters else "")


def fmax_line(n: int) -> tuple[float | None, str]:
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


def with_progress(simulate, prefix: str = "") -> dict:
    """``simulate(progress_file)`` in a thread, echoing the lines the simulation appends
    to the file (one per round) as they come; returns {"result": ...} or {"failure": ...}."""
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


def accuracy_rows(phases: dict[str, dict]) -> list[tuple[str, str]]:
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


def _joules(pj: float) -> str:
    """``pj`` picojoules in the unit that reads best."""
    for unit, scale in (("mJ", 1e9), ("µJ", 1e6), ("nJ", 1e3)):
        if pj >= scale:
            return f"{pj / scale:,.2f} {unit}"
    return f"{pj:,.1f} pJ"


def access_energy_line(metrics: dict) -> str:
    """The report's access-energy row (sim.chip_run.round_energy): per phase, the energy
    and its split by class (SRAM's accumulator part too); then the host port's
    transfers' energy, outside the rounds'."""
    from spec.energy import CLASSES

    parts = []
    for phase, what in (("prefill", "prefill"), ("decode", "decode per step")):
        if f"chip__{phase}__energy_pj" not in metrics:
            continue
        total = metrics[f"chip__{phase}__energy_pj"]
        shares = {name: metrics[f"chip__{phase}__energy_{name}_pj"] / max(total, 1)
                  for name in CLASSES}
        accumulator = metrics.get(f"chip__{phase}__energy_accumulator_pj")
        split = []
        for name, share in shares.items():
            split.append(f"{'SRAM' if name == 'sram' else name} {share:.0%}")
            if name == "sram" and accumulator is not None:
                split[-1] += f" (accumulator {accumulator / max(total, 1):.0%})"
        parts.append(f"{what} {_joules(total)} "
                     f"({_joules(metrics[f'chip__{phase}__energy_per_token_pj'])} per token; "
                     f"{', '.join(split)})")
    host = [f"{what} {_joules(metrics[f'chip__{phase}__energy_host_pj'])} ("
            f"{_joules(metrics[f'chip__{phase}__energy_per_token_with_host_pj'])} per token "
            f"with them)" for phase, what in (("prefill", "prefill"), ("decode", "per step"))
            if f"chip__{phase}__energy_host_pj" in metrics]
    if host:
        parts.append("the host port's transfers, outside the rounds as their cycles are, "
                     "at a PCIe link's energy per byte: " + ", ".join(host))
    return ("access model, counts x energies per access at 45 nm (docs/energy.md): "
            + "; ".join(parts))


def energy_line(energy, tokens: int) -> str:
    """The report's toggle-proxy row: cell-toggles per token (sim.energy), or how to get
    them."""
    if energy is None:
        return ("cell-toggle proxy not measured: add --energy (a SAIF-traced build, a "
                "one-off Yosys synthesis of the chip, a run about 40x slower; docs/energy.md)")
    return (f"{energy.total / tokens:,.0f} cell-toggles per token ({tokens} tokens, the "
            f"whole run with its host transfers; a relative unit: compare design points "
            f"only, docs/energy.md); {energy.shares()}")


def fault_rows(faults: dict) -> list[tuple[str, str]]:
    """The report's fault-injection rows (sim.faults): what was injected, what the chip
    corrected and detected, per tile."""
    plan = faults["plan"]
    single, double = faults["single_injected"], faults["double_injected"]
    outcome = (f"{faults['single_survived']:,} survived (their rounds' outputs bit-exact)"
               if not faults["stopped"] else "the run stopped at the first double")
    rows = [("faults", f"{single:,} single-bit and {double:,} double-bit faults injected "
                       f"(rates {plan['single']:g} and {plan['double']:g} per word read, "
                       f"seed {plan['seed']}), each in a word read afterwards; {outcome}; "
                       f"{faults['double_detected']:,} doubles detected")]
    for tile, t in faults["tiles"].items():
        rows.append(("", f"tile {tile}: {t['single']:,} single ({t['corrected']:,} "
                         f"corrected), {t['double']:,} double ({t['detected']:,} detected); "
                         f"the scratchpad's counters: {t['corrected_reads']:,} corrected and "
                         f"{t['uncorrectable_reads']:,} uncorrectable reads"))
    rows.append(("", "the log (round, tile, address, bits, cycle) is in --json's faults"))
    return rows


def dump_line(root: Path, options: dict) -> str:
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
