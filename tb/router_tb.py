"""cocotb side of ``make mutate``'s router check: the router's unit tests
(``tests/test_router_unit.py``) on a Verilator build of :func:`sim.router_bench.bench_router`,
one after another in one simulation (each :func:`sim.router_bench.run` resets the router).

Parameters (:func:`sim.runner.parameters`): ``tests``, the names of the test functions to
run, and ``seeds``: those that take a seed run once per seed (default [0], the suite's).
"""

from __future__ import annotations

import importlib.util
import inspect

import cocotb
from cocotb.clock import Clock
from cocotb.task import bridge

from sim import router_bench
from sim.runner import ROOT, parameters, report, select_mutant

CLOCK_NS = 10


@cocotb.test()
async def unit_tests(dut):
    params = parameters()
    select_mutant(dut)
    cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start())
    router_bench.attach(dut)
    path = ROOT / "tests" / "test_router_unit.py"
    spec = importlib.util.spec_from_file_location("test_router_unit", path)
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    for name in params["tests"]:
        test = getattr(suite, name)
        seeds = params.get("seeds", [0]) if "seed" in inspect.signature(test).parameters \
            else [None]
        for seed in seeds:
            # The tests drive the router through blocking calls (sim.router_bench.run), so
            # they run in a bridge thread that hands the simulation back to cocotb.
            await bridge(test)(**({} if seed is None else {"seed": seed}))
            dut._log.info(f"{name}{'' if seed is None else f' seed {seed}'}: passed")
    report(tests=len(params["tests"]))
