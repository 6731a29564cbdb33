"""make mutate: Yosys mutants of a block's own cells, all in one build behind mutsel."""

from __future__ import annotations

import re

import pytest

from verif.mutate import main, mutants, no_op


def test_mutants_touch_only_the_block_and_are_selected_by_mutsel(tmp_path):
    found = mutants("tensor_core", 5, 1, tmp_path)
    assert [m["mutant"] for m in found] == [1, 2, 3, 4, 5]
    assert all(m["source"].startswith("rtl/tensor_core.py:") for m in found), found
    assert {m["mode"] for m in found} <= {"inv", "const0", "const1", "cnot0", "cnot1"}
    verilog = (tmp_path / "mutated.v").read_text()
    assert re.search(r"^\s*input \[2:0\] mutsel;", verilog, re.M)
    # The harness's memories survive flattening (the testbench loads and reads them).
    assert all(f"{name}_mem [" in verilog for name in "abc")


def test_a_mutation_that_keeps_a_constant_bit_is_a_no_op():
    cells = {"c": {"connections": {"A": ["0", "1", 7], "B": [8, "1"]}}}

    def why(**fields):
        return no_op({"cell": "c"} | fields, cells)
    assert why(mode="const0", port="A", portbit="0") == "A[0] is the constant 0"
    assert why(mode="const1", port="A", portbit="1") == "A[1] is the constant 1"
    assert why(mode="const1", port="A", portbit="0") is None  # 0 forced to 1: a change
    assert why(mode="const0", port="A", portbit="2") is None  # a net, not a constant
    assert why(mode="inv", port="A", portbit="0") is None
    assert why(mode="cnot1", port="A", portbit="2", ctrlbit="0") == (
        "its flip needs bit 0 = 1, the constant 0")
    assert why(mode="cnot0", port="B", portbit="0", ctrlbit="1") == (
        "its flip needs bit 1 = 0, the constant 1")
    assert why(mode="cnot1", port="B", portbit="0", ctrlbit="1") is None


def _cell(kind: str, inputs: dict, width: int) -> dict:
    """A Yosys-JSON cell of ``kind`` with input ``inputs`` (net bits) and a 1-bit Y."""
    params = {f"{port}_{what}": format(value, "032b") for port, bits in inputs.items()
              for what, value in (("SIGNED", 0), ("WIDTH", len(bits)))}
    return {"type": kind, "parameters": params | {"Y_WIDTH": format(width, "032b")},
            "port_directions": {port: "input" for port in inputs} | {"Y": "output"},
            "connections": inputs | {"Y": [99 + i for i in range(width)]}}


def test_a_mutation_a_cell_cannot_see_is_proven_a_no_op(tmp_path):
    """A flip of one input of a reduction, enabled by another input being 1, never
    changes whether any is set (SAT proves it); forcing an AND's input does."""
    cells = {"c": _cell("$logic_not", {"A": [2, 3]}, 1),
             "d": _cell("$and", {"A": [4], "B": [5]}, 1)}
    assert no_op({"cell": "c", "mode": "cnot1", "port": "A", "portbit": "0",
                  "ctrlbit": "1"}, cells, tmp_path) == (
        "$logic_not's outputs are the same for every input (SAT)")
    assert no_op({"cell": "c", "mode": "inv", "port": "A", "portbit": "0"},
                 cells, tmp_path) is None
    assert no_op({"cell": "d", "mode": "const1", "port": "A", "portbit": "0"},
                 cells, tmp_path) is None


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
