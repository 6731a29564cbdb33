"""make mutate: Yosys mutants of a block's own cells, all in one build behind mutsel."""

from __future__ import annotations

import re

import pytest

from verif.mutate import main, mutants


def test_mutants_touch_only_the_block_and_are_selected_by_mutsel(tmp_path):
    found = mutants("tensor_core", 5, 1, tmp_path)
    assert [m["mutant"] for m in found] == [1, 2, 3, 4, 5]
    assert all(m["source"].startswith("rtl/tensor_core.py:") for m in found), found
    assert {m["mode"] for m in found} <= {"inv", "const0", "const1", "cnot0", "cnot1"}
    verilog = (tmp_path / "mutated.v").read_text()
    assert re.search(r"^\s*input \[2:0\] mutsel;", verilog, re.M)
    # The harness's memories survive flattening (the testbench loads and reads them).
    assert all(f"{name}_mem [" in verilog for name in "abc")


def test_bad_options_are_refused(capsys):
    for argv in (["--mutants", "0"], ["--blocks", "scratchpad"]):
        try:
            main(argv)
        except SystemExit as stop:
            assert stop.code == 2
        else:
            raise AssertionError(f"{argv} was accepted")


@pytest.mark.nightly
def test_the_router_unit_tests_run_on_a_mutant_build_and_catch_mutants(tmp_path):
    """The router's check (its unit tests on Verilator, tb/router_tb.py) passes on the
    unmutated build and fails on some of its first mutants."""
    from sim.runner import SimulationFailed, build
    from verif.mutate import BLOCKS

    found = mutants("router", 6, 1, tmp_path)
    handle = build(None, "mutate-router-test",
                   verilog_source=(tmp_path / "mutated.v").read_text())
    check = BLOCKS["router"].check
    check(handle, 0)
    killed = 0
    for mutant in found:
        try:
            check(handle, mutant["mutant"])
        except SimulationFailed:
            killed += 1
    assert killed >= 3, f"{killed} of {len(found)} killed"
