"""The layers hold: import-linter's contracts of pyproject.toml (each package imports only
from the layers below it, siblings of one layer stay independent, no import cycles
inside a package). An upward import or a cycle fails the suite, not only `make lint`."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_contracts_catch_an_upward_import(tmp_path):
    """The check can fail: a golden module importing the simulator breaks the layers."""
    import shutil

    for package in ("spec", "golden", "rtl", "compiler", "synth", "sim", "serve", "tb",
                    "bench", "fpga", "formal", "verif", "cli"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / "golden" / "moe.py").open("a") as module:
        module.write("\nimport sim.runner  # noqa: E402, F401\n")
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode != 0
    assert "serrano's layers BROKEN" in result.stdout
