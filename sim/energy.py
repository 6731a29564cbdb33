"""The energy proxy: switching activity from a simulation, weighted by synthesised cells.

For every module instance ``i`` under the design (the cocotb harness excluded)::

    E_i = toggles_i / bits_i x cells_i

``toggles_i`` is the number of 0<->1 transitions of the instance's own net bits over the
run (Verilator's SAIF trace, ``sim.runner.build(..., activity=True)``), ``bits_i`` the
number of those bits, ``cells_i`` the generic cells Yosys synthesises for the
instance's module (``synth.flow.synth_generic`` with ABC's script ``FAST_ABC``, memories
kept as memories). Each bit's
average toggle count stands for the switching of the module's cells; ``E = sum(E_i)``
in cell-toggles, a relative unit: only ratios between runs or design points mean
anything (docs/energy.md says what it leaves out).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from sim.runner import ROOT, TOPLEVEL

#: Synthesised cell counts per design, keyed by the hash of its Verilog.
CELLS_DIR = ROOT / "build" / "energy"

_NET_LINE = re.compile(r"^\((\S+) .*\(TC (\d+)\)\)$")
_CLOCK = re.compile(r"(\w+_)?clk")
_INSTANCE = re.compile(r"^\s+(\\\S+|\w+)\s+(\\\S+|\w+)\s*\($", re.M)
_MODULE = re.compile(r"^module (\\\S+|\w+)\s*\(", re.M)


def parse_saif(path: Path) -> dict[str, tuple[int, int]]:
    """Instance path (``a/b/c``) -> (toggles, bits) of the instance's own nets, from a
    SAIF file as Verilator writes it (one ``(INSTANCE``, ``(NET``, net bit or ``)``
    per line). Clock nets (``clk``, ``<domain>_clk``) are left out: they toggle twice a
    cycle whatever the data, and where the simulation gates a block's clock
    (``rtl.sim_gate``) the synthesised design does not."""
    totals: dict[str, list[int]] = {}
    stack: list[str] = []
    in_net = False
    with open(path) as saif:
        for raw in saif:
            line = raw.strip()
            if line.startswith("(INSTANCE "):
                stack.append(line[len("(INSTANCE "):].strip())
                in_net = False
            elif line == "(NET":
                in_net = True
            elif line == ")":
                if in_net:
                    in_net = False
                elif stack:
                    stack.pop()
            elif in_net:
                match = _NET_LINE.match(line)
                if match is None:
                    raise ValueError(f"{path}: unexpected SAIF net line {line!r}")
                if _CLOCK.fullmatch(match.group(1)):
                    continue
                entry = totals.setdefault("/".join(stack), [0, 0])
                entry[0] += int(match.group(2))
                entry[1] += 1
    if not totals:
        raise ValueError(f"{path}: no nets in the SAIF file")
    return {name: (toggles, bits) for name, (toggles, bits) in totals.items()}


def instance_modules(verilog: str) -> dict[str, dict[str, str]]:
    """Module -> {instance name: module instantiated} from Amaranth's Verilog."""
    names = [m.group(1).lstrip("\\") for m in _MODULE.finditer(verilog)]
    known = set(names)
    starts = [m.start() for m in _MODULE.finditer(verilog)] + [len(verilog)]
    children: dict[str, dict[str, str]] = {}
    for name, start, end in zip(names, starts, starts[1:], strict=False):
        body = verilog[start:end]
        children[name] = {inst.lstrip("\\"): mod.lstrip("\\")
                          for mod, inst in _INSTANCE.findall(body) if mod.lstrip("\\") in known}
    return children


def without_zero_init(rtlil: str) -> str:
    """``rtlil`` without its all-zero memory initialisers (``$meminit_v2`` cells whose
    data is all 0): they change no cell count, and Yosys carries each as one constant of
    the memory's every bit through its passes (a 2^16-word store of 64 bits took 18 s
    to synthesise with its zeros, 3 s without, the same 1 986 cells)."""
    lines, out, i = rtlil.splitlines(keepends=True), [], 0
    while i < len(lines):
        if lines[i].strip().startswith("cell $meminit_v2 "):
            end = i
            while lines[end].strip() != "end":
                end += 1
            data = next((line for line in lines[i:end] if "connect \\DATA " in line), "")
            value = data.split("'", 1)[1].strip() if "'" in data else "1"
            if set(value) <= {"0"}:
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return "".join(out)


def module_cells(rtlil_file: Path, *, say=print) -> dict[str, int]:
    """Generic cells per module of a design (its own cells, not its children's), from
    the RTLIL an activity build writes beside its Verilog (Yosys reads that far faster
    than Verilog with memory initialisers; all-zero initialisers are dropped,
    :func:`without_zero_init`); synthesised once per distinct design and kept under
    ``build/energy/``."""
    from synth.flow import FAST_ABC, synth_generic

    text = without_zero_init(rtlil_file.read_text())
    digest = hashlib.sha256((FAST_ABC + text).encode()).hexdigest()[:16]
    workdir = CELLS_DIR / digest
    cached = workdir / "cells.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "design.il").write_text(text)
    say(f"[energy] synthesising {rtlil_file} to generic cells (once per design) ...")
    result = synth_generic(workdir / "design.il", TOPLEVEL, workdir, transistors=False,
                           abc_script=FAST_ABC)
    cells = result["modules"]
    cached.write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")
    return cells


#: Readable names of the chip's blocks (first path element under a tile, or the chip's).
BLOCK_NAMES = {"gemm": "GEMM engine + tensor core", "vec": "vector engine + unit",
               "scratchpad": "scratchpad", "sequencer": "sequencer", "dma": "DMA engine",
               "acc": "accumulator memory", "router": "routers", "ni": "network interfaces",
               "host_order": "host port", "kv_order": "host port"}


def block_of(relative: list[str]) -> str:
    """The block an instance path below the design's top belongs to, for the breakdown."""
    if not relative:
        return "top level"
    head = re.sub(r"(_\d+)+$", "", relative[0])
    if head == "tile":
        head = relative[1] if len(relative) > 1 else "tile glue"
    elif head == "mesh":
        head = "router" if len(relative) > 1 else "mesh glue"
    return BLOCK_NAMES.get(head, head)


@dataclass
class Energy:
    """The proxy of one run: total cell-toggles and their split by block."""

    total: float
    blocks: dict[str, float] = field(default_factory=dict)

    def shares(self, top: int = 4) -> str:
        ranked = sorted(self.blocks.items(), key=lambda item: -item[1])[:top]
        return ", ".join(f"{name} {value / self.total:.0%}" for name, value in ranked)


def energy(saif_file: Path, build_dir: Path, *, design: str = "dut",
           say=print) -> Energy:
    """The energy proxy of a run on an activity build (``build_dir``: its ``top.v`` and
    ``top.il``): SAIF toggles of every instance of ``design`` (the harness's instance
    name for the design under test) weighted by its module's cells."""
    verilog_file = build_dir / "top.v"
    activity = parse_saif(saif_file)
    children = instance_modules(verilog_file.read_text())
    cells = module_cells(build_dir / "top.il", say=say)
    blocks: dict[str, float] = {}
    for path, (toggles, bits) in activity.items():
        parts = path.split("/")
        if TOPLEVEL not in parts:
            continue
        parts = parts[parts.index(TOPLEVEL):]
        module = TOPLEVEL
        for name in parts[1:]:
            module = children.get(module, {}).get(name)
            if module is None:
                raise ValueError(f"{saif_file}: instance {path} is not in {verilog_file}")
        if len(parts) < 2 or parts[1] != design:
            continue  # the harness
        if module not in cells:
            raise ValueError(f"module {module} of instance {path} was not synthesised")
        value = toggles / bits * cells[module]
        block = block_of(parts[2:])
        blocks[block] = blocks.get(block, 0.0) + value
    total = sum(blocks.values())
    if total <= 0:
        raise ValueError(f"{saif_file}: no switching activity under instance {design!r}")
    return Energy(total, blocks)
