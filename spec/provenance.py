"""Where a measured figure comes from: the command that produced it and the date.

Every JSON report under ``build/`` (``bench.json``, ``mutate.json``, ``synth.json``)
has a sidecar ``<name>.provenance.json`` mapping each of its figures to
``{"command": ..., "date": ...}``; the writers :func:`record` what they measured, and
``make results`` (:mod:`verif.results`) quotes both next to the tables it generates.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from pathlib import Path

__all__ = ["command_line", "load", "record", "sidecar"]


def sidecar(report: Path) -> Path:
    """The provenance file of the JSON report ``report``."""
    return report.with_name(f"{report.stem}.provenance.json")


def command_line() -> str:
    """This process's command as a person would type it (``python -m bench --only x``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = ["python", "-m", spec.name.removesuffix(".__main__")] if spec else \
        [Path(sys.argv[0]).name]
    return shlex.join(head + sys.argv[1:])


def load(report: Path) -> dict[str, dict]:
    """The provenance of ``report``'s figures ({} if none was recorded)."""
    path = sidecar(report)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def record(report: Path, keys, command: str | None = None,
           date: datetime.date | None = None) -> None:
    """Say that ``keys`` of ``report`` were measured now by ``command`` (this process's
    command line by default); other keys keep what they had."""
    entry = {"command": command or command_line(),
             "date": (date or datetime.date.today()).isoformat()}
    provenance = load(report)
    provenance.update({key: entry for key in keys})
    path = sidecar(report)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n")
