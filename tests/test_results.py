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


def test_a_missed_target_is_marked():
    table = results.bench_table({"a__b__c": 0.5}, {}, {"a__b__c": (">=", 0.9)})
    assert "**missed**" in table


def test_mutate_table_lists_blocks_and_survivors():
    report = {"mutation__killed_share": 0.9, "mutants": 10, "killed": 9, "seed": 1,
              "blocks": {"router": {"mutants": 10, "killed": 9, "killed_share": 0.9,
                                    "survivors": [{"mutant": 3, "mode": "inv",
                                                   "cell": "$and$x", "port": "A",
                                                   "source": "router.py:40"}]}}}
    table = results.mutate_table(report, {"blocks.router": {
        "command": "python -m verif.mutate", "date": "2026-12-04"}})
    assert "**9 of 10 = 0.900**" in table
    assert "| router | 10 | 9 | 0.900 |" in table
    assert "router mutant 3: inv on `$and$x` port A (router.py:40)" in table
    assert "`python -m verif.mutate` on 2026-12-04" in table


def test_the_documents_carry_the_markers():
    readme = (results.ROOT / "README.md").read_text()
    docs = (results.ROOT / "docs" / "results.md").read_text()
    assert "<!-- results:headline -->" in readme
    assert "<!-- results:bench -->" in docs and "<!-- results:mutate -->" in docs
