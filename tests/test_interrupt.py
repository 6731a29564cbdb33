"""SIGINT and SIGTERM stop a `serrano` command and everything it started: mid-build and
mid-simulation, no child survives, the exit status says which signal, and the next run
is correct (a stopped build left no stamp)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sim.processes import alive, descendants

SERRANO = Path(sys.executable).with_name("serrano")


def _start(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([str(SERRANO), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(predicate, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _names(pids: list[int]) -> list[str]:
    names = []
    for pid in pids:
        with contextlib.suppress(OSError):  # gone already
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
    return names


def _stop(process: subprocess.Popen, signum: int) -> tuple[int, str, list[int]]:
    """Signal the command alone (as a scheduler does, not its process group); its exit
    status, its stderr and the processes it had started."""
    started = descendants(process.pid)
    os.kill(process.pid, signum)
    _, err = process.communicate(timeout=60)
    return process.returncode, err, started


@pytest.mark.skipif(not SERRANO.exists(), reason="the serrano command is not installed")
def test_a_stopped_build_and_a_stopped_simulation_leave_nothing_behind(tmp_path):
    env = {**os.environ, "SERRANO_SIM_BUILD": str(tmp_path / "sim_build")}
    small = ["gemm", "--array", "4", "--m", "64", "--k", "64", "--p", "64"]
    # Mid-build: the compiler of the simulation model is running.
    build = _start(small, env)
    _wait_for(lambda: any(n in ("cc1plus", "g++", "c++") for n in
                          _names(descendants(build.pid))), "the model's compiler")
    code, err, started = _stop(build, signal.SIGINT)
    assert code == 130, err
    assert err.strip().splitlines()[-1].startswith("serrano: stopped by SIGINT"), err
    assert "Traceback" not in err
    assert started and not any(alive(pid) for pid in started)
    # The next run builds again where the first stopped and is correct.
    again = subprocess.run([str(SERRANO), *small], capture_output=True, text=True, env=env,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert "building" in again.stderr and "utilisation" in again.stdout
    # Mid-simulation: the same model, its streams nearly always idle (seconds of run).
    long = _start([*small, "--idle", "0.996", "--stall", "0.996"], env)
    _wait_for(lambda: "top" in _names(descendants(long.pid)), "the simulation", 300)
    code, err, started = _stop(long, signal.SIGTERM)
    assert code == 143, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    assert not any(alive(pid) for pid in started)
    # The model is intact: the next run takes it as built and is correct.
    again = subprocess.run([str(SERRANO), *small], capture_output=True, text=True, env=env,
                           timeout=600)
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr and "utilisation" in again.stdout
