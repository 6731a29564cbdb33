"""Build a tile (in a StreamHarness) from a compiler TileConfig and run tile tests on it:
the entry used by tests, bench and the CLI."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict

from compiler.config import TileConfig
from rtl.tile import Tile
from tb.harness import StreamHarness
from tb.runner import SimBuild, build, run

MODULE = "tb.tile_tb"

#: Harness memory depths (beats) of the host streams; KV requests sized for a
#: 1024-token context of a gpt-oss-shaped layer (2 KV heads x K, V x 4 words).
HOST_DEPTH, KV_DEPTH, NET_DEPTH = 4096, 32768, 16


def tile_from_config(config: TileConfig, *, fault_injection: bool = False) -> Tile:
    """The RTL tile of a compiler :class:`TileConfig` (8 scratchpad banks)."""
    banks = 8
    if config.spad_words % banks:
        raise ValueError(f"spad_words {config.spad_words} is not a multiple of {banks} banks")
    return Tile(n=config.n, banks=banks, depth=config.spad_words // banks,
                page_size=config.page_size, token_words=config.token_words,
                num_pages=config.num_pages, sequences=config.kv_sequences,
                max_pages=config.max_pages, acc_depth=config.acc_depth, slots=config.slots,
                program_depth=config.program_depth, fault_injection=fault_injection)


def config_json(config: TileConfig) -> dict:
    return {k: v for k, v in asdict(config).items() if k != "kv_start"}


@functools.cache
def _tile_build(config_text: str, fault_injection: bool, simulator: str | None,
                waves: bool | None) -> SimBuild:
    config = TileConfig(**json.loads(config_text))
    tile = tile_from_config(config, fault_injection=fault_injection)
    depths = {"program": config.program_depth, "host_req": HOST_DEPTH,
              "host_resp": HOST_DEPTH, "kv_req": KV_DEPTH, "kv_resp": KV_DEPTH,
              "net_in": NET_DEPTH, "net_out": NET_DEPTH}
    digest = hashlib.sha1(config_text.encode()).hexdigest()[:8]
    name = f"tile-n{config.n}-{digest}{'-fi' if fault_injection else ''}"
    return build(StreamHarness(tile, depths), name, simulator=simulator, waves=waves)


def tile_build(config: TileConfig, *, fault_injection: bool = False,
               simulator: str | None = None, waves: bool | None = None) -> SimBuild:
    """The tile of ``config`` in a harness (built once per config and options)."""
    text = json.dumps(config_json(config), sort_keys=True)
    return _tile_build(text, fault_injection, simulator, waves)


def simulate_attention(config: TileConfig, workload: str, layer: int, *, prefill: int = 0,
                       context: int = 0, steps: int = 1, seed: int = 1, idle: float = 0.0,
                       stall: float = 0.0, simulator: str | None = None,
                       waves: bool | None = None) -> dict:
    """Prefill ``prefill`` prompt tokens (0: none), fill the KV cache up to ``context``
    tokens directly (if more), then run ``steps`` decode steps appending one token's K/V
    each; every output is checked bit-exact against golden. Returns the run's metrics
    (per phase cycles and counters, the programs' summaries)."""
    if prefill < 0 or context < 0 or steps < 0 or prefill + context + steps == 0:
        raise ValueError("nothing to simulate: give prefill tokens, a context or decode steps")
    handle = tile_build(config, simulator=simulator, waves=waves)
    params = {"config": config_json(config), "workload": workload, "layer": layer,
              "prefill": prefill, "context": context, "steps": steps, "seed": seed,
              "idle": idle, "stall": stall}
    tag = f"{workload}-l{layer}-p{prefill}-c{context}-s{steps}-i{idle}-b{stall}"
    return run(handle, MODULE, testcase="tile_attention", seed=seed, params=params, tag=tag)
