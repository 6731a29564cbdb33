"""make regress: seeds, deterministic shards, JUnit results, reproduce commands, coverage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim import coverage
from verif import regress

ROOT = Path(__file__).resolve().parent.parent
MODULE = "tests/test_sequencer_unit.py"


def collect(*options: str) -> list[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *options, MODULE],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_seeds_parametrize_only_random_tests_and_shards_split_them():
    plain = collect()
    seeded = collect("--seeds", "3", "--seed-base", "5")
    random_test = f"{MODULE}::test_random_programs_respect_every_wait"
    assert random_test in plain  # make test: once, seed 0, the id unchanged
    runs = [f"{random_test}[s{s}]" for s in (5, 6, 7)]
    assert [n for n in seeded if n.startswith(random_test)] == runs
    random_runs = [n for n in seeded if n not in plain]  # every random test, thrice
    random_tests = {n.rsplit("[s", 1)[0] for n in random_runs}
    assert len(random_runs) == 3 * len(random_tests)
    assert len(seeded) == len(plain) + 2 * len(random_tests)
    # -m seeded keeps the random tests; two shards split them, disjoint and complete.
    shards = [collect("--seeds", "3", "--seed-base", "5", "-m", "seeded", "--shard", f"{i}/2")
              for i in (1, 2)]
    assert sorted(shards[0] + shards[1]) == sorted(random_runs)
    assert abs(len(shards[0]) - len(shards[1])) <= 1


def test_a_bad_shard_is_refused():
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "--shard", "4/3", MODULE], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "need 1 <= i <= k" in done.stderr
    with pytest.raises(SystemExit):
        regress.main(["--shard", "0/2", "--merge"])


def test_junit_rows_and_the_reproduce_command(tmp_path):
    (tmp_path / "junit.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_scratchpad" name="test_random_traffic[quad-s7]" '
        'time="2.5"><failure message="boom"/></testcase>'
        '<testcase classname="tests.test_scratchpad" name="test_random_traffic[quad-s8]" '
        'time="2.0"/>'
        '<testcase classname="tests.test_isa" name="test_round_trip" time="0.1"/>'
        '</testsuite></testsuites>')
    rows = regress.results(tmp_path)
    assert [(r["test"], r["seed"], r["outcome"]) for r in rows] == [
        ("tests/test_scratchpad.py::test_random_traffic[quad]", 7, "failed"),
        ("tests/test_scratchpad.py::test_random_traffic[quad]", 8, "passed"),
        ("tests/test_isa.py::test_round_trip", None, "passed")]
    assert regress.reproduce(rows[0]) == (
        "WAVES=1 .venv/bin/python -m pytest -p no:cacheprovider --seeds 1 --seed-base 7 "
        "'tests/test_scratchpad.py::test_random_traffic[quad-s7]'")


def test_a_regression_run_writes_junit_coverage_and_the_summary(tmp_path):
    out, report = tmp_path / "regress", tmp_path / "regress.json"
    code = regress.main(["--seeds", "2", "--seed-base", "3", "--jobs", "1", "--random-only",
                         "-k", "test_random_programs_respect_every_wait", "--out", str(out),
                         "--report", str(report)])
    assert code == 0
    assert (out / "shard-1-of-1" / "junit.xml").exists()
    summary = json.loads(report.read_text())
    assert summary["regress__pass_rate"] == 1.0 and summary["runs"] == 2
    assert summary["seeds"] == [3, 4]
    hazards = summary["coverage"]["points"]["sequencer.hazard"]
    assert set(hazards) == set(coverage.HAZARDS) and sum(hazards.values()) > 0
    assert 0 < summary["coverage__bins_hit_share"] < 1  # the router's bins were not run
    # --merge alone summarises what is there again.
    assert regress.main(["--merge", "--out", str(out), "--report", str(report)]) == 0


def test_amaranth_simulations_record_waves_on_request(monkeypatch, tmp_path):
    from amaranth.hdl import Module, Signal
    from amaranth.sim import Simulator

    from sim import runner

    m = Module()
    count = Signal(4)
    m.d.sync += count.eq(count + 1)
    sim = Simulator(m)
    sim.add_clock(1e-8)

    async def bench(ctx):
        await ctx.tick().repeat(5)

    sim.add_testbench(bench)
    monkeypatch.setenv("WAVES", "1")
    monkeypatch.setattr(runner, "SIM_BUILD", tmp_path)
    runner.run_amaranth(sim)
    (vcd,) = (tmp_path / "waves").glob("*.vcd")
    assert "count" in vcd.read_text()
