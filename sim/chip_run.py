"""Build a chip (in a StreamHarness) from a compiler ChipConfig and run chip scenarios on
it: the entry used by tests, bench and the CLI."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import pickle
import tempfile
from dataclasses import asdict, replace
from itertools import zip_longest
from pathlib import Path

from compiler.chip import MOE_TOKENS, PREFILL_CHUNK
from rtl.chip import TILE_MODULE, Chip
from rtl.network_interface import payload_bits
from sim.faults import FaultPlan
from sim.harness import StreamHarness
from sim.runner import SimBuild, build, run
from sim.tile_run import HOST_DEPTH, KV_DEPTH, config_json
from spec import energy as per_access
from spec.config import ChipConfig, TileConfig
from spec.energy import CLASSES
from spec.isa import INSTRUCTION_BITS
from spec.noc import NocConfig

#: Block-table rows of a tile by default: 4 jobs (a K and a V row each).
KV_ROWS = 8

MODULE = "tb.chip_tb"
#: Words of the memory image one harness run writes (a larger image takes several).
MEMORY_DEPTH = 8192


def harness_depths(config: ChipConfig) -> dict[str, int]:
    """Harness memory depths: a whole program per load; longer host transfers take
    several harness runs (sim.chip_driver)."""
    return {"program": config.tiles * config.tile.program_depth, "host_req": HOST_DEPTH,
            "host_resp": HOST_DEPTH, "kv_req": KV_DEPTH, "kv_resp": KV_DEPTH,
            "memory_write": MEMORY_DEPTH}


def chip_json(config: ChipConfig) -> dict:
    return {**{k: v for k, v in asdict(config).items() if k != "tile"},
            "tile": config_json(config.tile)}


def chip_from_json(d: dict) -> ChipConfig:
    return ChipConfig(**{**d, "tile": TileConfig(**d["tile"])})


def chip_from_config(config: ChipConfig, *, shared_tile: bool = False,
                     fault_injection: bool = False) -> Chip:
    """The RTL chip of a :class:`ChipConfig` (``shared_tile``: as simulated, one tile
    design instantiated k * k times, the clocks of the vector units and the network gated
    while idle; ``fault_injection``: the host port can flip stored bits, see
    :mod:`sim.faults`)."""
    tile = config.tile.to_rtl(fault_injection=fault_injection)
    return Chip(config.k, tile={**tile, "sim_gating": shared_tile},
                vcs=config.vcs, depth=config.depth, max_packet=config.max_packet,
                shared_tile=shared_tile, sim_gating=shared_tile,
                memory_nodes=config.memory_nodes, memory_words=config.memory_words,
                memory_latency=config.memory_latency,
                memory_bandwidth=config.memory_bytes_per_cycle)


@functools.cache
def _chip_build(config_text: str, simulator: str | None, waves: bool | None,
                activity: bool, threads: int, fault_injection: bool) -> SimBuild:
    config = chip_from_json(json.loads(config_text))
    digest = hashlib.sha1(config_text.encode()).hexdigest()[:8]
    chip = chip_from_config(config, shared_tile=True, fault_injection=fault_injection)
    name = f"chip-k{config.k}-n{config.tile.n}-{digest}{'-faults' if fault_injection else ''}"
    return build(StreamHarness(chip, harness_depths(config)), name, simulator=simulator,
                 waves=waves, opt_fast="-O1", modules={TILE_MODULE: chip.tile_design},
                 activity=activity, threads=threads)


def chip_build(config: ChipConfig, *, simulator: str | None = None,
               waves: bool | None = None, activity: bool = False,
               threads: int = 1, fault_injection: bool = False) -> SimBuild:
    """The chip of ``config`` in a harness (built once per config and options;
    ``activity``: the SAIF-traced build of the energy proxy, :mod:`sim.energy`;
    ``threads``: Verilator threads, see :func:`sim.runner.build`; ``fault_injection``:
    the build whose host port can flip stored bits)."""
    return _chip_build(json.dumps(chip_json(config), sort_keys=True), simulator, waves,
                       activity, threads, fault_injection)


def simulate_chip(config: ChipConfig, testcase: str, params: dict, *, seed: int = 1,
                  tag: str | None = None, simulator: str | None = None,
                  waves: bool | None = None, activity: bool = False,
                  threads: int = 1, fault_injection: bool = False) -> dict:
    """Run cocotb test ``testcase`` of :mod:`tb.chip_tb` on the chip of ``config``; with
    ``activity``, ``energy`` in the result is the run's :class:`sim.energy.Energy`;
    ``fault_injection``: on the fault-injection build."""
    from sim.energy import energy

    handle = chip_build(config, simulator=simulator, waves=waves, activity=activity,
                        threads=threads, fault_injection=fault_injection)
    result = run(handle, MODULE, testcase=testcase, seed=seed,
                 params={"chip": chip_json(config), "fault_injection": fault_injection,
                         **params}, tag=tag or testcase)
    if activity:
        result["energy"] = energy(Path(result["activity_file"]), handle.directory)
    return result


def simulate_layer(config: ChipConfig, workload, layer: int, *, batch: int = 1,
                   prefill: int = 0, context: int = 0, steps: int = 1,
                   placement: str = "local", seed: int = 1, moe: str = "sparse",
                   schedule: list | None = None, simulator: str | None = None,
                   waves: bool | None = None, progress: Path | None = None,
                   dump: Path | None = None, activity: bool = False,
                   threads: int = 1, rounds: list | None = None,
                   faults: FaultPlan | None = None, prefill_chunk: int = PREFILL_CHUNK,
                   moe_tokens: int = MOE_TOKENS, weights: str | None = None,
                   profile: int = 0) -> dict:
    """A decoder layer for a batch on the chip (``compiler.chip.layer_rounds``: attention
    and the MoE layer, ``moe`` sparse, dense or off), every output checked against
    golden; returns the rounds' cycles, counters and traffic. ``schedule``: the steps of
    ``compiler.chip.attention_rounds`` (e.g. an agent loop) instead of prefill/steps.
    ``workload``: a name or a :class:`golden.workloads.WorkloadConfig`; ``progress``: a
    file the simulation appends a line to after every round; ``dump``: a directory that
    receives every job's inputs, golden and RTL outputs (``tb.chip_tb._dump``);
    ``threads``: Verilator threads of the chip's build. ``rounds``: these arguments'
    rounds if the caller has compiled them already (to check that they fit); else they
    are compiled here. Either way they are compiled once: the simulation takes them from
    a file instead of compiling them again. ``faults``: bits of stored words flip during
    the run (:mod:`sim.faults`, on the fault-injection build); the result's ``faults``
    holds the log and counts, ``faults["stopped"]`` the error that ended the run early.
    ``prefill_chunk``: prompt tokens per prefill step; ``moe_tokens``: tokens per MoE
    round (``config`` sized for them by :func:`chip_config`); ``weights``: the MoE
    layer's weights streamed from the memory channels or resident (written by the host before
    the first MoE round, and again where a round wrote over them; None:
    ``compiler.chip.check_weights``'s default); the memory image
    is written once, before the first round. ``profile``: every so many cycles the
    harness notes each running tile's pc, in each round's ``pc_samples``
    (:mod:`sim.profile`)."""
    from compiler.chip import check_weights

    weights = check_weights(weights, moe, config)
    from compiler.chip import layer_rounds
    from golden.workloads import WorkloadConfig

    if rounds is None:
        rounds = layer_rounds(config, workload, layer, batch=batch, prefill=prefill,
                              context=context, steps=steps, placement=placement, seed=seed,
                              moe=moe, schedule=schedule, prefill_chunk=prefill_chunk,
                              moe_tokens=moe_tokens, weights=weights)
    wl = workload.to_json() if isinstance(workload, WorkloadConfig) else workload
    params = {"workload": wl, "layer": layer, "batch": batch, "prefill": prefill,
              "context": context, "steps": steps, "placement": placement, "seed": seed,
              "prefill_chunk": prefill_chunk, "moe": moe, "moe_tokens": moe_tokens,
              "weights": weights,
              "schedule": schedule,
              "progress": str(progress) if progress else None,
              "dump": str(Path(dump).resolve()) if dump else None,
              "faults": faults.to_json() if faults else None, "profile": profile}
    name = wl if isinstance(wl, str) else "custom-" + hashlib.sha1(
        json.dumps(wl, sort_keys=True).encode()).hexdigest()[:8]
    tag = (f"{name}-l{layer}-b{batch}-p{prefill}-c{context}-s{steps}-{placement}"
           f"{'' if moe == 'sparse' else '-moe' + moe}"
           f"{'' if prefill_chunk == PREFILL_CHUNK else f'-k{prefill_chunk}'}"
           f"{'' if moe_tokens == MOE_TOKENS else f'-t{moe_tokens}'}"
           f"{'-resident' if moe == 'sparse' and weights == 'resident' else ''}")
    if faults:
        tag += f"-faults-s{faults.seed}"
    if schedule:
        tag += "-schedule-" + hashlib.sha1(json.dumps(schedule).encode()).hexdigest()[:8]
    with tempfile.NamedTemporaryFile(prefix="serrano-rounds-", suffix=".pickle") as file:
        pickle.dump(rounds, file, protocol=pickle.HIGHEST_PROTOCOL)
        file.flush()
        return simulate_chip(config, "chip_layer", params | {"rounds": file.name}, seed=seed,
                             tag=tag, simulator=simulator, waves=waves, activity=activity,
                             threads=threads, fault_injection=faults is not None)


def chip_config(workload, *, k: int = 2, n: int = 8, max_context: int | None = None,
                vcs: int = 2, moe: str = "sparse", moe_tokens: int = MOE_TOKENS,
                memory_bandwidth=None, kv_rows: int = KV_ROWS) -> ChipConfig:
    """The default design point for a workload: a ``k`` x ``k`` chip of N = ``n`` tiles
    with a 64 Ki-word scratchpad each (at most what the workload needs): working space
    for the MoE layer (:func:`compiler.chip.moe_words`, weights of the tile's experts,
    tokens) or attention, whichever is larger, and the rest for KV pages, reached through
    ``kv_rows`` block-table rows (default 8: 4 jobs per tile, each a K and a V row) of
    ``max_context`` tokens (default 4096 with pages of at least N tokens, else 64, at
    most what the block table's ``spec.config.MAX_TABLE_ENTRIES`` entries map). ``moe``
    "sparse": room for the sparse mapping; "dense": for the larger of the two mappings,
    so that they compare on one build; "off": attention only, no room kept for the MoE
    layer. ``moe_tokens``: the MoE rounds' size the room is kept for. The memory
    channels' stores hold the MoE layer's streamed weights (unless ``moe`` is "off") and
    a far copy of every KV page of their tiles (``ChipConfig.far_page``), in at least
    ``spec.memory.DEFAULT_MEMORY_WORDS`` words, a power of two; ``memory_bandwidth``: their
    bandwidth in all, bytes per cycle (default: the machine balance,
    ``spec.memory.machine_balance_bandwidth``). One build serves every batch, context,
    placement and weight mode that fits it; what does not fit is refused by the compiler
    with the reason."""
    from compiler.chip import check_moe_tokens, moe_memory_words, moe_words
    from compiler.emit import MemoryFull
    from golden.workloads import WorkloadConfig, get_workload
    from sim.tile_run import WORKING_WORDS
    from spec.config import kv_context

    cfg = workload if isinstance(workload, WorkloadConfig) else get_workload(workload)
    moe_tokens = check_moe_tokens(moe_tokens)
    if type(kv_rows) is not int or kv_rows < 2 or kv_rows & (kv_rows - 1):
        raise ValueError(f"--kv-rows {kv_rows!r}: a power of two >= 2 (a job's K and V rows)")
    rows = kv_rows
    max_context = kv_context(rows, cfg.page_size, max_context,
                             4096 if cfg.page_size >= n else 64)
    working = WORKING_WORDS
    if moe != "off":
        try:
            working = max(working, moe_words(cfg, k, n, moe, moe_tokens))
        except ValueError as error:
            more_tiles = isinstance(error, MemoryFull) and error.per_tile \
                and error.memory == "scratchpad"
            mapping = "dense-masked " if moe == "dense" else ""
            raise ValueError(f"the {mapping}MoE layer of {cfg.name} does not fit the tiles of a "
                             f"{k}x{k} chip ({error}); "
                             f"{'use a larger mesh, or ' if more_tiles else ''}"
                             "simulate attention alone") from None
    try:
        tile = TileConfig.for_kv_cache(cfg.head_dim, cfg.v_head_dim, cfg.page_size, n=n,
                                       rows=rows, max_context=max_context,
                                       working_words=working)
    except ValueError as error:
        raise ValueError(f"the tiles of a {k}x{k} chip: {error}: use a larger mesh") from None
    config = ChipConfig(k=k, tile=tile, vcs=vcs, memory_bandwidth=memory_bandwidth)
    if not config.memory_nodes:
        return config
    words = config.far_kv_words
    if moe != "off":
        words += moe_memory_words(cfg, k, n, config.memory_nodes, moe_tokens)
    return replace(config, memory_words=max(config.memory_words, 1 << (words - 1).bit_length()))


#: The roofline's bounds, in the order the report names them.
BOUNDS = ("compute", "tile_compute", "memory", "streaming", "injection", "network")


def mesh_links(k: int) -> list[int]:
    """Links from each router of a ``k`` x ``k`` mesh to its neighbours, router
    ``x + k·y`` at (x, y)."""
    return [(x > 0) + (x < k - 1) + (y > 0) + (y < k - 1) for y in range(k) for x in range(k)]


def memory_words(record: dict) -> int:
    """The words a round's programs loaded from and stored into the memory channels (all
    channels)."""
    return sum(record.get("channel_reads") or []) + sum(record.get("channel_writes") or [])


def round_bounds(record: dict, config: ChipConfig) -> dict[str, int]:
    """Lower bounds on one round's cycles (the roofline, docs/chip.md#roofline), from what
    the round did: ``compute``, its useful MACs (a MoE round's sparse-dispatch MACs) at
    the chip's peak of tiles x N² a cycle; ``tile_compute``, the busiest tile's MACs at
    its N² a cycle; ``memory``, the busiest channel's bytes (read and written, one data
    bus) at its share of the channels' bandwidth; ``streaming``, the busiest tile's
    tensor-core operand beats, one a cycle from its scratchpad; ``injection``, the
    busiest memory node's words into the mesh, one flit a cycle; ``network``, the
    busiest router's flits to its neighbours, one a cycle on each of its links."""
    n = config.tile.n
    reads = record.get("channel_reads") or [0]
    moved = [r + w for r, w in zip_longest(reads, record.get("channel_writes") or [],
                                           fillvalue=0)]
    per_channel = config.memory_bytes_per_cycle / max(len(config.memory_nodes), 1)
    sent = record.get("router_link_flits") or [0]
    return {"compute": math.ceil(record.get("macs_sparse", record["macs"])
                                 / (config.tiles * n * n)),
            "tile_compute": math.ceil(max(c["macs"] for c in record["tiles"].values())
                                      / (n * n)),
            "memory": math.ceil(max(moved) * n / per_channel),
            "streaming": max(c["tc_beats"] for c in record["tiles"].values()),
            "injection": max(reads),
            "network": max((math.ceil(f / links) for f, links
                            in zip(sent, mesh_links(config.k), strict=False) if links),
                           default=0)}


def round_energy(record: dict, config: ChipConfig) -> dict[str, float]:
    """One round's energy in pJ by class (:data:`spec.energy.CLASSES`), its counters x
    the energies per access of :mod:`spec.energy`: the tiles' MACs and vector-busy
    cycles (N lanes each), their scratchpad accesses, instruction fetches and
    accumulator entry accesses (a write into each of its copies), the flits
    through routers (each injected flit and each link traversal) and over links, the
    memory channels' bytes."""
    e, n = per_access, config.tile.n
    tiles = record["tiles"].values()
    # A flit's whole width (a 1 x 1 chip has no network and moves none).
    flit_bits = NocConfig(k=max(config.k, 2), payload_bits=payload_bits(n),
                          vcs=config.vcs).flit.size
    links = record.get("link_flits", 0)
    memory_bytes = memory_words(record) * n
    return {
        "compute": sum(c["macs"] * e.MAC_PJ + (c["vec"] + c["gemm_vec"]) * n * e.LANE_PJ
                       for c in tiles),
        "sram": sum(c["spad"] * e.SRAM_PJ_PER_64_BITS * 8 * n / 64
                    + c["fetches"] * e.FETCH_PJ for c in tiles) + accumulator_pj(record, config),
        "network": ((record["flits"] + links) * e.ROUTER_PJ_PER_64_BITS * flit_bits / 64
                    + links * flit_bits * e.LINK_PJ_PER_BIT),
        "memory": memory_bytes * e.MEMORY_PJ_PER_BYTE,
    }


def accumulator_pj(record: dict, config: ChipConfig) -> float:
    """The part of a round's SRAM energy (:func:`round_energy`) that is the tiles'
    accumulator memories: entries read, and entries written into each copy."""
    e = per_access
    return sum(c["acc_reads"] + c["acc_writes"] * e.ACC_COPIES
               for c in record["tiles"].values()) * e.acc_entry_pj(config.tile.n)


def chip_figures(result: dict, config: ChipConfig) -> dict:
    """The report's figures from a chip run on ``config``, per phase (prefill: every chunk of the
    prompt; decode per step, i.e. per generated token of every sequence): cycles of the
    attention rounds, of the projection rounds (attention's output projection, the MoE
    layer's input, before each MoE round), of the MoE rounds and of the layer (their sum:
    rounds run one after another); utilisation = useful MACs (the attention programs' GEMMs,
    the other rounds' sparse-dispatch MACs) / (tiles x N² x cycles); phase shares summed
    over the tiles; the share of the MoE rounds' tile-cycles spent waiting on the network;
    bytes loaded from and stored into the memory channels (of them,
    ``memory_handoff_bytes``: attention outputs an attention round stored and a later MoE
    round of its step loaded); bytes the host wrote into the tiles before the rounds
    (``host_{program,scratchpad,kv}_bytes``, ``host_bytes``; of the scratchpad words,
    ``host_attention_bytes`` are attention outputs an earlier round computed, written back
    where the attention round did not hand them over; of the KV appends,
    ``host_kv_setup_bytes`` are of tokens older than the step's own: a context the run
    starts from) and read back after them (``host_output_bytes``), the host port's cycles
    for both (``host_cycles``, outside the rounds' cycles) and the phase's cycles with them
    (``..._with_host``); the roofline (:func:`round_bounds` summed over the phase's rounds,
    which run one after another) and the phase's cycles over its largest bound
    (``memory_bound_ratio``); for a prefill whose MoE rounds stream weights, the tokens per
    prefill step at which its MoE rounds' compute bound would reach their memory bound
    (``crossover_tokens``: the same weights loaded once a step, the MACs growing with the
    tokens); the access-energy model's pJ by class (:func:`round_energy`) and per token
    (decode: per sequence of the step; prefill: per prompt token), and the host port's
    transfers' energy beside them (``energy_host_pj``, ``energy_per_token_with_host_pj``);
    the programs the host wrote once before the first round
    (``chip__host__programs_once_{bytes,cycles}``, outside every phase) and the memory image
    it wrote then (``chip__host__memory_once_{bytes,cycles}``: the MoE layer's streamed
    weights); network flits; simulation speed (cycles over the rounds' wall time)."""
    k, n = config.k, config.tile.n
    tiles = k * k
    rounds = result["rounds"]
    out: dict = {"outputs": sum(r["outputs"] for r in rounds)}
    for phase, kinds in (("prefill", ("prefill", "extend")), ("decode", ("decode",))):
        attn = [r for r in rounds if r["phase"] in kinds]
        proj = [r for r in rounds if r["phase"] in [f"{kind}-proj" for kind in kinds]]
        moe = [r for r in rounds if r["phase"] in [f"{kind}-moe" for kind in kinds]]
        layer = attn + proj + moe
        if not attn:
            continue
        # A prompt's chunks (extend steps) make one prefill; decode is per step.
        steps = 1 if phase == "prefill" else len({tuple(r["contexts"]) for r in attn})
        attn_cycles = sum(r["cycles"] for r in attn) // steps
        proj_cycles = sum(r["cycles"] for r in proj) // steps
        moe_cycles = sum(r["cycles"] for r in moe) // steps
        cycles = attn_cycles + proj_cycles + moe_cycles
        # Useful work: a MoE round's sparse-dispatch MACs (the router and each token's
        # top-k experts; the projection's), not what the tiles executed besides.
        macs = sum(r.get("macs_sparse", r["macs"]) for r in layer) // steps
        phases: dict[str, int] = {}
        for r in layer:
            for counters in r["tiles"].values():
                for key, value in counters.items():
                    phases[key] = phases.get(key, 0) + value
        name = "cycles" if phase == "prefill" else "cycles_per_token"
        out[f"chip__{phase}__{name}"] = cycles
        out[f"chip__{phase}__attention_cycles"] = attn_cycles
        if proj:
            out[f"chip__{phase}__projection_cycles"] = proj_cycles
        if moe:
            out[f"chip__{phase}__moe_cycles"] = moe_cycles
            # Tile-cycles of the MoE rounds spent held by a WAIT with no engine busy
            # (only arriving words release it): waiting on the network.
            waited = sum(c["wait"] for r in moe for c in r["tiles"].values())
            out[f"chip__{phase}__moe_network_wait_share"] = round(
                waited / max(sum(r["cycles"] * tiles for r in moe), 1), 4)
        # Bytes the programs loaded from the memory channels (streamed weights, far KV)
        # and stored into them (attention outputs for a later projection round, which loads
        # each word once).
        memory = sum(map(memory_words, layer)) * n // steps
        out[f"chip__{phase}__memory_handoff_bytes"] = 2 * sum(
            sum(r.get("channel_writes") or []) for r in attn) * n // steps
        # Bytes the host wrote into the tiles before the phase's rounds (program words,
        # scratchpad words: tokens, constants, resident weights; words appended to KV
        # pages, far placement's into the memory channels) and read back after them
        # (outputs), and the cycles for them (measured; the tiles are idle meanwhile):
        # the rounds' cycles leave them out, ``{name}_with_host`` adds them.
        for kind, size in (("program", INSTRUCTION_BITS // 8), ("scratchpad", n),
                           ("attention", n), ("kv", n), ("kv_setup", n), ("output", n)):
            out[f"chip__{phase}__host_{kind}_bytes"] = sum(
                r.get("host_words", {}).get(kind, 0) for r in layer) * size // steps
        out[f"chip__{phase}__host_bytes"] = sum(
            out[f"chip__{phase}__host_{kind}_bytes"] for kind in ("program", "scratchpad", "kv"))
        host_cycles = sum(sum(r.get("host_cycles", {}).values()) for r in layer) // steps
        out[f"chip__{phase}__host_cycles"] = host_cycles
        out[f"chip__{phase}__{name}_with_host"] = cycles + host_cycles
        out[f"chip__{phase}__memory_bytes{'' if phase == 'prefill' else '_per_token'}"] = memory
        per_round = {id(r): (round_bounds(r, config), round_energy(r, config))
                     for r in layer}
        bounds = {b: sum(per_round[id(r)][0][b] for r in layer) // steps
                  for b in BOUNDS}
        for b, value in bounds.items():
            out[f"chip__{phase}__{b}_bound_cycles"] = value
        largest = max(BOUNDS, key=bounds.__getitem__)
        out[f"chip__{phase}__largest_bound"] = largest
        out[f"chip__{phase}__memory_bound_ratio"] = round(cycles / max(bounds[largest], 1), 3)
        # Per step (its projection and MoE rounds share the weights they stream, a later
        # one may load none): tokens x memory bound / compute bound, over the steps that
        # streamed.
        by_step: dict[tuple, list] = {}
        for r in proj + moe:
            by_step.setdefault(tuple(r["contexts"]), []).append(r)
        by_step = {key: step for key, step in by_step.items()
                   if any(map(memory_words, step))}
        if phase == "prefill" and by_step:
            out["chip__prefill__crossover_tokens"] = round(sum(
                sum(per_round[id(r)][0]["memory"] for r in step)
                / max(sum(per_round[id(r)][0]["compute"] for r in step), 1)
                * sum(r["tokens"] for r in step if r["phase"].endswith("moe"))
                for step in by_step.values())
                / len(by_step))
        energy = {c: sum(per_round[id(r)][1][c] for r in layer) / steps
                  for c in CLASSES}
        tokens = sum(r["tokens"] for r in attn) / steps  # the tokens the phase adds
        for c, value in energy.items():
            out[f"chip__{phase}__energy_{c}_pj"] = round(value)
        out[f"chip__{phase}__energy_accumulator_pj"] = round(
            sum(accumulator_pj(r, config) for r in layer) / steps)
        out[f"chip__{phase}__energy_pj"] = round(sum(energy.values()))
        out[f"chip__{phase}__energy_per_token_pj"] = round(sum(energy.values()) / tokens)
        # The host port's transfers, written and read back, outside the rounds' energy
        # as their cycles are outside the rounds' cycles: ``..._with_host`` adds them.
        host_pj = (out[f"chip__{phase}__host_bytes"] + out[f"chip__{phase}__host_output_bytes"]
                   ) * per_access.HOST_PJ_PER_BYTE
        out[f"chip__{phase}__energy_host_pj"] = round(host_pj)
        out[f"chip__{phase}__energy_per_token_with_host_pj"] = round(
            (sum(energy.values()) + host_pj) / tokens)
        out[f"chip__{phase}__utilisation"] = round(macs / (tiles * n * n * max(cycles, 1)), 4)
        out[f"chip__{phase}__phases"] = phases
    # Written before the first round, outside the phases.
    for kind, size in (("programs", INSTRUCTION_BITS // 8), ("memory", n)):
        if f"{kind}_once" in result:
            once = result[f"{kind}_once"]
            out[f"chip__host__{kind}_once_bytes"] = once["words"] * size
            out[f"chip__host__{kind}_once_cycles"] = once["host_cycles"]
    out["chip__network__flits"] = sum(r["flits"] for r in rounds)
    out["chip__network__kv_words"] = sum(r["network_words"] for r in rounds
                                         if not r["phase"].endswith(("moe", "proj")))
    out["chip__network__moe_words"] = sum(r["network_words"] for r in rounds
                                          if r["phase"].endswith(("moe", "proj")))
    wall = sum(r["wall_s"] for r in rounds)
    out["chip__sim__cycles_per_s"] = round(sum(r["cycles"] for r in rounds) / wall
                                           if wall else 0.0)
    return out
