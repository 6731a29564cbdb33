"""Build a tile (in a StreamHarness) from a compiler TileConfig and run tile tests on it:
the entry used by tests, bench and the CLI."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict

from golden.workloads import get_workload
from rtl.tile import Tile
from sim.harness import StreamHarness
from sim.runner import SimBuild, build, run
from spec.config import TileConfig, kv_context

MODULE = "tb.tile_tb"

#: Harness memory depths (beats) of the tile's host, KV and network streams; longer
#: transfers take several harness runs (sim.tile_driver).
HOST_DEPTH, KV_DEPTH, NET_DEPTH = 2048, 2048, 512


def harness_depths(config: TileConfig) -> dict[str, int]:
    return {"program": config.program_depth, "host_req": HOST_DEPTH, "host_resp": HOST_DEPTH,
            "kv_req": KV_DEPTH, "kv_resp": KV_DEPTH, "net_in": NET_DEPTH,
            "net_out": NET_DEPTH}


#: Scratchpad words a tile config keeps beside the KV pages (queries, P, outputs).
WORKING_WORDS = 8192


def tile_config(workload: str, *, n: int = 8, max_context: int | None = None) -> TileConfig:
    """The one-tile design point for a workload's attention: KV pages for one sequence of
    up to ``max_context`` tokens (default 1056 with pages of at least N tokens, else 64,
    at most what the 2048-entry block table maps) for every KV head, K and V; the
    scratchpad rounded up to a power of two with :data:`WORKING_WORDS` to spare; a
    4096-instruction program memory."""
    cfg = get_workload(workload)
    rows = 2 * cfg.kv_heads
    max_context = kv_context(rows, cfg.page_size, max_context,
                             1056 if cfg.page_size >= n else 64)
    return TileConfig.for_kv_cache(cfg.head_dim, cfg.v_head_dim, cfg.page_size, n=n,
                                   rows=rows, max_context=max_context,
                                   working_words=WORKING_WORDS, every_page=True)


def tile_from_config(config: TileConfig, *, fault_injection: bool = False) -> Tile:
    """The RTL tile of a compiler :class:`TileConfig`."""
    return Tile(**config.to_rtl(fault_injection=fault_injection))


def config_json(config: TileConfig) -> dict:
    return {k: v for k, v in asdict(config).items() if k != "kv_start"}


@functools.cache
def _tile_build(config_text: str, simulator: str | None, waves: bool | None) -> SimBuild:
    config = TileConfig(**json.loads(config_text))
    tile = sim_tile(config)
    digest = hashlib.sha1(config_text.encode()).hexdigest()[:8]
    # -O1: a tile's per-cycle code compiles in two thirds of the -O2 time, and tile runs
    # are short (the build dominates a test).
    return build(StreamHarness(tile, harness_depths(config)), f"tile-n{config.n}-{digest}",
                 simulator=simulator, waves=waves, opt_fast="-O1")


#: The memory channels the simulated tile's DMAs may name (their words leave on
#: ``net_out``; a test answers LOADs as a channel would), of words whose bits alternate,
#: so every bit of the sequencer's bound on a channel's words is seen both ways.
SIM_CHANNELS, SIM_CHANNEL_WORDS = 5, 0xA5A5A5


def sim_tile(config: TileConfig) -> Tile:
    """The tile as simulated: with the fault-injection hook on the host port (``flip``),
    so one build serves every test (synthesis builds leave it out), and as tile (0, 0)
    of a 2 x 1 mesh with :data:`SIM_CHANNELS` memory channels, so a DMA may name its
    neighbour or a channel (the words leave on ``net_out``)."""
    return Tile(**config.to_rtl(fault_injection=True), mesh=(2, 1),
                memory_channels=SIM_CHANNELS, channel_words=SIM_CHANNEL_WORDS)


def tile_build(config: TileConfig, *, simulator: str | None = None,
               waves: bool | None = None) -> SimBuild:
    """The tile of ``config`` in a harness (built once per config and options)."""
    text = json.dumps(config_json(config), sort_keys=True)
    return _tile_build(text, simulator, waves)


def simulate_attention(config: TileConfig, workload: str, layer: int, *, prefill: int = 0,
                       context: int = 0, steps: int = 1, seed: int = 1, idle: float = 0.0,
                       stall: float = 0.0, simulator: str | None = None,
                       waves: bool | None = None, loops: bool | None = None) -> dict:
    """Prefill ``prefill`` prompt tokens (0: none), fill the KV cache up to ``context``
    tokens directly (if more), then run ``steps`` decode steps appending one token's K/V
    each; every output is checked bit-exact against golden. Returns the run's metrics
    (per phase cycles and counters, the programs' summaries). ``loops``: True makes every
    program compact (loops over key blocks), False none; by default those whose straight
    program does not fit the program memory."""
    if prefill < 0 or context < 0 or steps < 0 or prefill + context + steps == 0:
        raise ValueError("nothing to simulate: give prefill tokens, a context or decode steps")
    handle = tile_build(config, simulator=simulator, waves=waves)
    params = {"config": config_json(config), "workload": workload, "layer": layer,
              "prefill": prefill, "context": context, "steps": steps, "seed": seed,
              "idle": idle, "stall": stall, "loops": loops}
    tag = (f"{workload}-l{layer}-p{prefill}-c{context}-s{steps}-i{idle}-b{stall}"
           f"{'' if loops is None else f'-loops{int(loops)}'}")
    return run(handle, MODULE, testcase="tile_attention", seed=seed, params=params, tag=tag)


def simulate_case(config: TileConfig, testcase: str, *, simulator: str | None = None) -> dict:
    """One of the tile's fixed cocotb cases on the tile of ``config`` (a tiny-shaped one):
    ``tile_faults`` (ECC faults through the host port, a bad instruction, a full KV
    sequence), ``tile_network`` (words arriving from the network, a local DMA, a DMA
    to a neighbour) or ``tile_programs`` (the sequencer's checks)."""
    handle = tile_build(config, simulator=simulator)
    return run(handle, MODULE, testcase=testcase, params={"config": config_json(config)},
               tag=testcase)
