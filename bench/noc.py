"""The network on its own (Verilator, traffic generated and checked in hardware by
:class:`sim.traffic.TrafficBench`): zero-load latency per hop, latency against offered
load and saturation throughput per traffic pattern, on 4 x 4 and 8 x 8 meshes with
single-flit packets (2 VCs, one per message class, buffers of
:data:`spec.noc.DEFAULT_DEPTH` = 6 flits: the network's default, the chip's too).

- ``noc__zero_load__cycles_per_hop``: the slope of zero-load latency against hop count,
  from two patterns whose every packet travels a known distance (neighbour: 1 hop;
  bit-complement: the average of |k-1-2x| + |k-1-2y|), at 0.5 % load.
- ``noc__<pattern>_<k>x<k>__saturation``: accepted flits/node/cycle at saturation
  (:mod:`sim.noc_run` defines it: < 95 % accepted, or latency > 3x zero-load).
- Every run is checked: no flit corrupted, duplicated, reordered or lost, no deadlock;
  ``noc__checked_packets_4x4`` counts the packets of the correctness runs (50 000 per
  pattern on 4 x 4, 10 % random sink stalls; the smallest pattern's count is reported).

Writes ``build/noc.json`` (every run's offered/accepted load and latency) and
``build/noc_<k>x<k>.png`` (latency against accepted load per pattern).
"""

from __future__ import annotations

import json
from pathlib import Path

from sim.noc_run import check_complete, correctness_runs, figures, simulate

OUT = Path("build")
PATTERNS = ("uniform", "transpose", "bit_complement", "tornado", "hotspot", "neighbour", "moe")
#: Hotspot: node (0, 0) takes this share of the traffic on top of its uniform share.
HOT_RATE = 0.2

TARGETS: dict[str, tuple[str, float]] = {
    "noc__checked_packets_4x4": (">=", 50_000),  # --quick sends 5 000 per pattern
    "noc__zero_load__cycles_per_hop": ("<=", 2.0),
    "noc__uniform_4x4__saturation": (">=", 0.75),
    "noc__uniform_8x8__saturation": (">=", 0.42),
}


def cycles_per_hop(k: int) -> float:
    """Zero-load latency slope: (bit-complement - neighbour) / (hops difference)."""
    runs = simulate(k, runs=[dict(pattern=p, load=0.005, measure=8000)
                             for p in ("neighbour", "bit_complement")])["runs"]
    near, far = (figures(r)["latency"] for r in runs)
    hops = sum(abs(k - 1 - 2 * x) + abs(k - 1 - 2 * y) for x in range(k) for y in range(k))
    far_hops = hops / sum(1 for x in range(k) for y in range(k)
                          if (x, y) != (k - 1 - x, k - 1 - y))
    return (far - near) / (far_hops - 1)


def sweep(k: int, pattern: str) -> dict:
    spec = {"pattern": pattern, "length": 1}
    if pattern == "hotspot":
        spec.update(hot_rate=HOT_RATE, hotspot=0)
    result = simulate(k, sweep=spec)
    points = [figures(r) for r in result["runs"]]
    return {"points": points, **result["saturation"]}


def plot(k: int, curves: dict) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the figures are in the JSON either way
        print("  (matplotlib not installed: no plot)")
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pattern, curve in curves.items():
        points = sorted((p for p in curve["points"] if p["latency"] is not None),
                        key=lambda p: p["offered"])
        ax.plot([p["accepted"] for p in points], [p["latency"] for p in points], marker=".",
                label=f"{pattern} (sat. {curve['saturation']:.2f})")
    ax.set_xlabel("accepted load (flits/node/cycle)")
    ax.set_ylabel("average latency (cycles)")
    ax.set_title(f"serrano NoC, {k} x {k} mesh, single-flit packets")
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = OUT / f"noc_{k}x{k}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(quick: bool) -> dict:
    OUT.mkdir(exist_ok=True)
    out: dict = {}
    packets = 5_000 if quick else 50_000
    checked = simulate(4, runs=correctness_runs(4, packets))
    check_complete(checked, packets)
    out["noc__checked_packets_4x4"] = min(r["delivered"] for r in checked["runs"])
    print(f"  4 x 4: {out['noc__checked_packets_4x4']}+ packets per pattern delivered exactly "
          "once, in order, uncorrupted", flush=True)
    hop = cycles_per_hop(4)
    out["noc__zero_load__cycles_per_hop"] = round(hop, 3)
    print(f"  zero-load latency: {hop:.2f} cycles per hop (4 x 4)", flush=True)
    sizes = (4,) if quick else (4, 8)
    patterns = ("uniform",) if quick else PATTERNS
    details: dict = {}
    for k in sizes:
        curves = {}
        for pattern in patterns:
            curve = sweep(k, pattern)
            curves[pattern] = curve
            out[f"noc__{pattern}_{k}x{k}__saturation"] = round(curve["saturation"], 3)
            print(f"  {k} x {k} {pattern}: saturation {curve['saturation']:.3f} flits/node/"
                  f"cycle, zero-load latency {curve['zero_load_latency']:.1f} cycles",
                  flush=True)
        details[f"{k}x{k}"] = curves
        path = plot(k, curves)
        if path:
            print(f"  wrote {path}")
    (OUT / "noc.json").write_text(json.dumps(details, indent=2) + "\n")
    return out
