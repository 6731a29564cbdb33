"""Attention of a batch of sequences on a k x k chip, under a KV placement policy.

Work is cut into **jobs**: one (sequence, KV head) pair — its group of query heads, its
K and V pages — compiled with the one-tile builders of :mod:`compiler.attention` (a
layer of one KV head). Job ``j`` (sequence-major) runs on tile ``j mod T`` (T tiles);
a tile with several jobs runs them one after another, one program per **round**, each
job keeping its own block-table rows and KV pages, so decode steps append to them.

Placement policies (``PLACEMENTS``: name -> :class:`Placement`, docs/chip.md):

- ``local``: a job's KV pages live on the tile that computes it; the host appends each
  token through the tile's KV port. No KV crosses the network.
- ``striped``: logical page ``p`` of a job computed on tile ``c`` lives on tile
  ``(c + p) mod T``; before the job's program runs, every other owner sends its pages
  across the mesh into the compute tile's page frames (one DMA per page, the last one
  raising :data:`SEM_KV` there) and the job waits for all owners. The host writes the
  pages' words directly (the owner keeps pages of several jobs, not a token stream).

Every round's output is checked against golden by the caller (see tb/chip_tb.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

import numpy as np

from compiler.attention import AttentionLayer, HandOff, build_decode, build_extend
from compiler.hazards import round_writes
from compiler.kv import PageAllocator
from compiler.program import TileProgram, relocated
from golden.attention import (
    attention_decode,
    attention_decode_float,
    attention_prefill,
    attention_prefill_float,
    cosine,
)
from golden.gemm import Saturation
from golden.kv_cache import build_cache
from golden.workloads import Workload, WorkloadConfig, generate, generate_batch, get_workload
from rtl.scratchpad import KvOp
from spec.config import ChipConfig, ceil_div
from spec.isa import COUNT_FIELD_BITS, MEM_ADDR_BITS, DmaTarget, Opcode, decode, encode

__all__ = ["MAX_MOE_TOKENS", "MOE_MODES", "MOE_TOKENS", "PLACEMENTS", "PREFILL_CHUNK", "SEM_KV",
           "WEIGHT_MODES",
           "ChipRound", "HeldWords", "MoeChain", "Job", "KvCacheFull", "Step", "accuracy",
           "agent_schedule", "attention_rounds", "batch_workloads", "check_moe_tokens",
           "changed", "chunked", "contexts", "first_memory", "first_programs", "layer_rounds",
           "moe_round", "moe_words", "place_programs", "round_kind"]

#: The phases of a schedule step (see :data:`Step`).
PHASES = ("prefill", "extend", "decode")
#: Tokens per MoE round by default (more tokens take several rounds). Larger rounds
#: stream each expert's weights once for more tokens but need larger receive buffers on
#: every tile, so fewer KV pages (``--moe-tokens``).
MOE_TOKENS = 32
#: A bound on the option: a round the tiles cannot hold is refused by the compiler
#: with the reason well before this.
MAX_MOE_TOKENS = 1024
#: Prompt tokens per prefill step: a longer prompt is prefilled in chunks, each an
#: extend step over the cache the chunks before it filled (chunked prefill), so one
#: round's queries, outputs and program stay the same size whatever the prompt.
PREFILL_CHUNK = 32
#: How a run does the MoE layer: sparse dispatch (compiler.moe_sparse), dense-masked
#: (compiler.moe), or not at all.
MOE_MODES = ("sparse", "dense", "off")
#: Where the MoE layer's weights are (``--weights``): loaded from the memory channels by
#: its programs, or written into the tiles' scratchpads by the host before each round.
WEIGHT_MODES = ("streamed", "resident")
#: The semaphore striped pages raise on their compute tile (the attention programs use
#: semaphores 0..2).
SEM_KV = 15
#: What a decode step's attention outputs raise on the tiles they are handed to.
SEM_HANDOFF = 14


class KvCacheFull(ValueError):
    """A sequence longer than a tile's KV cache holds (refused before simulating)."""


@dataclass
class Job:
    """One (sequence, KV head) attention program on one tile."""

    sequence: int
    kv_head: int
    tile: int
    program: TileProgram
    expected: np.ndarray  # golden output of the job's query heads
    inputs: Workload  # the golden workload the job's inputs, weights and scales come from
    #: The float64 twin of ``expected`` on the same int8 inputs, in real units, and the
    #: scale of ``expected``'s codes.
    reference: np.ndarray | None = None
    out_scale: float = 1.0
    #: Outputs the integer model clamped to int8 while computing ``expected`` (the MoE
    #: layer's intermediate requantisations included).
    saturation: Saturation = field(default_factory=Saturation)
    #: Tokens the step adds to the job's sequence: the host's KV appends of older tokens
    #: set up a context the run starts from (:attr:`TileLoad.kv_setup`).
    new_tokens: int = 0


@dataclass
class TileLoad:
    """What the host gives one tile before a round: program words, scratchpad words,
    KV requests (``kv_setup`` of its APPENDs are of tokens older than the step's own: a
    context the run starts from, which no earlier round appended). ``dispatched``: for
    a program whose work depends on data (registers, loops, indexed DMA), the GEMM, VEC
    and DMA operations it dispatches at run time, as the chip's functional model ran it
    (registers added, an IDMA's rows as DMAs); ``None`` when its instructions say it.
    ``looped``: instructions its loops run beyond the program's length (what the
    simulation's time limit allows for)."""

    instructions: list[int]
    spad_writes: dict[int, int]
    kv_requests: list[dict]
    dispatched: list[tuple[Opcode, dict]] | None = None
    looped: int = 0
    #: Where the program sits in the instruction memory (:func:`place_programs`).
    base: int = 0
    #: The tile's program before this one ends with a HALT naming ``base``, where the
    #: tile starts next: no SKIP at pc 0 to write (:meth:`image`).
    entered: bool = False
    kv_setup: int = 0
    #: The scratchpad words that hold attention outputs an earlier round computed, the
    #: host writing them back (a step of several MoE rounds: no hand-off on chip).
    attention_words: range = range(0)

    def image(self) -> dict[int, int]:
        """The instruction memory's words the round needs, {pc: word}: the program at
        ``base`` (its LOOP and SKIP targets moved with it) and, when ``base`` > 0 and
        no HALT before it names ``base`` (``entered``), a SKIP at pc 0 to it
        (registers start at 0, so r0 >= r0 always jumps)."""
        words = dict(enumerate(relocated(self.instructions, self.base), self.base))
        if self.base and not self.entered:
            return {0: encode(Opcode.SKIP, ra=0, rb=0, target=self.base), **words}
        return words


@dataclass
class ChipRound:
    """One run of every busy tile together (``phase`` prefill, extend or decode)."""

    phase: str
    contexts: tuple[int, ...]
    loads: dict[int, TileLoad]
    jobs: list[Job]
    #: Scratchpad words moved across the network in this round (striped KV pages).
    network_words: int = 0
    #: MACs of the GEMMs the round's programs dispatch (what the tiles' ``macs``
    #: counters must add up to).
    macs: int = 0
    #: Accumulator entries the round's GEMMs and VECs read and write (what the tiles'
    #: ``acc_reads`` and ``acc_writes`` counters must add up to).
    acc_reads: int = 0
    acc_writes: int = 0
    kv_bytes: int = 0
    summaries: list[dict] = field(default_factory=list)
    #: Tokens the step adds to each sequence (prefill: the context, decode: 1).
    tokens: int = 1
    #: The run's workloads, one per sequence (one layer: the same weights and scales).
    workloads: list[Workload] = field(default_factory=list)
    #: The memory image the round's programs read ({channel: {address: word}}: the MoE
    #: layer's streamed weights, the same in every round, written by the host once,
    #: before the first round) and the words they load (far KV pages included).
    memory: dict[int, dict[int, int]] = field(default_factory=dict)
    memory_words: int = 0
    #: Far placement: the KV pages the round's jobs load, as they are in the memory
    #: channels ({channel: {address: word}}); the host writes the words that changed
    #: since the round before: the step's KV appends, and those of a context the run
    #: starts from (``kv_image_older``: the addresses of tokens older than the step's).
    kv_image: dict[int, dict[int, int]] = field(default_factory=dict)
    kv_image_older: dict[int, set[int]] = field(default_factory=dict)
    #: How the round's jobs hand their outputs to the step's MoE rounds, or None: the
    #: host writes them.
    handoff: HandOffPlan | None = None
    #: Words the round's programs store into the memory channels.
    stored_words: int = 0


def contexts(batch: int, context: int, prefill: int) -> tuple[int, ...]:
    """Each sequence's tokens before its first decode step: the longest has
    ``max(prefill, context)``, the others a little less (a batch of different contexts,
    none below the prompt)."""
    start = max(prefill, context)
    step = max(start - prefill, 0) // (2 * batch) if batch > 1 else 0
    return tuple(start - s * step for s in range(batch))


def _job_slots(chip: ChipConfig, jobs: int) -> int:
    """Rounds a phase step's ``jobs`` take on the chip's tiles: each tile's job slots."""
    return -(-jobs // chip.tiles)


def _pages_per_part(chip: ChipConfig, slots: int, placement: Placement) -> int:
    """KV pages of one part of a tile (a job slot's own, or striped: those it stores)."""
    return chip.tile.num_pages // (slots * placement.parts_per_slot)


class _Tiles:
    """Per-tile KV bookkeeping across rounds: page ranges per job slot, block-table rows,
    what the host already mapped and appended."""

    def __init__(self, chip: ChipConfig, slots: int, placement: Placement):
        cfg = chip.tile
        self.chip, self.placement = chip, placement
        self.per_part = _pages_per_part(chip, slots, placement)
        if self.per_part < 1 or 2 * slots > cfg.kv_sequences:
            raise ValueError(
                f"{slots} jobs per tile need {2 * slots} block-table rows and KV pages for "
                f"each; a tile has kv_sequences = {cfg.kv_sequences} and "
                f"{cfg.num_pages} pages: use a larger mesh or a smaller batch")
        self.mapped: dict[tuple[int, int, int], int] = {}
        self.appended: dict[tuple[int, int], int] = {}
    def allocator(self, slot: int, foreign: bool = False) -> PageAllocator:
        part = slot * self.placement.parts_per_slot + int(foreign)
        lo = part * self.per_part
        return PageAllocator(self.chip.tile, pages=range(lo, lo + self.per_part))

    def evict(self, tile: int, first_row: int) -> list[dict]:
        """RESETs of a job's two block-table rows: the cache forgets its tokens."""
        for row in (first_row, first_row + 1):
            self.mapped = {key: p for key, p in self.mapped.items() if key[:2] != (tile, row)}
        self.appended.pop((tile, first_row), None)
        return [{"op": KvOp.RESET, "seq": row} for row in (first_row, first_row + 1)]

    def kv_requests(self, tile: int, program: TileProgram, k, v,
                    new: int) -> tuple[list[dict], int]:
        """MAPs of new block-table entries and APPENDs of new tokens (local placement),
        and how many of the APPENDs are of tokens before the step's ``new`` last ones."""
        out, setup = [], 0
        for seq, index, phys in program.kv_map:
            known = self.mapped.get((tile, seq, index))
            if known is None:
                self.mapped[tile, seq, index] = phys
                out.append({"op": KvOp.MAP, "seq": seq, "index": index, "phys": phys})
            elif known != phys:
                raise ValueError(f"tile {tile}: block-table entry ({seq}, {index}) moved from "
                                 f"page {known} to {phys} as the context grew")
        key = (tile, program.kv.first_row)
        for t in range(self.appended.get(key, 0), k.shape[0]):
            appends = [{"op": KvOp.APPEND, "seq": s, "word": w, "data": d, "last": int(last)}
                       for s, w, d, last in program.kv.token_appends(k[t], v[t])]
            out += appends
            setup += len(appends) if t < k.shape[0] - new else 0
        self.appended[key] = k.shape[0]
        return out, setup


def _job_layer(layer: AttentionLayer, g: int) -> AttentionLayer:
    """The layer as one KV head's job sees it: its query heads and their sinks."""
    group = layer.group
    sinks = None if layer.sinks is None else layer.sinks[g * group:(g + 1) * group]
    return replace(layer, heads=group, kv_heads=1, sinks=sinks)


def _stripe(chip: ChipConfig, tiles: _Tiles, job: Job, slot: int, loads: dict, sends: dict,
            foreign: dict) -> int:
    """Move a striped job's pages to their owners: the compute tile keeps logical pages
    p with (c + p) mod T = c, the others are written on their owner, which sends them
    back before the round; returns the words sent."""
    cfg, T, c = chip.tile, chip.tiles, job.tile
    kv = job.program.kv
    placement = job.program.kv_words
    words = 0
    for row in range(kv.table.shape[0]):
        for logical in range(kv.pages):
            frame = cfg.page_address(int(kv.table[row, logical]))
            page = {a: w for a, w in placement.items() if frame <= a < frame + cfg.page_words}
            owner = (c + logical) % T
            if owner == c:
                loads[c].spad_writes.update(page)
                continue
            if owner not in foreign:
                foreign[owner] = tiles.allocator(slot, foreign=True)
            try:
                store = cfg.page_address(foreign[owner].allocate(1)[0])
            except ValueError as error:
                raise ValueError(f"striped placement: tile {owner} has no room for the "
                                 f"pages it stores for others ({error})") from None
            loads.setdefault(owner, TileLoad([], {}, []))
            loads[owner].spad_writes.update({store + a - frame: w for a, w in page.items()})
            sends.setdefault(owner, []).append((store, frame, c))
            words += cfg.page_words
    return words


def _striped_programs(chip: ChipConfig, loads: dict[int, TileLoad], sends: dict) -> None:
    """Each tile: its DMAs of stored pages (the last one per destination raising
    SEM_KV there), a WAIT for every owner of its own job's pages, then its job."""
    cfg = chip.tile
    waits: dict[int, int] = {}
    for owner, pages in sends.items():
        if not loads[owner].instructions:  # an owner without a job of its own
            loads[owner].instructions = [encode(Opcode.HALT)]
        dmas = []
        last = {dst: i for i, (_, _, dst) in enumerate(pages)}
        for i, (store, frame, dst) in enumerate(pages):
            signal = last[dst] == i
            dmas.append(encode(Opcode.DMA, src=store, dst=frame, length=cfg.page_words,
                               tiles=chip.mask(dst), remote_signal=int(signal),
                               remote_semaphore=SEM_KV if signal else 0))
        for dst in last:
            waits[dst] = waits.get(dst, 0) + 1
        loads[owner].instructions = dmas + relocated(loads[owner].instructions, len(dmas))
    for tile, load in loads.items():
        if waits.get(tile):
            body = load.instructions
            dma_count = len(sends.get(tile, []))
            load.instructions = (body[:dma_count]
                                 + [encode(Opcode.WAIT, semaphore=SEM_KV, count=waits[tile])]
                                 + relocated(body[dma_count:], 1))
        if len(load.instructions) > cfg.program_depth:
            raise ValueError(f"tile {tile}: {len(load.instructions)} instructions (striped "
                             f"page sends included) exceed program_depth {cfg.program_depth}")


class Placement:
    """Where a round's jobs keep their KV pages: how a tile's pages are split, what each
    job's pages add to the round (:meth:`place`), what the round's programs gain after
    every job is placed (:meth:`finish`)."""

    name = ""
    #: KV page ranges per job slot of a tile (its own; striped: and those it stores).
    parts_per_slot = 1

    def place(self, chip: ChipConfig, tiles: _Tiles, job: Job, slot: int, evict: bool,
              k: np.ndarray, v: np.ndarray, rnd: _RoundBuild) -> None:
        raise NotImplementedError

    def finish(self, chip: ChipConfig, rnd: _RoundBuild) -> None:
        """Nothing to add unless the policy moves pages."""


class LocalPlacement(Placement):
    """A job's KV pages live on the tile that computes it; the host appends each token
    through the tile's KV port (RESETs first when the cache is evicted)."""

    name = "local"

    def place(self, chip, tiles, job, slot, evict, k, v, rnd) -> None:
        load = rnd.loads[job.tile]
        if evict:
            load.kv_requests += tiles.evict(job.tile, job.program.kv.first_row)
        requests, setup = tiles.kv_requests(job.tile, job.program, k, v, job.new_tokens)
        load.kv_requests += requests
        load.kv_setup += setup


class StripedPlacement(Placement):
    """Logical page p of a job on tile c lives on tile (c + p) mod T; the owners send
    them to the compute tile before its job runs (half of each tile's pages hold the
    pages it stores for others)."""

    name = "striped"
    parts_per_slot = 2

    def place(self, chip, tiles, job, slot, evict, k, v, rnd) -> None:
        rnd.network += _stripe(chip, tiles, job, slot, rnd.loads, rnd.sends, rnd.foreign)

    def finish(self, chip, rnd) -> None:
        _striped_programs(chip, rnd.loads, rnd.sends)


class FarPlacement(Placement):
    """A job's KV pages live in the memory channel nearest its tile (written there by
    the host); the job's program first loads every page into its frames, one memory
    DMA a page, and WAITs for the last (one channel answers a tile in order)."""

    name = "far"

    def place(self, chip, tiles, job, slot, evict, k, v, rnd) -> None:
        cfg, c = chip.tile, job.tile
        kv = job.program.kv
        if not chip.memory_nodes:
            raise ValueError("far placement keeps KV pages in the memory channels; this "
                             "chip has none")
        older = k.shape[0] - job.new_tokens  # tokens before the step's own
        for row in range(kv.table.shape[0]):
            for logical in range(kv.pages):
                page = int(kv.table[row, logical])
                frame = cfg.page_address(page)
                channel, base = chip.far_page(c, page)
                image = rnd.kv_image.setdefault(channel, {})
                words = {a - frame: w for a, w in job.program.kv_words.items()
                         if frame <= a < frame + cfg.page_words}
                image.update({base + a: w for a, w in words.items()})
                # Word a of a page holds token a mod page_size of it (compiler.kv).
                rnd.kv_image_older.setdefault(channel, set()).update(
                    base + a for a in words if logical * cfg.page_size + a % cfg.page_size
                    < older)
                rnd.pulls.setdefault(c, []).append((frame, channel, base))
                rnd.memory_words += cfg.page_words

    def finish(self, chip, rnd) -> None:
        for tile, pages in rnd.pulls.items():
            load = rnd.loads[tile]
            dmas = [encode(Opcode.DMA, target=DmaTarget.LOAD, channel=channel, mem_addr=base,
                           dst=frame, length=chip.tile.page_words,
                           remote_signal=int(i == len(pages) - 1),
                           remote_semaphore=SEM_KV if i == len(pages) - 1 else 0)
                    for i, (frame, channel, base) in enumerate(pages)]
            dmas.append(encode(Opcode.WAIT, semaphore=SEM_KV, count=1))
            load.instructions = dmas + relocated(load.instructions, len(dmas))
            if len(load.instructions) > chip.tile.program_depth:
                raise ValueError(f"tile {tile}: {len(load.instructions)} instructions (far "
                                 "page loads included) exceed program_depth "
                                 f"{chip.tile.program_depth}")


PLACEMENTS: dict[str, Placement] = {p.name: p for p in (LocalPlacement(), StripedPlacement(),
                                                        FarPlacement())}


@dataclass
class _RoundBuild:
    """What a round gathers while its jobs are placed: every tile's load, the pages
    owners send (striped), the allocators of pages stored for others, words moved; far:
    the pages as they are in the memory channels, the loads each tile makes and the
    words loaded."""

    loads: dict[int, TileLoad] = field(default_factory=dict)
    sends: dict = field(default_factory=dict)
    foreign: dict = field(default_factory=dict)
    network: int = 0
    kv_image: dict[int, dict[int, int]] = field(default_factory=dict)
    kv_image_older: dict[int, set[int]] = field(default_factory=dict)
    pulls: dict[int, list] = field(default_factory=dict)
    memory_words: int = 0


#: One step of a schedule: the phase, each sequence's context length after it, and
#: whether the KV cache is evicted first (recomputed by a prefill). "prefill": every token
#: of the context from the first; "extend": the tokens past those the cache holds (a
#: chunked prefill over the cached context); "decode": one token.
Step = tuple[str, tuple[int, ...], bool]


def chunked(schedule: list[Step], chunk: int = PREFILL_CHUNK) -> list[Step]:
    """A valid ``schedule`` with every prefill or extend step that adds more than
    ``chunk`` tokens to its sequences split into steps of ``chunk`` (the last takes
    what is left): the first keeps the step's phase and eviction, the others are extend
    steps over what the ones before cached."""
    if chunk < 1:
        raise ValueError(f"the prefill chunk must be >= 1 token, not {chunk}")
    batch = len(schedule[0][1]) if schedule else 0
    out: list[Step] = []
    for (phase, lengths, evict), before in zip(schedule, _cached_contexts(schedule, batch),
                                               strict=True):
        if phase == "prefill":  # every token from the first
            before = (0,) * batch
        new = lengths[0] - before[0]
        if phase == "decode" or new <= chunk:
            out.append((phase, lengths, evict))
            continue
        for i, done in enumerate([*range(chunk, new, chunk), new]):
            out.append((phase if i == 0 else "extend",
                        tuple(b + done for b in before), evict and i == 0))
    return out


def _row_words(chip: ChipConfig, wcfg: WorkloadConfig) -> int:
    """Words of a token's attention outputs, every head's: ⌈H·d_v / N⌉."""
    return ceil_div(wcfg.heads * wcfg.v_head_dim, chip.tile.n)


def handoff_at(chip: ChipConfig, wcfg: WorkloadConfig, tokens: int) -> int:
    """Where a step's attention outputs wait for its MoE round on every tile: ``tokens``
    rows of H·d_v channels, row after row (:func:`_row_words` each), just below the KV
    pages."""
    return chip.tile.kv_start - tokens * _row_words(chip, wcfg)


@dataclass(frozen=True)
class HandOffPlan:
    """How a step's attention jobs hand their outputs to the MoE rounds after them.
    The step's ``rows`` token rows (row s·T + t: token t of the T sequence s adds) are
    ``row`` words each. The first MoE round's ``first`` rows go over the mesh to every
    tile, where that round reads them (from ``at``, :func:`handoff_at`); every later
    round's are stored in the memory channels (``stored``: row -> (channel, its first
    word)), in ``parts``, one list per later round of (tile, channel, first word, its
    first row in the round, rows): that round's tile loads its part and multicasts it
    to the others. A job whose rows are stored writes its heads' outputs just below
    ``at`` in the attention round, a token after another, before it stores them."""

    at: int
    row: int
    first: int
    rows: int
    stored: dict[int, tuple[int, int]] = field(default_factory=dict)
    parts: tuple[tuple[tuple[int, int, int, int, int], ...], ...] = ()

    def meshed(self, sequence: int, tokens: int) -> bool:
        """Whether the rows of ``sequence`` (``tokens`` a sequence) are the first MoE
        round's, handed over the mesh (a sequence's rows are all the first round's or
        all a later one's)."""
        return sequence * tokens < self.first

    def arrivals(self, sequences, tokens: int) -> int:
        """The hand-off DMAs the jobs of ``sequences`` (``tokens`` a sequence) send
        each tile over the mesh: one a token of each meshed sequence's job."""
        return tokens * sum(self.meshed(s, tokens) for s in sequences)


def _handoff_plan(chip: ChipConfig, wcfg: WorkloadConfig, most: int | None, batch: int,
                  tokens: int, stores: bool) -> HandOffPlan | None:
    """How a step that adds ``tokens`` to each of ``batch`` sequences hands its
    attention outputs to its MoE rounds of at most ``most`` tokens
    (:class:`HandOffPlan`), or None, the host writing them: no hand-off (``most``
    None); a prefill's rows of a head further apart than a VEC's row stride
    (``dst_stride``) reaches; or more rows than one round takes where the later rounds'
    may not go through the memory channels (``stores`` False: the MoE weights are
    resident, the host writing those rounds' words anyway), the chip has none, a
    sequence's rows would span the first round and the next (``most`` not a multiple
    of ``tokens``), or the channels have no room for the rows between the streamed
    weights and the far KV pages."""
    if most is None:
        return None
    row, rows = _row_words(chip, wcfg), batch * tokens
    if tokens > 1 and row >= 1 << COUNT_FIELD_BITS:
        return None
    first = min(rows, most)
    if rows > most and (not stores or not chip.memory_nodes or most % tokens):
        return None
    parts, words = [], {}  # each later round's parts; each channel's words so far
    for start in range(most, rows, most):
        count = min(most, rows - start)
        size = ceil_div(count, chip.tiles)
        parts.append([])
        for tile, lo in enumerate(range(0, count, size)):
            channel = chip.tile_channels[tile]
            parts[-1].append((tile, channel, words.get(channel, 0), lo, min(size, count - lo)))
            words[channel] = words.get(channel, 0) + parts[-1][-1][-1] * row
    # Below the far KV pages, above the streamed weights.
    base = {c: chip.memory_words - chip.far_kv_words - n for c, n in words.items()}
    if words and min(base.values()) < moe_memory_words(wcfg, chip.k, chip.tile.n,
                                                       chip.memory_nodes, most):
        return None
    parts = tuple(tuple((tile, c, base[c] + offset, lo, n) for tile, c, offset, lo, n in rnd)
                  for rnd in parts)
    stored = {start + lo + r: (c, word + r * row)
              for start, rnd in zip(range(most, rows, most), parts, strict=True)
              for _, c, word, lo, n in rnd for r in range(n)}
    return HandOffPlan(handoff_at(chip, wcfg, first), row, first, rows, stored, parts)


def attention_rounds(chip: ChipConfig, workload: str | WorkloadConfig, layer: int, *,
                     batch: int = 1,
                     prefill: int = 0, context: int = 0, steps: int = 1,
                     placement: str = "local", seed: int = 1,
                     schedule: list[Step] | None = None,
                     prefill_chunk: int = PREFILL_CHUNK,
                     handoff: int | None = None, stores: bool = False) -> list[ChipRound]:
    """The rounds of a batch: prefill of ``prefill`` prompt tokens per sequence (if > 0),
    then ``steps`` decode steps, sequence s starting from ``contexts(...)[s]`` tokens —
    or the steps of ``schedule`` (see :func:`agent_schedule`); a step that adds more
    than ``prefill_chunk`` tokens is prefilled in chunks (:func:`chunked`). With
    ``handoff`` (the most tokens the MoE round that follows a step takes), the jobs of a
    step that adds at most that many tokens hand their outputs to every tile at
    :func:`handoff_at` (row s·T + t token t of the T each sequence s adds), where that
    round reads them; with ``stores`` too, a step of more tokens hands the later MoE
    rounds' rows over through the memory channels (:class:`HandOffPlan`). Raises
    ValueError for a placement, shape or capacity the chip cannot take."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, not {batch}")
    if schedule is None and (prefill < 0 or context < 0 or steps < 0
                             or (prefill == 0 and steps == 0)):
        raise ValueError("nothing to simulate: give prefill tokens or decode steps")
    wcfg = get_workload(workload) if isinstance(workload, str) else workload
    if not 0 <= layer < len(wcfg.windows):
        raise ValueError(f"workload {wcfg.name} has attention layers 0..{len(wcfg.windows) - 1}")
    if wcfg.page_size != chip.tile.page_size:
        raise ValueError(f"workload {wcfg.name} uses {wcfg.page_size}-token pages; the tiles' "
                         f"KV cache has page_size {chip.tile.page_size}")
    if schedule is None:
        starts = contexts(batch, context, prefill)
        schedule = [("prefill", (prefill,) * batch, False)] if prefill else []
        schedule += [("decode", tuple(c + step + 1 for c in starts), False)
                     for step in range(steps)]
    schedule = chunked(schedule, prefill_chunk)
    cached = _cached_contexts(schedule, batch)
    longest = max((max(lengths) for _, lengths, _ in schedule), default=0)
    capacity = chip.tile.max_pages * chip.tile.page_size
    if longest > capacity:  # refused before any tensor of that length is generated
        raise KvCacheFull(f"a context of {longest} tokens does not fit the KV cache "
                         f"({capacity} tokens per sequence: {chip.tile.max_pages} pages of "
                         f"{chip.tile.page_size})")
    # Each job slot of a tile has its own share of the tile's KV pages (striped: half of
    # it for the pages stored for others); refused before any tensor is generated.
    slots = _job_slots(chip, batch * wcfg.kv_heads)
    share = _pages_per_part(chip, slots, PLACEMENTS[placement])
    need = 2 * -(-longest // chip.tile.page_size)
    if 1 <= share < need:
        raise ValueError(f"a context of {longest} tokens needs {need} KV pages for a "
                         f"(sequence, KV head)'s K and V, and a tile's {chip.tile.num_pages} "
                         f"pages leave {share} to each of its jobs ({slots} per tile, "
                         f"{placement} placement): a shorter context, a smaller batch or "
                         "--moe off (no room kept for the MoE layer) fit more")
    batch_ = _Batch(chip, wcfg, layer, batch_workloads(wcfg, batch, max(longest, 1), seed),
                    PLACEMENTS[placement], handoff, stores)
    return [batch_.round(phase, lengths, before, slot, evict)
            for (phase, lengths, evict), before in zip(schedule, cached, strict=True)
            for slot in range(batch_.slots)]


def _cached_contexts(schedule: list[Step], batch: int) -> list[tuple[int, ...]]:
    """What the cache holds before each step of a valid ``schedule`` (the previous
    step's contexts, none if evicted); ValueError for a malformed one."""
    if any(len(lengths) != batch for _, lengths, _ in schedule):
        raise ValueError(f"every schedule step needs {batch} context lengths")
    if any(phase not in PHASES for phase, _, _ in schedule):
        raise ValueError(f"a schedule step's phase is one of {', '.join(PHASES)}")
    if any(phase == "prefill" and len(set(lengths)) != 1 for phase, lengths, _ in schedule):
        raise ValueError("a prefill step prefills every sequence to the same length")
    cached, held = [], (0,) * batch
    for phase, lengths, evict in schedule:
        cached.append((0,) * batch if evict else held)
        held = lengths
        new = {length - before for length, before in zip(lengths, cached[-1], strict=True)}
        if phase == "extend" and (len(new) != 1 or min(new) < 1):
            raise ValueError(f"an extend step from cached contexts {list(cached[-1])} to "
                             f"{list(lengths)}: it adds the same number (>= 1) of tokens "
                             "to every sequence")
    return cached


def _new_tokens(phase: str, length: int, before: int) -> int:
    """Tokens a step of ``phase`` adds to a sequence of ``length`` tokens after it,
    ``before`` cached: a prefill all of them, an extend those past the cache, a decode
    one."""
    return {"prefill": length, "extend": length - before, "decode": 1}[phase]


class _Batch:
    """A batch's attention layer on the chip: its sequences' tensors, the jobs' tiles
    and KV bookkeeping, and one :class:`ChipRound` per (step, job slot)."""

    def __init__(self, chip: ChipConfig, wcfg: WorkloadConfig, layer: int,
                 workloads: list[Workload], placement: Placement, handoff: int | None,
                 stores: bool):
        self.chip, self.wcfg, self.layer, self.placement = chip, wcfg, layer, placement
        self.handoff_tokens, self.stores = handoff, stores
        p = f"attn{layer}."
        self.data = [(wl, wl.tensors[p + "q_prefill"], wl.tensors[p + "k_prefill"],
                      wl.tensors[p + "v_prefill"]) for wl in workloads]
        self.window = wcfg.windows[layer]
        self.full = AttentionLayer.from_workload(workloads[0], layer)
        self.scales = workloads[0].attention_scales(layer)
        self.kvh = wcfg.kv_heads
        # A job's words of a token's outputs: its query heads', side by side.
        self.job_words = self.full.group * ceil_div(self.full.v_head_dim, chip.tile.n)
        self.jobs_total = len(workloads) * self.kvh
        self.slots = _job_slots(chip, self.jobs_total)
        self.tiles = _Tiles(chip, self.slots, placement)

    def round(self, phase: str, lengths: tuple[int, ...], before: tuple[int, ...],
              slot: int, evict: bool) -> ChipRound:
        """Slot ``slot``'s jobs of one step: each tile's load, placed by the policy."""
        T = self.chip.tiles
        build, jobs = _RoundBuild(), []
        tokens = _new_tokens(phase, lengths[0], before[0])
        plan = _handoff_plan(self.chip, self.wcfg, self.handoff_tokens, len(lengths), tokens,
                             self.stores)
        for j in range(slot * T, min((slot + 1) * T, self.jobs_total)):
            s, g = divmod(j, self.kvh)
            job, k, v = self._job(phase, s, g, j % T, lengths[s], before[s], slot, plan)
            jobs.append(job)
            load = build.loads.setdefault(job.tile, TileLoad([], {}, []))
            load.instructions = list(job.program.instructions)
            load.looped = job.program.summary.notes["unrolled"] - len(load.instructions)
            load.spad_writes.update(job.program.spad_writes)
            self.placement.place(self.chip, self.tiles, job, slot, evict, k, v, build)
        self.placement.finish(self.chip, build)
        stored = 0  # words the jobs store for the step's later projection rounds
        if plan is not None:
            self._hand_off(jobs, build.loads, plan, tokens)
            stored = self.job_words * tokens * sum(not plan.meshed(job.sequence, tokens)
                                                   for job in jobs)
        rnd = ChipRound(phase, lengths, build.loads, jobs, build.network, tokens=tokens,
                        workloads=[wl for wl, *_ in self.data], kv_image=build.kv_image,
                        kv_image_older=build.kv_image_older,
                        memory_words=build.memory_words, handoff=plan, stored_words=stored)
        for job in jobs:
            summary = job.program.summary
            rnd.macs += summary.macs
            rnd.acc_reads += summary.acc_reads
            rnd.acc_writes += summary.acc_writes
            rnd.kv_bytes += summary.kv_bytes_unique
            rnd.summaries.append(summary.as_dict())
        return rnd

    def _hand_off(self, jobs: list[Job], loads: dict[int, TileLoad], plan: HandOffPlan,
                  tokens: int) -> None:
        """A tile without a job in a round with hand-off waits for the jobs' outputs
        that go over the mesh, a DMA per job and token of the first MoE round's
        (:class:`compiler.attention.HandOff`), before its HALT."""
        busy = {job.tile for job in jobs}
        count = plan.arrivals([job.sequence for job in jobs], tokens)
        for t in range(self.chip.tiles):
            if t not in busy and count:  # none, or a striped owner's page sends only
                load = loads.setdefault(t, TileLoad([encode(Opcode.HALT)], {}, []))
                load.instructions = load.instructions[:-1] + [
                    encode(Opcode.WAIT, semaphore=SEM_HANDOFF, count=count),
                    encode(Opcode.HALT)]

    def _job(self, phase: str, s: int, g: int, tile: int, length: int, before: int,
             slot: int, plan: HandOffPlan | None) -> tuple[Job, np.ndarray, np.ndarray]:
        """Sequence ``s``'s KV head ``g`` on ``tile``: its program, golden output and
        float64 twin; and its K and V so far. With ``plan``, the outputs go to their
        heads' places in rows s·T .. s·T + T - 1 of the step's hand-off region, and to
        every other tile or, rows of a later projection round, to the memory channels."""
        chip, full, scales, window = self.chip, self.full, self.scales, self.window
        wl, q, k, v = self.data[s]
        jl = _job_layer(full, g)
        heads = slice(g * full.group, (g + 1) * full.group)
        kk, vv = k[:length, g:g + 1], v[:length, g:g + 1]
        sinks = wl.sinks(self.layer)
        sinks = None if sinks is None else sinks[heads]
        saturation = Saturation()
        allocator = self.tiles.allocator(slot)
        tokens = _new_tokens(phase, length, before)
        place = {}
        if plan is not None:
            words = self.job_words
            head = g * words
            # The sequences of the round's other jobs.
            others = [j // self.kvh for j in range(slot * chip.tiles, min(
                (slot + 1) * chip.tiles, self.jobs_total)) if j != s * self.kvh + g]
            # Its stores tile by tile from a different channel, so that the jobs of a
            # round keep every channel busy at once.
            channels = len(chip.memory_nodes)
            stored = {t: (c, word + head) for t in range(tokens)
                      if s * tokens + t in plan.stored
                      for c, word in [plan.stored[s * tokens + t]]}
            stored = dict(sorted(stored.items(),
                                 key=lambda item: ((item[1][0] - tile) % channels, item[0])))
            # Rows the first MoE round reads: in place in the region; rows stored: just
            # below it, the job's heads' words a token.
            out_at, token_words = ((plan.at + s * tokens * plan.row + head, plan.row)
                                   if plan.meshed(s, tokens) else
                                   (plan.at - tokens * words, words))
            place = {"out_at": out_at,
                     "hand_off": HandOff(sum(chip.mask(d) for d in range(chip.tiles)
                                             if d != tile),
                                         SEM_HANDOFF,
                                         plan.arrivals(others, tokens),
                                         (min(out_at, plan.at), chip.tile.kv_start), stored)}
        if phase != "decode":
            first = length - tokens
            if plan is not None:
                place["token_words"] = token_words
            program = build_extend(chip.tile, jl, q[first:length, heads], kk, vv,
                                   allocator=allocator, first_row=2 * slot, **place)
            args = (q[:length, heads], kk, vv, scales)
            expected = attention_prefill(*args, window=window, sinks=sinks,
                                         block_keys=chip.tile.page_size, first=first,
                                         saturation=saturation)
            reference = attention_prefill_float(*args, window=window, sinks=sinks,
                                                first=first)
        else:
            program = build_decode(chip.tile, jl, q[length - 1, heads], kk, vv,
                                   allocator=allocator, first_row=2 * slot, **place)
            cache, table = build_cache([kk], [vv], chip.tile.page_size)
            args = (q[length - 1, heads][None], cache, table, np.array([length]), scales)
            expected = attention_decode(*args, window=window, sinks=sinks,
                                        saturation=saturation)
            reference = attention_decode_float(*args, window=window, sinks=sinks)
        job = Job(s, g, tile, program, expected, wl, reference, scales.out, saturation,
                  tokens)
        return job, kk, vv


def agent_schedule(turns: int, prompt: int, tool: int, answer: int, cache: str) -> list[Step]:
    """An agent loop of one sequence: prefill the ``prompt`` and decode an ``answer``;
    then ``turns - 1`` times append a ``tool`` result to the context and answer again.
    ``cache`` "hit": the KV cache is kept and the tool result is prefilled over it (an
    extend step: its tokens attend to the cached context); "miss": the cache is evicted
    and the whole context is prefilled again."""
    if cache not in ("hit", "miss"):
        raise ValueError(f"cache must be 'hit' or 'miss', not {cache!r}")
    if turns < 1 or prompt < 1 or tool < 1 or answer < 1:
        raise ValueError("an agent loop needs turns, prompt, tool and answer tokens >= 1")
    schedule: list[Step] = [("prefill", (prompt,), False)]
    length = prompt
    for turn in range(turns):
        if turn:
            if cache == "hit":
                schedule.append(("extend", (length + tool,), False))
            else:
                schedule.append(("prefill", (length + tool,), True))
            length += tool
        schedule += [("decode", (length + i + 1,), False) for i in range(answer)]
        length += answer
    return schedule


def check_weights(weights: str | None, moe: str, chip: ChipConfig) -> str:
    """``weights`` one of :data:`WEIGHT_MODES` that the MoE mapping ``moe`` can run on
    ``chip`` (None: streamed for the sparse mapping on a chip with memory channels,
    else resident), or a ValueError."""
    if weights is None:
        return "resident" if moe == "dense" or not chip.memory_nodes else "streamed"
    if weights not in WEIGHT_MODES:
        raise ValueError(f"--weights {weights!r}: one of {', '.join(WEIGHT_MODES)}")
    if weights == "streamed" and moe == "dense":
        raise ValueError("--weights streamed needs --moe sparse (the dense-masked mapping "
                         "keeps its weights resident): add --weights resident")
    if weights == "streamed" and moe != "off" and not chip.memory_nodes:
        raise ValueError("--weights streamed needs memory channels, and a "
                         f"{chip.k}x{chip.k} chip has none: add --weights resident")
    return weights


def check_moe_tokens(tokens) -> int:
    """``tokens`` per MoE round, 1 to :data:`MAX_MOE_TOKENS`, or a ValueError."""
    if type(tokens) is not int or not 1 <= tokens <= MAX_MOE_TOKENS:
        raise ValueError(f"MoE rounds of 1 to {MAX_MOE_TOKENS} tokens, not {tokens!r}")
    return tokens


def _moe_probe(cfg: WorkloadConfig, k: int, n: int, tokens: int) -> tuple:
    """The arguments that compile ``cfg``'s MoE layer for sizing a ``k`` x ``k`` chip of
    N = ``n``: a round of ``tokens`` tokens with the projection, on a tile whose whole
    scratchpad is working space."""
    from compiler.moe import Projection, moe_tile_config

    check_moe_tokens(tokens)
    wl = generate(cfg, moe_tokens=tokens)
    o = np.zeros((tokens, cfg.heads * cfg.v_head_dim), np.int8)
    return (moe_tile_config(n=n), k, wl.moe_weights(), wl.moe_scales(), cfg.top_k,
            wl.tensors["moe.x"], Projection(o, wl.tensors["attn0.w_o"],
                                            wl.projection_scales(0)))


@functools.cache
def moe_words(cfg: WorkloadConfig, k: int, n: int, moe: str = "sparse",
              tokens: int = MOE_TOKENS) -> int:
    """Scratchpad words the MoE layer of ``cfg`` needs on the busiest tile of a ``k`` x
    ``k`` chip at rounds of ``tokens`` tokens (weights of its experts, tokens, partial
    results), compiled on a tile whose whole scratchpad is working space: for ``moe``
    "sparse" the sparse mapping's; for "dense" the larger of the two, so one build runs
    both (a ValueError when the dense-masked mapping does not compile)."""
    from compiler.moe import build_moe
    from compiler.moe_sparse import build_sparse_moe

    if moe not in ("sparse", "dense"):
        raise ValueError(f"MoE words for a sparse or dense mapping, not {moe!r}")
    args = _moe_probe(cfg, k, n, tokens)
    words = [max(build_sparse_moe(*args).summary["scratchpad_words"])]
    if moe == "dense":
        words.append(max(build_moe(*args).summary["scratchpad_words"]))
    return max(words)


@functools.cache
def moe_memory_words(cfg: WorkloadConfig, k: int, n: int, nodes: tuple,
                     tokens: int = MOE_TOKENS) -> int:
    """Words of the largest memory channel's share of the MoE layer's streamed weights
    (each tile's slice of ``W_o``, the router, its experts' weights and SiLU tables, in
    the channel nearest it) on a ``k`` x ``k`` chip of N = ``n`` with channels at
    ``nodes``."""
    from compiler.moe import WeightMemory
    from compiler.moe_sparse import build_sparse_moe

    program = build_sparse_moe(*_moe_probe(cfg, k, n, tokens),
                               WeightMemory(tuple(nodes), 1 << MEM_ADDR_BITS))
    return max(len(image) for image in program.memory.values())


@dataclass
class MoeChain:
    """A step's MoE rounds with streamed weights, run one after another on tiles that
    keep their words: each round after the first loads only the routed experts no
    earlier one loaded (``compiler.moe_sparse.StepRound``); ``rounds``: how many. Keeps
    the chain's functional model between rounds."""

    rounds: int
    index: int = 0
    loaded: frozenset[int] = frozenset()
    model: object = None

    def next_round(self):
        """The next round's place in the chain."""
        from compiler.moe_sparse import StepRound

        if self.index >= self.rounds:
            raise ValueError(f"a chain of {self.rounds} rounds has no round {self.index + 1}")
        return StepRound(self.index, self.index == self.rounds - 1, self.loaded)

    def ran(self, model, load: np.ndarray) -> None:
        """The round ran on ``model``; ``load``, its tokens per routed expert."""
        self.model, self.index = model, self.index + 1
        self.loaded |= {int(e) for e in np.flatnonzero(load)}


@dataclass
class _MoeOutput:
    """The MoE program as a job's program: output words on the home tile and a reader."""

    output_words: list[int]
    read_output: object
    summary: dict


def moe_round(chip: ChipConfig, wl: Workload, phase: str, contexts_: tuple[int, ...],
              x: np.ndarray, o: np.ndarray | None = None, layer: int = 0,
              dispatch: str = "sparse", weight_mode: str | None = None,
              chain: MoeChain | None = None, handoff: int | None = None,
              fetch: tuple | None = None) -> list[ChipRound]:
    """The MoE layer of ``wl`` (its weights and scales) on ``x`` (T, hidden) int8: one
    round, every tile busy (experts round-robin), the output on the home tile checked
    against ``golden.moe.moe_layer``. With ``o`` (T, H·d_v), the attention outputs of
    the same tokens, ``x`` is the residual stream and the layer's input
    ``clamp(x + rq(o · W_o))`` of attention layer ``layer`` (``golden.decoder``) is
    computed first: with sparse dispatch in a round of its own before (phase
    ``{phase}-proj``, every tile a slice of the channels; its output on the home tile
    checked against ``golden.decoder.project_residual``), dense-masked by the home tile
    at the start of the MoE round. Returns the rounds in order. The host writes every
    tile's other words before the first (attention rounds reuse the working space).
    ``dispatch``: ``sparse``
    (:func:`compiler.moe_sparse.build_sparse_moe`; its programs run on the chip's
    functional model here, which gives the MACs and network words they execute at run
    time, the hardware's counters checked against them) or ``dense``
    (:func:`compiler.moe.build_moe`, static counts). ``weight_mode``: ``streamed``, the
    layer's weights in the chip's memory channels (the round's memory image), loaded
    by the programs (sparse dispatch only); ``resident``, written by the host into the
    tiles with the rest; None, :func:`check_weights`'s default. ``chain``: with streamed
    weights, the step's chain of rounds this one continues (:class:`MoeChain`: its
    programs load only the experts no earlier round of the chain loaded, and its
    functional run starts from the tiles the chain's previous round left).
    ``handoff``: where ``o`` is on every tile when the projection reads it (sparse
    dispatch; :func:`handoff_at`), not written by the host: the attention round left it
    there or, with ``fetch`` (a later round's parts of :attr:`HandOffPlan.parts`), the
    round's tiles load it from the memory channels the attention round stored it in."""
    from compiler.moe import (
        Projection,
        WeightMemory,
        build_moe,
        executed_acc_accesses,
        executed_macs,
        run_on_chip_model,
        run_projection_on_chip_model,
    )
    from compiler.moe_sparse import StepRound, build_sparse_moe
    from golden.decoder import project_residual
    from golden.moe import moe_layer, moe_layer_float, router_logits

    cfg = wl.config
    weights, scales = wl.moe_weights(), wl.moe_scales()
    saturation = Saturation()
    # The projection's requantisations: the projection round's job's with sparse
    # dispatch, the MoE round's dense-masked (where home computes it).
    projected = Saturation() if dispatch == "sparse" else saturation
    projection, residual = None, x
    if o is not None:
        projection = Projection(o, wl.tensors[f"attn{layer}.w_o"], wl.projection_scales(layer),
                                handoff, fetch)
        x = project_residual(o, projection.w_o, residual, projection.scales,
                             saturation=projected)
    if dispatch not in ("sparse", "dense"):
        raise ValueError(f"MoE dispatch {dispatch!r} is not sparse or dense")
    weight_mode = check_weights(weight_mode, dispatch, chip)
    if dispatch == "dense" and handoff is not None:
        raise ValueError("the dense-masked MoE layer reads the attention outputs the host "
                         "writes; no hand-off")
    if dispatch == "dense":
        program = build_moe(chip.tile, chip.k, weights, scales, cfg.top_k, residual,
                            projection)
    else:
        memory = (WeightMemory(chip.memory_nodes, chip.memory_words)
                  if weight_mode == "streamed" else None)
        if chain is not None and memory is None:
            raise ValueError("a chain of MoE rounds shares streamed weights")
        step = StepRound() if chain is None else chain.next_round()
        program = build_sparse_moe(chip.tile, chip.k, weights, scales, cfg.top_k, residual,
                                   projection, memory, step)
    golden = moe_layer(x, weights, scales, cfg.top_k, saturation=saturation)
    s = program.summary
    rounds = []
    if dispatch == "sparse":  # what the programs do at run time, on the functional model
        model = chain.model if chain is not None and step.index else None
        issued = [len(t.issued) for t in model.tiles] if model else [0] * chip.tiles
        sent = sum(model.words_sent) if model else 0
        if program.projection is not None:
            functional, model = run_projection_on_chip_model(program, model)
            if not np.array_equal(functional, x):
                raise AssertionError("the projection programs differ from "
                                     "golden.decoder on the chip's functional model")
            rounds.append(_projection_round(chip, program, phase, contexts_, model, issued,
                                            sent, projection, residual, x, projected, wl))
            issued = [len(t.issued) for t in model.tiles]
            sent = sum(model.words_sent)
        functional, model = run_on_chip_model(program, model, projected=bool(rounds))
        if not np.array_equal(functional, golden.out):
            raise AssertionError("the sparse MoE programs differ from golden.moe on the "
                                 "chip's functional model")
        if chain is not None:
            chain.ran(model, golden.load)
        macs = executed_macs(model, issued)
        acc = executed_acc_accesses(model, issued)
        network_words = sum(model.words_sent) - sent
    else:
        macs, network_words = s["macs_executed"], s["network_words_sent"]
        acc = (sum(p.summary.acc_reads for p in program.tiles),
               sum(p.summary.acc_writes for p in program.tiles))
    # The float64 twin starts from the layer's int8 input (golden.decoder's output, within
    # half an LSB of its own float64 twin unless clamped, which is counted): routing that
    # flips across a near-tie between a rounded and an unrounded input is no arithmetic
    # error of the MoE layer.
    reference = moe_layer_float(x, weights, scales, cfg.top_k).out
    # A tie decides a top-k choice when the k-th and (k+1)-th best scores are equal.
    logits = np.sort(router_logits(x, weights), axis=-1)[:, ::-1]
    tied = cfg.top_k < cfg.experts and bool(
        (logits[:, cfg.top_k - 1] == logits[:, cfg.top_k]).any())
    # With a projection round before it, that round's loads carry the host's words.
    sparse = dispatch == "sparse"
    loads = _tile_loads(chip, program.tiles, handoff, model if sparse else None,
                        issued if sparse else [], {} if rounds else program.attention_words)
    # The job's inputs: the layer's weights and scales with exactly this round's MoE input.
    inputs = Workload(replace(cfg, moe_tokens=x.shape[0]), {**wl.tensors, "moe.x": x},
                      wl.scales)
    job = Job(-1, -1, program.home, _MoeOutput(program.output_words, program.read_output,
                                                program.summary), golden.out, inputs,
              reference, float(scales.out), saturation)
    return [*rounds, ChipRound(
        f"{phase}-moe", contexts_, loads, [job], network_words=network_words, macs=macs,
        acc_reads=acc[0], acc_writes=acc[1], memory=program.memory,
        memory_words=s.get("memory_words", 0),
        summaries=[{"dispatch": dispatch, "weights": weight_mode,
                    "tokens": int(x.shape[0]), "macs_sparse": s["macs_sparse"],
                    "executed_over_sparse": macs / s["macs_sparse"],
                    "expert_load": [int(c) for c in golden.load], "tied": tied,
                    **{name: s[name] for name in ("dispatch_words", "combine_words")
                       if name in s}}])]


def _tile_loads(chip: ChipConfig, programs: list, handoff: int | None, model,
                issued: list[int], attention_words: dict[int, range]) -> dict[int, TileLoad]:
    """Each tile's load of a round of MoE-layer ``programs``: its instructions, the
    host's scratchpad words but the attention outputs an attention round left from
    ``handoff`` up to the KV pages, what the chip's functional ``model`` dispatched from
    its operation ``issued[t]`` on (None: its instructions say it) and
    ``attention_words``, the words of attention outputs the host writes."""
    arrived = range(0) if handoff is None else range(handoff, chip.tile.kv_start)
    return {t: TileLoad(list(p.instructions),
                        {a: w for a, w in p.spad_writes.items() if a not in arrived}, [],
                        None if model is None else
                        [(Opcode[name], f) for name, f in model.tiles[t].issued[issued[t]:]],
                        attention_words=attention_words.get(t, range(0)))
            for t, p in enumerate(programs)}


def _projection_round(chip: ChipConfig, program, phase: str, contexts_: tuple[int, ...],
                      model, issued: list[int], sent: int, projection, residual: np.ndarray,
                      x: np.ndarray, saturation: Saturation, wl: Workload) -> ChipRound:
    """The round of ``program.projection`` (``moe_round``), as the chip's functional
    ``model`` ran it from operation ``issued[t]`` of each tile on, ``sent`` words sent
    before: its loads (the host's words of both rounds but the handed-over attention
    outputs), its job (``x`` on the home tile, against its float64 twin; its
    requantisations' ``saturation``) and its counts."""
    from compiler.moe import ProjectionPrograms, executed_acc_accesses, executed_macs
    from golden.decoder import project_residual_float

    before: ProjectionPrograms = program.projection
    loads = _tile_loads(chip, before.tiles, projection.at, model, issued,
                        program.attention_words)
    reference = project_residual_float(projection.o, projection.w_o, residual,
                                       projection.scales)
    output = _MoeOutput(before.output_words, before.read_output, {})
    job = Job(-1, -1, program.home, output, x, wl, reference,
              float(projection.scales.hidden), saturation)
    acc = executed_acc_accesses(model, issued)
    macs = executed_macs(model, issued)
    return ChipRound(f"{phase}-proj", contexts_, loads, [job],
                     network_words=sum(model.words_sent) - sent, macs=macs,
                     acc_reads=acc[0], acc_writes=acc[1], memory=program.memory,
                     memory_words=before.memory_words,
                     summaries=[{"tokens": int(x.shape[0]),
                                 "macs_sparse": int(x.shape[0]) * projection.o.shape[1]
                                 * projection.w_o.shape[1]}])


@functools.lru_cache(maxsize=4)
def batch_workloads(cfg: WorkloadConfig, batch: int, tokens: int, seed: int) -> list[Workload]:
    """The tensors of a run: ``batch`` sequences of ``tokens`` tokens sharing one layer
    (weights and scales calibrated over every token of the batch,
    :func:`golden.workloads.generate_batch`); sequence s's token t has its q/k/v rows at
    t and its MoE hidden state at ``moe.x[t]``."""
    return generate_batch(cfg, batch, seed=seed, prefill_tokens=tokens,
                          decode_context_lens=(tokens,), moe_tokens=tokens)


def layer_rounds(chip: ChipConfig, workload: str | WorkloadConfig, layer: int, *,
                 batch: int = 1, prefill: int = 0, context: int = 0, steps: int = 1,
                 placement: str = "local", seed: int = 1, moe: str = "sparse",
                 schedule: list[Step] | None = None,
                 prefill_chunk: int = PREFILL_CHUNK,
                 moe_tokens: int = MOE_TOKENS,
                 weights: str | None = None) -> list[ChipRound]:
    """A decoder layer per phase step: the attention rounds of :func:`attention_rounds`,
    each step followed (``moe`` ``sparse`` or ``dense``, not ``off``: the dispatch of
    :func:`moe_round`) by the MoE layer on the tokens the step produced, in
    rounds of ``moe_tokens`` (default :data:`MOE_TOKENS`; sequence after sequence: a
    prefill's every token, a decode step's newest one; the chip must be sized for rounds
    that large, ``sim.chip_run.chip_config``). Every round runs the same layer: one set
    of weights and scales for the whole run. ``schedule``, ``prefill_chunk``: as for
    :func:`attention_rounds`. ``weights``: ``streamed`` (from the memory channels),
    ``resident`` or None (:func:`moe_round`). The
    MoE layer's input of token t of a sequence is that token's attention output,
    projected by the layer's ``W_o`` and added to its residual stream (``moe.x[t]``),
    computed on the home tile at the start of the MoE round (``golden.decoder``). With
    sparse MoE rounds, of a workload whose heads' outputs are whole words, a step's
    attention jobs hand their outputs over (:class:`HandOffPlan`; the host writes them
    where :func:`_handoff_plan` says none): the first MoE round's to every tile and,
    with the weights streamed, the later rounds' into the memory channels, where those
    rounds load them."""
    if moe not in MOE_MODES:
        raise ValueError(f"--moe {moe!r}: one of {', '.join(MOE_MODES)}")
    check_moe_tokens(moe_tokens)
    check_weights(weights, moe, chip)
    # Sparse MoE rounds take the attention outputs from the attention jobs, when a
    # head's outputs are whole words (their places in a row of the MoE round's input).
    wcfg = get_workload(workload) if isinstance(workload, str) else workload
    handoff = (moe_tokens if moe == "sparse" and wcfg.v_head_dim % chip.tile.n == 0
               else None)
    rounds = attention_rounds(chip, workload, layer, batch=batch, prefill=prefill,
                              context=context, steps=steps, placement=placement, seed=seed,
                              schedule=schedule, prefill_chunk=prefill_chunk,
                              handoff=handoff, stores=moe == "sparse" and check_weights(
                                  weights, moe, chip) == "streamed")
    if moe == "off":
        return rounds
    out: list[ChipRound] = []
    step: list[ChipRound] = []
    for i, rnd in enumerate(rounds):
        out.append(rnd)
        step.append(rnd)
        following = rounds[i + 1] if i + 1 < len(rounds) else None
        if following is not None and (following.phase, following.contexts) == \
                (rnd.phase, rnd.contexts):
            continue  # the step has more attention rounds
        # Each sequence's new tokens: residual rows and attention outputs (every KV head's
        # query heads side by side: channel h·d_v + c of query head h).
        residual, attention = [], []
        for s, (wl, length) in enumerate(zip(rnd.workloads, rnd.contexts, strict=True)):
            residual.append(wl.tensors["moe.x"][length - rnd.tokens:length])
            jobs = sorted((job for r in step for job in r.jobs if job.sequence == s),
                          key=lambda job: job.kv_head)
            heads = np.concatenate([job.expected for job in jobs], axis=1)
            attention.append(heads.reshape(heads.shape[0], -1))
        x, o = np.concatenate(residual), np.concatenate(attention)
        # The step's rounds share the weights they stream (one chain).
        rounds_ = ceil_div(x.shape[0], moe_tokens)
        chain = (MoeChain(rounds_) if rounds_ > 1 and moe == "sparse"
                 and check_weights(weights, moe, chip) == "streamed" else None)
        plan = rnd.handoff
        for q, offset in enumerate(range(0, x.shape[0], moe_tokens)):
            at = fetch = None
            if plan is not None:  # the first round's rows came over the mesh
                at = plan.at if q == 0 else handoff_at(chip, wcfg, len(x[offset:][:moe_tokens]))
                fetch = plan.parts[q - 1] if q else None
            out.extend(moe_round(chip, rnd.workloads[0], rnd.phase, rnd.contexts,
                                 x[offset:offset + moe_tokens], o[offset:offset + moe_tokens],
                                 layer, moe, weights, chain, at, fetch))
        step = []
    # One layer's weights: the MoE rounds' images agree (first_memory), kept once, below
    # the KV pages a far placement keeps at the top of the channels.
    image = first_memory(out)
    for r in out:
        if r.memory:
            r.memory = image
    for channel, stored in image.items():
        pages = [a for r in out for a in r.kv_image.get(channel, ())]
        rows = [a for r in out if r.handoff is not None
                for c, a in r.handoff.stored.values() if c == channel]
        for what, words in (("far KV pages", pages), ("handed-over attention outputs", rows)):
            if words and min(words) < len(stored):
                raise ValueError(f"memory channel {channel}: the experts' weights "
                                 f"({len(stored)} words) and the {what} (from word "
                                 f"{min(words)} up) overlap in its {chip.memory_words} words")
    place_programs(chip, out)
    return out


def round_kind(phase: str) -> str:
    """What a round of ``phase`` runs: ``proj`` (a projection round), ``moe`` or ``""``
    (attention)."""
    return phase.rpartition("-")[2] if phase.endswith(("-proj", "-moe")) else ""


def place_programs(chip: ChipConfig, rounds: list[ChipRound]) -> None:
    """Keep the programs resident in each tile's instruction memory, so that the host
    writes each once and then only the words a round changes (a decode step's programs
    differ from the last step's in a few counts): each phase's programs (prefill,
    extend, decode, and each one's projection and MoE rounds) in a region of their own
    from pc 1, as long as the longest program of every phase fits; else the attention
    programs from pc 1, the projection programs after the longest of them and the MoE
    programs after the longest of those (``TileLoad.base``). A tile's
    first program starts with a SKIP at pc 0 to it; each program's HALT names where the
    tile's next one starts (``next``), so the tile runs from there when started again
    (``TileLoad.entered``). When neither fits, or the run has one phase only, every
    program starts at pc 0."""
    longest: dict[str, int] = {}
    for r in rounds:
        size = max((len(load.instructions) for load in r.loads.values()), default=0)
        longest[r.phase] = max(longest.get(r.phase, 0), size)
    if len(longest) < 2:
        return
    if 1 + sum(longest.values()) <= chip.tile.program_depth:
        bases, at = {}, 1
        for phase, size in longest.items():
            bases[phase], at = at, at + size
    else:
        sizes = {k: max(size for phase, size in longest.items() if round_kind(phase) == k)
                 for k in ("", "proj", "moe") if any(round_kind(p) == k for p in longest)}
        if "moe" not in sizes or 1 + sum(sizes.values()) > chip.tile.program_depth:
            return
        starts, at = {}, 1
        for k, size in sizes.items():
            starts[k], at = at, at + size
        bases = {phase: starts[round_kind(phase)] for phase in longest}
    for r in rounds:
        for load in r.loads.values():
            load.base = bases[r.phase]
    before: dict[int, TileLoad] = {}  # each tile's program before the round
    named: dict[tuple[int, int], int] = {}  # (tile, base): what its last HALT there named
    for r in rounds:
        for t, load in r.loads.items():
            if t in before:
                _halt_to(before[t], load.base)
                named[t, before[t].base] = load.base
                load.entered = True
            before[t] = load
    # A tile's last program (nothing starts it again) halts as the one before it in its
    # region did: a word the host need not write again.
    for t, load in before.items():
        if (t, load.base) in named:
            _halt_to(load, named[t, load.base])


def _halt_to(load: TileLoad, pc: int) -> None:
    """Make every HALT of ``load``'s program name ``pc`` as the tile's next start."""
    load.instructions = [encode(Opcode.HALT, next=pc) if decode(word)[0] == Opcode.HALT
                         else word for word in load.instructions]


def first_programs(rounds: list[ChipRound]) -> dict[int, dict[int, int]]:
    """Each tile's instruction-memory words as the host writes them once, before the
    first round: every round's program where :func:`place_programs` put it, the
    earliest round's word where two share a region (a later round rewrites the words
    it changes)."""
    image: dict[int, dict[int, int]] = {}
    for r in rounds:
        for t, load in r.loads.items():
            held = image.setdefault(t, {})
            for pc, word in load.image().items():
                held.setdefault(pc, word)
    return image


def changed(held: dict[int, dict[int, int]], images: dict[int, dict[int, int]]
            ) -> dict[int, dict[int, int]]:
    """Of ``images`` ({place: {address: word}}: a tile's instruction memory or
    scratchpad, a memory channel), the words ``held`` does not hold already, which the
    host writes; noted in ``held`` as held."""
    out = {}
    for place, words in images.items():
        have = held.setdefault(place, {})
        out[place] = {a: w for a, w in words.items() if have.get(a) != w}
        have.update(out[place])
    return out


def first_memory(rounds: list[ChipRound]) -> dict[int, dict[int, int]]:
    """The memory image the host writes once, before the first round: every round's
    (:attr:`ChipRound.memory`, the MoE layer's weights). ValueError if two rounds put
    different words at one address."""
    image: dict[int, dict[int, int]] = {}
    for r in rounds:
        for channel, words in r.memory.items():
            held = image.setdefault(channel, {})
            for address, word in words.items():
                if held.setdefault(address, word) != word:
                    raise ValueError(f"memory channel {channel}, word {address}: two rounds' "
                                     "images differ")
    return image


class HeldWords:
    """The scratchpad words the host wrote that each tile still holds, so that before a
    round the host writes only the words of its loads a tile does not hold already
    (:meth:`load`): constants a step repeats, resident weights no round wrote over, as
    the programs written once. After the round (:meth:`ran`) the words its programs
    wrote over are forgotten (:func:`compiler.hazards.round_writes`: every GEMM, VEC and
    DMA they dispatched, the other tiles' DMAs included), and on a tile given KV
    requests every word of its KV pages."""

    def __init__(self, chip: ChipConfig):
        self.chip = chip
        self.held: dict[int, dict[int, int]] = {}

    def load(self, rnd: ChipRound) -> dict[int, dict[int, int]]:
        """Each tile's words of ``rnd`` that the host writes, noted as held."""
        return changed(self.held, {t: load.spad_writes for t, load in rnd.loads.items()})

    def ran(self, rnd: ChipRound) -> None:
        """Forget the words ``rnd`` wrote over."""
        written = round_writes(rnd.loads, self.chip.k, self.chip.tile.n)
        for t, words in written.items():
            held = self.held.get(t, {})
            for address in words:
                held.pop(address, None)
        for t, load in rnd.loads.items():
            if load.kv_requests:
                held = self.held.get(t, {})
                for address in [a for a in held if a >= self.chip.tile.kv_start]:
                    del held[address]


def accuracy(rounds: list[ChipRound]) -> dict[str, dict]:
    """How close the outputs of ``rounds`` are to float64, per phase (``prefill``,
    ``decode``, ``prefill-moe``, ...): the golden outputs every job is checked against
    bit for bit, against their float64 twins on the same int8 inputs.

    Per phase: ``cosine`` over the phase's whole output tensor (every job of every
    round, in real units), ``cosine_min_output`` the worst single job output (one
    sequence's KV head, or one MoE round), ``max_lsb_error`` the largest |int8 output -
    float output / scale|, ``saturated`` of ``outputs`` the requantised values clamped
    to int8 (attention: the outputs; MoE: its intermediate results too) with their
    ``saturated_share`` and ``sites``."""
    phases: dict[str, list[Job]] = {}
    for rnd in rounds:
        phases.setdefault(rnd.phase, []).extend(rnd.jobs)
    out: dict[str, dict] = {}
    for phase, jobs in phases.items():
        got = np.concatenate([(job.expected * job.out_scale).ravel() for job in jobs])
        ref = np.concatenate([np.asarray(job.reference).ravel() for job in jobs])
        saturation = Saturation()
        for job in jobs:
            saturation.merge(job.saturation)
        out[phase] = {
            "cosine": cosine(got, ref),
            "cosine_min_output": min(cosine(job.expected * job.out_scale, job.reference)
                                     for job in jobs),
            "max_lsb_error": max(float(np.abs(job.expected - job.reference / job.out_scale)
                                       .max()) for job in jobs),
            "saturated": saturation.saturated,
            "outputs": saturation.outputs,
            "saturated_share": saturation.saturated / max(saturation.outputs, 1),
            "sites": saturation.as_dict(),
        }
    return out
