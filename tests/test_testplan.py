"""docs/testplan.yaml names tests and cover points that exist, and covers every point."""

from __future__ import annotations

import ast
from pathlib import Path

import yaml
from cocotb_coverage.coverage import coverage_db

import sim.coverage  # noqa: F401  (declares the cover points)

ROOT = Path(__file__).resolve().parent.parent


def _tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                names.add(f"tests/{path.name}::{node.name}")
    return names


def test_every_named_test_and_cover_point_exists():
    plan = yaml.safe_load((ROOT / "docs" / "testplan.yaml").read_text())
    tests = _tests()
    points = {name.removeprefix("top.") for name in coverage_db
              if name.count(".") == 2}  # top.<block>.<point>
    named = set()
    for block, testpoints in plan.items():
        assert testpoints, f"{block}: no testpoints"
        for point in testpoints:
            assert point["testpoint"] and point["tests"], point
            missing = [t for t in point["tests"] if t not in tests]
            assert not missing, f"{block}: {point['testpoint']}: no such test {missing}"
            unknown = [c for c in point.get("coverage", []) if c not in points]
            assert not unknown, f"{block}: {point['testpoint']}: no cover point {unknown}"
            named |= set(point.get("coverage", []))
    assert named == points, f"cover points no testpoint names: {sorted(points - named)}"
