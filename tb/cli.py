"""The ``serrano`` command line.

    serrano sim [options]    simulate the default design on the default workload, report

Until the tile and the chip exist, the default design is the tensor core and the default
workload is one GEMM; ``serrano sim --help`` lists the options.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rtl.tensor_core import MAX_N, MIN_N
from tb.runner import SIMULATORS, SimulationFailed


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"a probability in [0, 1) is needed, not {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a positive integer is needed, not {text}")
    return value


def _array_size(text: str) -> int:
    value = int(text)
    if not MIN_N <= value <= MAX_N:
        raise argparse.ArgumentTypeError(f"the array size must be {MIN_N}..{MAX_N}, not {text}")
    return value


def _area_line(n: int) -> str:
    from synth import load_area

    area = load_area(f"tensor_core_n{n}")
    if not area:
        return f"not measured (run `make synth ARGS='--only tensor_core_n{n}'`)"
    parts = [
        f"{area.get('ecp5_lut4', '?')} LUT4",
        f"{area.get('ecp5_ff', '?')} FF",
        f"{area.get('ecp5_mult18', '?')} MULT18X18D",
        f"{area.get('ecp5_ebr', '?')} EBR",
    ]
    fmax = area.get("ecp5_fmax_mhz")
    parts.append(f"Fmax {fmax:.1f} MHz" if fmax else "Fmax not measured")
    return "ECP5-85F: " + ", ".join(parts) + f"; {area.get('generic_cells', '?')} generic cells"


def sim(args: argparse.Namespace) -> int:
    from tb.gemm_run import simulate_gemm

    n, m, k, p = args.array, args.m, args.k, args.p
    print(f"serrano sim: tensor core N={n} ({n * n} MAC/cycle), GEMM {m} x {k} x {p} "
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
            ("area", _area_line(n)),
        ]
        if args.waves:
            rows.append(("waves", result.get("waves_file") or "none written"))
        print()
        for label, text in rows:
            print(f"{label:<12} {text}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"passed": passed, **result}, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="serrano", description="serrano: cycle-accurate RTL model of an inference accelerator"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sim_parser = commands.add_parser(
        "sim", help="simulate the tensor core on a GEMM and report",
        description="Simulate a GEMM on the tensor core (cocotb + Verilator by default), "
                    "check every output against the golden model and print cycles, "
                    "utilisation, simulation speed and area (when `make synth` has run).",
    )
    sim_parser.add_argument("--array", type=_array_size, default=8, metavar="N",
                            help=f"tensor core size N ({MIN_N}..{MAX_N}, default 8)")
    sim_parser.add_argument("--m", type=_positive, default=64, help="rows of A (default 64)")
    sim_parser.add_argument("--k", type=_positive, default=64,
                            help="inner dimension (default 64)")
    sim_parser.add_argument("--p", type=_positive, default=64,
                            help="columns of B (default 64)")
    sim_parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    sim_parser.add_argument("--idle", type=_probability, default=0.0,
                            help="probability that an operand beat is withheld each cycle")
    sim_parser.add_argument("--stall", type=_probability, default=0.0,
                            help="probability that the result stream is not ready each cycle")
    sim_parser.add_argument("--sim", choices=SIMULATORS, default="verilator",
                            help="simulator (default verilator)")
    sim_parser.add_argument("--waves", action="store_true",
                            help="record FST waves (in the run directory under sim_build/)")
    sim_parser.add_argument("--json", type=Path, help="also write the figures to this file")
    sim_parser.set_defaults(handler=sim)

    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
