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
import os
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from golden.moe import MoEScales
from golden.workloads import Workload, WorkloadConfig
from spec.numerics import NUMERICS, Numerics

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
    return _write_manifest(root, manifest)


_MANIFEST_KEYS = ("config", "numerics", "scales", "tensors", "expected")


def _read_manifest(root: Path) -> dict:
    path = root / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{root} is not a workload directory: no manifest.json")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a JSON manifest ({error})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a {FORMAT} manifest (a JSON object)")
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(
            f"{path}: not a {FORMAT} v{VERSION} manifest (format {manifest.get('format')!r}, "
            f"version {manifest.get('version')!r})"
        )
    missing = [key for key in _MANIFEST_KEYS if not isinstance(manifest.get(key), dict)]
    if missing:
        raise ValueError(f"{path}: the manifest lacks {', '.join(missing)}")
    return manifest


def _write_manifest(root: Path, manifest: dict) -> Path:
    """Write the manifest atomically: a reader sees the old one or the new one, whole."""
    path = root / "manifest.json"
    partial = root / "manifest.json.partial"
    partial.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(partial, path)
    return path


def _load_entries(root: Path, entries: dict) -> dict[str, np.ndarray]:
    arrays = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict) or not {"file", "shape", "dtype"} <= entry.keys():
            raise ValueError(f"tensor {name}: the manifest's entry is not {{file, shape, "
                             f"dtype}}: {entry!r}")
        path = root / entry["file"]
        if not path.is_file():
            raise ValueError(f"tensor {name}: file {path} is missing")
        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise ValueError(f"tensor {name}: {path} is not a .npy array ({error})") from None
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise ValueError(f"tensor {name}: {path} holds NaN or infinite values")
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
    try:
        config = WorkloadConfig.from_json(manifest["config"])
    except TypeError as error:  # an unknown field
        raise ValueError(f"{root}: the manifest's config is not a workload config "
                         f"({error})") from None
    _check_scales(root, config, manifest["scales"])
    return Workload(config, tensors, manifest["scales"])


def _check_scales(root: Path, config: WorkloadConfig, scales: dict) -> None:
    """Every scale the models read is there (each one's value is checked where used)."""
    need = {f"attn{layer}": ("q", "k", "v", "out", "w_o") for layer in range(len(config.windows))}
    need["moe"] = tuple(f.name for f in fields(MoEScales))
    for group, names in need.items():
        have = scales.get(group)
        missing = [n for n in names if not isinstance(have, dict) or n not in have]
        if missing:
            raise ValueError(f"{root}: the manifest's scales lack "
                             + ", ".join(f"{group}.{name}" for name in missing))


def save_expected(directory: str | Path, expected: dict[str, np.ndarray]) -> None:
    """Write expected outputs under ``directory/expected`` and list them in the manifest,
    beside the ones it lists already (a simulator dump's golden outputs stay)."""
    root = Path(directory)
    manifest = _read_manifest(root)
    (root / "expected").mkdir(exist_ok=True)
    entries = dict(manifest["expected"])
    for name, array in sorted(expected.items()):
        path = root / "expected" / f"{name}.npy"
        np.save(path, np.asarray(array), allow_pickle=False)
        entries[name] = _entry(path, root, np.asarray(array))
    manifest["expected"] = entries
    _write_manifest(root, manifest)


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

    ``actual_dir`` holds ``<name>.npy`` dumps (e.g. from the simulator); a missing or
    unreadable file, or a shape or dtype that differs, raises ValueError.
    """
    root = Path(actual_dir)
    if not root.is_dir():
        raise ValueError(f"{root} is not a directory of <name>.npy outputs")
    result = {}
    for name, want in sorted(expected.items()):
        if not (name.endswith(".out") or name in ("moe.experts", "moe.gates", "moe.load")):
            continue
        path = root / f"{name}.npy"
        if not path.is_file():
            raise ValueError(f"output {name}: {path} is missing")
        try:
            got = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise ValueError(f"output {name}: {path} is not a .npy array ({error})") from None
        if got.shape != want.shape or got.dtype != want.dtype:
            raise ValueError(f"output {name}: {got.dtype}{list(got.shape)}, expected "
                             f"{want.dtype}{list(want.shape)}")
        result[name] = int(np.count_nonzero(got != want))
    return result
