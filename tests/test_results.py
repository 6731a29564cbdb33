"""make results: generated tables from build reports, provenance quoted, and a missing
report leaving its table untouched."""

import json

from spec import provenance
from verif import results


def test_provenance_records_command_and_date(tmp_path):
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"a__b__c": 1, "d__e__f": 2}))
    provenance.record(report, ["a__b__c"], command="python -m bench --only x")
    provenance.record(report, ["d__e__f"], command="python -m bench --only y")
    origin = provenance.load(report)
    assert origin["a__b__c"]["command"] == "python -m bench --only x"
    assert origin["d__e__f"]["command"] == "python -m bench --only y"
    assert len(origin["a__b__c"]["date"]) == 10  # YYYY-MM-DD


def test_tables_are_filled_between_markers_and_missing_ones_kept():
    text = ("intro\n<!-- results:bench -->\nold table\n<!-- /results:bench -->\n"
            "<!-- results:mutate -->\nkept\n<!-- /results:mutate -->\n")
    metrics = {"tensor_core__utilisation__n8_k64n": 0.97, "x__y__z": None}
    origin = {"tensor_core__utilisation__n8_k64n": {"command": "python -m bench",
                                                   "date": "2026-12-04"}}
    table = results.bench_table(metrics, origin, {"tensor_core__utilisation__n8_k64n":
                                                  (">=", 0.95)})
    filled, done = results.fill(text, {"bench": table, "mutate": None})
    assert done == ["bench"]
    assert "old table" not in filled and "kept" in filled
    assert "| `tensor_core__utilisation__n8_k64n` | 0.97 | >= 0.95 met | 2026-12-04, " \
           "`python -m bench` |" in filled
    assert "| `x__y__z` | n/a |  | not recorded |" in filled


def test_a_partial_report_updates_its_figures_and_keeps_the_others():
    """A report of some figures (one benchmark re-run): those rows are new, the others
    keep their rows, value and provenance, in the table and in the headline."""
    committed = ("<!-- results:bench -->\n| metric | value | target | measured |\n"
                 "|---|---:|---|---|\n"
                 "| `chip__sim__cycles_per_s` | 84,921 | >= 50000 met | 2026-12-05, "
                 "`python -m bench --only chip` |\n"
                 "| `serve__c1__tokens_per_j` | 10,000 |  | 2026-12-04, "
                 "`python -m bench --only serve` |\n<!-- /results:bench -->\n")
    kept = results.table_rows(committed, "bench", results.BENCH_ROW)
    assert set(kept) == {"chip__sim__cycles_per_s", "serve__c1__tokens_per_j"}
    metrics = {"serve__c1__tokens_per_j": 10825}
    origin = {"serve__c1__tokens_per_j": {"command": "python -m bench --only serve",
                                          "date": "2026-12-06"}}
    table = results.bench_table(metrics, origin, {}, kept)
    assert kept["chip__sim__cycles_per_s"].group(0) in table
    assert "| `serve__c1__tokens_per_j` | 10,825 |  | 2026-12-06, " in table
    assert "10,000" not in table
    headline = results.headline_table(metrics, origin, kept)
    assert "(`chip__sim__cycles_per_s`) | 84,921 |" in headline
    assert "(measured by `python -m bench --only chip` on 2026-12-05;" in headline


def test_a_missed_target_is_marked():
    table = results.bench_table({"a__b__c": 0.5}, {}, {"a__b__c": (">=", 0.9)})
    assert "**missed**" in table


def test_mutate_table_lists_blocks_and_survivors():
    report = {"mutation__killed_share": 0.9, "mutants": 10, "killed": 9, "seed": 1,
              "blocks": {"router": {"mutants": 10, "killed": 9, "killed_share": 0.9,
                                    "survivors": [{"mutant": 3, "mode": "inv",
                                                   "cell": "$and$x", "port": "A",
                                                   "source": "router.py:40"}],
                                    "no_op": [{"mutant": 4, "mode": "const1",
                                               "cell": "$eq$y", "source": "router.py:41",
                                               "no_op": "B[1] is the constant 1"}]}}}
    table = results.mutate_table(report, {"blocks.router": {
        "command": "python -m verif.mutate", "date": "2026-12-04"}})
    assert "**9 of 10 = 0.900**" in table
    assert "| router | 10 | 9 | 0.900 | 1 |" in table
    assert "router mutant 4: const1 on `$eq$y` (router.py:41): B[1] is the constant 1" in table
    assert "router mutant 3: inv on `$and$x` port A (router.py:40)" in table
    assert "`python -m verif.mutate` on 2026-12-04" in table


def test_synth_table_rows_say_fmax_fit_and_mapping(tmp_path):
    def metrics_of(design, **values):
        return {f"synth__{design}__{k}": v for k, v in values.items()}
    metrics = {**metrics_of("tensor_core_n4", generic_cells=100, ecp5_lut4=584, ecp5_ff=9,
                            ecp5_abc9=1, ecp5_fits=1, ecp5_fmax_mhz=133.94,
                            ecp5_fmax_target_mhz=100.0),
               **metrics_of("sequencer", ecp5_lut4=2624, ecp5_abc9=0, ecp5_fits=1,
                            ecp5_fmax_mhz=90.0, ecp5_fmax_target_mhz=100.0),
               **metrics_of("tile", ecp5_lut4=69557, ecp5_abc9=1, ecp5_fits=0),
               **metrics_of("scratchpad", ecp5_lut4=3983, ecp5_abc9=1, ecp5_fits=1)}
    origin = {"synth__tensor_core_n4__ecp5_lut4": {"command": "python -m synth",
                                                   "date": "2026-12-05"}}
    (tmp_path / "tensor_core_n4").mkdir()
    (tmp_path / "tensor_core_n4" / "critical_path.txt").write_text(
        "critical path posedge clk -> posedge clk: 10.00 ns (logic 2.50 ns in 3 stages, "
        "routing 7.50 ns)\n  from a.Q\n  to   b.CE\n  through (source lines, in path "
        "order):\n    /somewhere/else/rtl/tensor_core.py:12\n"
        "    /somewhere/else/rtl/tensor_core.py:40\n")
    table = results.synth_table(metrics, origin, tmp_path)
    rows = {line.split(" | ")[0]: line for line in table.splitlines()}
    assert "| `tensor_core_n4` | 100 | 584 | n/a | 9 |" in table
    assert ("133.9 (target 100, met) | `rtl/tensor_core.py:12` → `rtl/tensor_core.py:40`, "
            "10.0 ns (75% routing) | 2026-12-05, `python -m synth` |") in rows["| `tensor_core_n4`"]
    assert "not kept" in rows["| `sequencer` \\*"]  # placed, but its path file is gone
    library = "x: 1.00 ns (logic 0.50 ns in 1 stage, routing 0.50 ns)\n  through (source " \
              "lines, in path order):\n    /v/lib/python3.11/site-packages/amaranth/lib/a.py:5\n"
    assert results.critical_path(library) == \
        "`amaranth/lib/a.py:5` → `amaranth/lib/a.py:5`, 1.0 ns (50% routing)"
    assert "90.0 (target 100, **missed**)" in rows["| `sequencer` \\*"]
    assert "does not fit the 85F" in rows["| `tile`"]
    assert "not placed and routed (target 100)" in rows["| `scratchpad`"]
    assert "not recorded" in rows["| `tile`"]
    assert "mapped with Yosys's `abc`" in table
    assert "tensor_core_n8" not in table  # no figures, no row


def test_a_partial_synth_report_keeps_the_other_designs_rows(tmp_path):
    """A report of one design (``make synth ARGS='--only gemm_engine'``): its row is new,
    the other designs keep their committed rows, the abc footnote with them."""
    committed = ("<!-- results:synth -->\n| design | cells |\n|---|---:|\n"
                 "| `tensor_core_n4` | 12,266 | 2026-12-07, `python -m synth` |\n"
                 "| `sequencer` \\* | 23,894 | 2026-12-07, `python -m synth` |\n"
                 "| `gemm_engine` | 88,966 | 2026-12-06, `python -m synth` |\n\n"
                 "\\* mapped with Yosys's `abc` instead of `abc9`.\n<!-- /results:synth -->\n")
    kept = results.table_rows(committed, "synth", results.SYNTH_ROW)
    assert set(kept) == {"tensor_core_n4", "sequencer", "gemm_engine"}
    metrics = {"synth__gemm_engine__generic_cells": 90474, "synth__gemm_engine__ecp5_abc9": 1}
    origin = {"synth__gemm_engine__generic_cells": {"command": "python -m synth --only "
                                                    "gemm_engine", "date": "2026-12-07"}}
    table = results.synth_table(metrics, origin, tmp_path, kept)
    assert kept["tensor_core_n4"].group(0) in table and kept["sequencer"].group(0) in table
    assert "| `gemm_engine` | 90,474 |" in table and "88,966" not in table
    assert "mapped with Yosys's `abc`" in table
    assert table.index("tensor_core_n4") < table.index("sequencer") < table.index("gemm_engine")


def test_the_documents_carry_the_markers():
    readme = (results.ROOT / "README.md").read_text()
    docs = (results.ROOT / "docs" / "results.md").read_text()
    assert "<!-- results:headline -->" in readme
    assert "<!-- results:bench -->" in docs and "<!-- results:mutate -->" in docs
    assert "<!-- results:synth -->" in docs
