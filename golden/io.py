"""Workload files: one ``.npy`` per tensor plus ``manifest.json`` (shapes, dtypes, scales, config).

Layout of a workload directory::

    manifest.json          {"format": "serrano-workload", "version": 1, "config": {...},
                            "numerics": {...}, "scales": {...},
                            "tensors": {name: {"file", "shape", "dtype"}},
                            "expected": {name: {"file", "shape", "dtype"}}}
    <name>.npy             inputs (e.g. attn0.q_prefill.npy, moe.w_gate.npy)
    expected/<name>.npy    expected outputs, once computed (``*.out`` integer, ``*.ref`` float)

The simulator dumps its outputs in the same form (a directory of ``<name>.npy``) so
:func:`compare` can check them bit for bit.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from golden.numerics import NUMERICS, Numerics
from golden.workloads import Workload, WorkloadConfig

FORMAT = "serrano-workload"
VERSION = 2


def _entry(path: Path, root: Path, array: np.ndarray) -> dict:
    return {"file": str(path.relative_to(root)), "shape": list(array.shape),
            "dtype": str(array.dtype)}


def save_workload(wl: Workload, directory: str | Path, numerics: Numerics = NUMERICS) -> Path:
    """Write ``wl`` into ``directory`` (created); returns the manifest path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    entries = {}
    for name, array in sorted(wl.tensors.items()):
        path = root / f"{name}.npy"
        np.save(path, array, allow_pickle=False)
        entries[name] = _entry(path, root, array)
    manifest = {
        "format": FORMAT, "version": VERSION, "config": wl.config.to_json(),
        "numerics": asdict(numerics), "scales": wl.scales, "tensors": entries, "expected": {},
    }
    path = root / "manifest.json"
    path.write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def _read_manifest(root: Path) -> dict:
    path = root / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{root} is not a workload directory: no manifest.json")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{path}: not a {FORMAT} v{VERSION} manifest (format {manifest.get('format')!r}, "
            f"version {manifest.get('version')!r})"
        )
    return manifest


def _load_entries(root: Path, entries: dict) -> dict[str, np.ndarray]:
    arrays = {}
    for name, entry in entries.items():
        path = root / entry["file"]
        if not path.is_file():
            raise ValueError(f"tensor {name}: file {path} is missing")
        array = np.load(path, allow_pickle=False)
        if list(array.shape) != entry["shape"] or str(array.dtype) != entry["dtype"]:
            raise ValueError(
                f"tensor {name}: {path} holds {array.dtype}{list(array.shape)}, the manifest "
                f"says {entry['dtype']}{entry['shape']}"
            )
        arrays[name] = array
    return arrays


def load_workload(directory: str | Path, numerics: Numerics = NUMERICS) -> Workload:
    """Read a workload written by :func:`save_workload`, checking shapes, dtypes and numerics."""
    root = Path(directory)
    manifest = _read_manifest(root)
    if manifest["numerics"] != asdict(numerics):
        diff = sorted(k for k, v in asdict(numerics).items() if manifest["numerics"].get(k) != v)
        raise ValueError(f"{root}: saved with different numerics (fields {', '.join(diff)})")
    tensors = _load_entries(root, manifest["tensors"])
    return Workload(WorkloadConfig.from_json(manifest["config"]), tensors, manifest["scales"])


def save_expected(directory: str | Path, expected: dict[str, np.ndarray]) -> None:
    """Write expected outputs under ``directory/expected`` and list them in the manifest."""
    root = Path(directory)
    manifest = _read_manifest(root)
    (root / "expected").mkdir(exist_ok=True)
    entries = {}
    for name, array in sorted(expected.items()):
        path = root / "expected" / f"{name}.npy"
        np.save(path, np.asarray(array), allow_pickle=False)
        entries[name] = _entry(path, root, np.asarray(array))
    manifest["expected"] = entries
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def load_expected(directory: str | Path) -> dict[str, np.ndarray]:
    """Expected outputs saved by :func:`save_expected` (empty if none were computed)."""
    root = Path(directory)
    return _load_entries(root, _read_manifest(root)["expected"])


def save_outputs(directory: str | Path, outputs: dict[str, np.ndarray]) -> None:
    """Write ``outputs`` as ``directory/<name>.npy`` (created): the form :func:`compare`
    reads, e.g. the simulator's outputs beside a workload directory."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for name, array in sorted(outputs.items()):
        np.save(root / f"{name}.npy", np.asarray(array), allow_pickle=False)


def compare(expected: dict[str, np.ndarray], actual_dir: str | Path) -> dict[str, int]:
    """Mismatching elements per integer output (``*.out``, ``moe.experts|gates|load``).

    ``actual_dir`` holds ``<name>.npy`` dumps (e.g. from the simulator); a missing file or a
    shape mismatch raises ValueError.
    """
    root = Path(actual_dir)
    result = {}
    for name, want in sorted(expected.items()):
        if not (name.endswith(".out") or name in ("moe.experts", "moe.gates", "moe.load")):
            continue
        path = root / f"{name}.npy"
        if not path.is_file():
            raise ValueError(f"output {name}: {path} is missing")
        got = np.load(path, allow_pickle=False)
        if got.shape != want.shape:
            raise ValueError(f"output {name}: shape {got.shape}, expected {want.shape}")
        result[name] = int(np.count_nonzero(got != want))
    return result
