"""Synthesis flows: Yosys (generic gates, ECP5) and nextpnr-ecp5 area and Fmax per design.

``python -m synth`` (``make synth``) runs every registered design (:data:`DESIGNS`) through
:func:`run_flow` and merges the figures into ``build/synth.json``, one flat object of
metrics named ``synth__<design>__<category_metric>`` (see ``docs/synth.md``).
Other tools read a design's figures with :func:`load_area`.
"""

from __future__ import annotations

import json
from pathlib import Path

from synth.designs import (
    DESIGNS,
    UnknownDesign,
    build_design,
    rtl_design,
)
from synth.flow import (
    BUILD_DIR,
    DEFAULT_FREQ_MHZ,
    ROOT,
    Metrics,
    SynthError,
    parse_nextpnr_report,
    parse_yosys_stat,
    run_flow,
)

__all__ = [
    "DESIGNS",
    "UnknownDesign",
    "build_design",
    "rtl_design",
    "BUILD_DIR",
    "DEFAULT_FREQ_MHZ",
    "SYNTH_JSON",
    "Metrics",
    "SynthError",
    "parse_nextpnr_report",
    "parse_yosys_stat",
    "run_flow",
    "metric_name",
    "load_metrics",
    "load_area",
]

#: The merged metrics of every ``make synth`` run.
SYNTH_JSON = ROOT / "build" / "synth.json"


def metric_name(design: str, metric: str) -> str:
    """``metric_name("tensor_core_n8", "ecp5_lut4")`` → ``"synth__tensor_core_n8__ecp5_lut4"``."""
    return f"synth__{design}__{metric}"


def load_metrics(path: Path = SYNTH_JSON) -> dict[str, float | int | None]:
    """The flat metrics object in ``path``; empty if the file does not exist."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def load_area(design: str, path: Path = SYNTH_JSON) -> dict[str, float | int | None] | None:
    """The last measured synthesis figures of ``design``, or ``None`` if never measured.

    Keys are the metric names without the ``synth__<design>__`` prefix, e.g.
    ``{"generic_cells": 5120, "ecp5_lut4": 812, "ecp5_fmax_mhz": 131.2, ...}``
    (``ecp5_fmax_mhz`` is absent if the last run skipped place and route). Reads
    ``build/synth.json`` written by ``make synth``; never runs a tool, so it is cheap.
    An unreadable file counts as "not measured".
    """
    prefix = metric_name(design, "")
    try:
        metrics = load_metrics(path)
    except (OSError, ValueError):
        return None
    area = {key[len(prefix):]: value for key, value in metrics.items() if key.startswith(prefix)}
    return area or None
