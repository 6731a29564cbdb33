"""sim.objcache: run-time library objects compiled once, every other compile untouched."""

from __future__ import annotations

import sys

from sim import objcache

# A stand-in compiler: appends its arguments to a log and writes them into the output.
COMPILER = """import sys
from pathlib import Path
args = sys.argv[1:]
with open(Path(sys.argv[0]).with_name("calls.log"), "a") as log:
    log.write(" ".join(args) + "\\n")
Path(args[args.index("-o") + 1]).write_text(" ".join(args))
"""


def test_runtime_sources_compile_once_per_command_line(tmp_path, monkeypatch):
    root = tmp_path / "verilator"
    (root / "include").mkdir(parents=True)
    runtime = root / "include" / "verilated.cpp"
    runtime.write_text("// run-time library")
    model = tmp_path / "Vtop.cpp"
    model.write_text("// the model")
    compiler = tmp_path / "cc.py"
    compiler.write_text(COMPILER)
    monkeypatch.setenv("VERILATOR_ROOT", str(root))
    monkeypatch.setattr(objcache, "CACHE", tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    cc = [sys.executable, str(compiler)]

    def calls():
        log = tmp_path / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    for build in ("a", "b"):  # two builds, same flags: the second one is a copy
        (tmp_path / build).mkdir()
        assert objcache.main([*cc, "-O2", "-c", "-o", f"{build}/verilated.o", str(runtime)]) == 0
    assert len(calls()) == 1
    assert (tmp_path / "b" / "verilated.o").read_text() == (
        tmp_path / "a" / "verilated.o").read_text()
    objcache.main([*cc, "-O0", "-c", "-o", "b/verilated.o", str(runtime)])  # other flags
    assert len(calls()) == 2
    for _ in range(2):  # the model's own files always compile
        objcache.main([*cc, "-O2", "-c", "-o", "Vtop.o", str(model)])
    assert len(calls()) == 4
    runtime.write_text("// a new version")  # the installation changed: compiled again
    objcache.main([*cc, "-O2", "-c", "-o", "a/verilated.o", str(runtime)])
    assert len(calls()) == 5


def test_a_failing_compile_is_not_cached(tmp_path, monkeypatch):
    (tmp_path / "include").mkdir()
    source = tmp_path / "include" / "verilated.cpp"
    source.write_text("")
    monkeypatch.setenv("VERILATOR_ROOT", str(tmp_path))
    monkeypatch.setattr(objcache, "CACHE", tmp_path / "cache")
    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    assert objcache.main([*failing, "-c", "-o", str(tmp_path / "x.o"), str(source)]) == 3
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())
