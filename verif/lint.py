"""``python -m verif.lint``: Verilator ``--lint-only -Wall`` on the Verilog of every design.

The designs are those ``make synth`` measures (:data:`synth.designs.DESIGNS`) plus the
simulation harness around the tensor core and the board's UART bridge around it. Waivers,
each with its reason, are in ``sim/verilator.vlt``; anything else Verilator reports fails
the lint.
"""

from __future__ import annotations

import subprocess
import sys

from amaranth.back import verilog

from sim.runner import SIM_BUILD, WAIVERS, toolchain_env
from synth.designs import DESIGNS, build_design


def _tops():
    for name in DESIGNS:
        yield name, build_design(name)
    from rtl.tensor_core import TensorCore
    from sim.harness import StreamHarness

    yield "harness_tensor_core_n4", StreamHarness(TensorCore(4), {"a": 64, "b": 64, "c": 64})
    from fpga.bridge import UartBridge

    yield "uart_bridge_tensor_core_n4", UartBridge(TensorCore(4), 25)


def main() -> int:
    toolchain_env("verilator")
    directory = SIM_BUILD / "lint"
    directory.mkdir(parents=True, exist_ok=True)
    failed = []
    for name, design in _tops():
        source = directory / f"{name}.v"
        source.write_text(verilog.convert(design, name=name, emit_src=False))
        result = subprocess.run(
            ["verilator", "--lint-only", "-Wall", "--top-module", name, str(WAIVERS), str(source)],
            capture_output=True, text=True,
        )
        status = "clean" if result.returncode == 0 else "FAILED"
        print(f"[lint] {name}: {status}")
        if result.returncode:
            failed.append(name)
            print(result.stderr[-4000:])
    if failed:
        print(f"[lint] {len(failed)} design(s) failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
