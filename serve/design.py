"""A design point to serve on: the chip (workload, mesh, array, memory bandwidth, KV
placement, MoE mapping and weights), its capacity, and its cost model, calibrated from
runs of the cycle-accurate chip and saved under ``build/serve/`` (reused while the
design point and the chip's sources are the same).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from golden.workloads import WorkloadConfig
from serve.cost import (
    KEPT,
    CostModel,
    Shape,
    calibrate,
    calibration_plan,
    kept,
    load_or_calibrate,
    source_digest,
)
from serve.scheduler import Capacity
from spec.config import ChipConfig

__all__ = ["MODEL_LAYERS", "SERVE_KV_ROWS", "Design", "prepare"]

ROOT = Path(__file__).resolve().parent.parent
CALIBRATIONS = ROOT / "build" / "serve"
#: Block-table rows of a tile of a serving design point unless said otherwise: the
#: table's 2,048 entries as 32 rows of 64 pages, so the 2 x 2 chip holds 32 gpt-oss
#: sequences of up to 1,024 tokens (``serrano sim``'s 8 rows hold 8 of 4,096).
SERVE_KV_ROWS = 32
#: Decoder layers of the model each workload is shaped after (GPT-OSS-120B: 36;
#: DeepSeek-R1 and Kimi-K2: 61); another workload defaults to its own attention layers.
MODEL_LAYERS = {"gpt-oss": 36, "deepseek-r1": 61, "kimi-k2": 61}


@dataclass(frozen=True)
class Design:
    """One design point of the chip, as ``serrano sim`` takes it."""
    workload: str = "gpt-oss"
    mesh: int = 2
    array: int = 8
    placement: str = "local"
    memory_bandwidth: str | None = None
    moe: str = "sparse"
    weights: str | None = None
    kv_rows: int = SERVE_KV_ROWS

    def label(self) -> str:
        bandwidth = f" {self.memory_bandwidth} B/cycle" if self.memory_bandwidth else ""
        rows = f" {self.kv_rows} rows" if self.kv_rows != SERVE_KV_ROWS else ""
        return (f"{self.mesh}x{self.mesh} N={self.array}{bandwidth}{rows} {self.placement}"
                f"{'' if self.moe == 'sparse' else f' moe {self.moe}'}"
                f"{f' {self.weights}' if self.weights else ''}")


@dataclass
class Prepared:
    """A design point ready to serve: its capacity, layers' windows and cost model, and
    the chip it was calibrated on (``config``, ``workload``, the full-attention
    ``layer``)."""
    design: Design
    capacity: Capacity
    windows: list[int | None]
    model: CostModel
    config: ChipConfig
    workload: WorkloadConfig
    layer: int
    threads: int = 1

    def simulate(self, **arguments) -> list[dict]:
        """The calibrated layer on the chip (``compiler.chip.layer_rounds``'s arguments
        besides the design point's placement, MoE mapping and weights; every output
        checked against golden): its rounds as :func:`serve.cost.kept` keeps them."""
        from compiler.chip import layer_rounds
        from sim.chip_run import round_energy, simulate_layer

        d = self.design
        arguments = {"placement": d.placement, "moe": d.moe, "weights": d.weights,
                     "seed": 1, **arguments}
        rounds = layer_rounds(self.config, self.workload, self.layer, **arguments)
        result = simulate_layer(self.config, self.workload, self.layer, rounds=rounds,
                                threads=self.threads, **arguments)
        return [kept(r, sum(round_energy(r, self.config).values()))
                for r in result["rounds"]]


def _move_word_pj(config: ChipConfig) -> float:
    """The energy of a KV word moved to a neighbouring tile, as the access model prices
    a round's counts (:func:`sim.chip_run.round_energy`): a scratchpad read and write,
    one flit injected and carried over one link."""
    from rtl.tile import Counters
    from sim.chip_run import round_energy

    counts = {name: 0 for name, _ in Counters()} | {"spad": 2}
    return sum(round_energy({"tiles": {0: counts}, "flits": 1, "link_flits": 1},
                            config).values())


def prepare(design: Design, layers: int | None = None, recalibrate: bool = False,
            progress: Callable[[str], None] = print, threads: int = 1) -> Prepared:
    """The design point's capacity, the ``layers`` (default :data:`MODEL_LAYERS`) layers'
    windows (the workload's attention layers in turn), and its cost model: saved, or
    calibrated on the chip now (ValueError if the chip cannot be built or a calibration
    run does not fit it)."""
    from compiler.chip import MOE_TOKENS, PLACEMENTS, check_weights
    from golden.workloads import get_workload
    from sim.chip_run import chip_config

    cfg = get_workload(design.workload)
    layers = layers or MODEL_LAYERS.get(cfg.name, len(cfg.windows))
    if layers < 1:
        raise ValueError(f"layers must be >= 1, not {layers}")
    windows = [cfg.windows[i % len(cfg.windows)] for i in range(layers)]
    config = chip_config(cfg, k=design.mesh, n=design.array, moe=design.moe,
                         memory_bandwidth=design.memory_bandwidth, kv_rows=design.kv_rows)
    tile = config.tile
    capacity = Capacity(tiles=config.tiles, pages=tile.num_pages, page_size=tile.page_size,
                        jobs_per_tile=tile.kv_sequences // 2, kv_heads=cfg.kv_heads,
                        parts=PLACEMENTS[design.placement].parts_per_slot,
                        max_tokens=tile.max_pages * tile.page_size,
                        page_words=tile.page_size * tile.token_words)
    if capacity.max_sequences < 1:
        raise ValueError(f"a {design.mesh}x{design.mesh} chip cannot hold one sequence of "
                         f"{cfg.name} ({cfg.kv_heads} KV heads)")
    shape = Shape(tiles=config.tiles, kv_heads=cfg.kv_heads, experts=cfg.experts,
                  top_k=cfg.top_k, moe_tokens=MOE_TOKENS, moe=design.moe != "off",
                  channels=config.tile_channels,
                  chained=design.moe == "sparse"
                  and check_weights(design.weights, design.moe, config) == "streamed",
                  kv_from_memory=design.placement == "far",
                  move_word_pj=_move_word_pj(config))
    # The calibrated layer: a full-attention one (window layers are priced on it).
    layer = next((i for i, w in enumerate(cfg.windows) if w is None), len(cfg.windows) - 1)

    plans = calibration_plan(capacity.max_sequences, capacity.max_context)

    def make() -> list[dict]:
        progress(f"calibrating the cost model of {design.label()} on the RTL "
                 f"(saved as {path})")
        return calibrate(plans, lambda plan: ready.simulate(
            batch=plan.batch, **({"prefill": plan.tokens, "steps": 0} if plan.phase == "prefill"
                                 else {"context": plan.tokens, "steps": 1})), progress)

    key = {**asdict(design), "layer": layer, "sources": source_digest(ROOT), "kept": list(KEPT),
           "plans": [asdict(plan) for plan in plans]}
    name = hashlib.sha256(json.dumps(asdict(design), sort_keys=True).encode()).hexdigest()
    path = CALIBRATIONS / f"{cfg.name}-{name[:12]}.json"
    ready = Prepared(design, capacity, windows, CostModel(shape, {}), config, cfg, layer,
                     threads)
    ready.model = load_or_calibrate(path, key, shape, make, fresh=recalibrate)
    return ready
