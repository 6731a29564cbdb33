"""The quick formal proof on the router (``python -m formal --quick``: credits,
output ownership and delivery by k-induction); ``make formal`` runs them all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_router_proofs_pass():
    done = subprocess.run([sys.executable, "-m", "formal", "--quick"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and "PASS" in done.stdout, done.stdout
