"""Continuous batching on the chip, step by step, priced by a :class:`serve.cost.CostModel`
(docs/serving.md#scheduler).

Requests are sent by a client that keeps at most ``concurrency`` in flight (InferenceX's
concurrency), a conversation's next turn after its previous one completed and its tool
wait. The chip admits a sent request, first come first served, when it can place its
sequence: one job per KV head, each on a tile with a free block-table row pair and the
KV pages of the request's whole context (prompt and answer: nothing is preempted
later). A finished turn of a conversation leaves its KV cache on the chip until the
space is needed (least recently used first); the conversation's next turn reuses it
(a hit: only the new prompt tokens are prefilled, and the previous answer's last
token, whose KV no step has written yet) or, evicted, prefills its whole
prompt again (a miss). A request no empty chip could hold fails, with the reason.

Policies, per step:

- ``rounds``: phase rounds — a prefill step (each prefilling sequence's next chunk of at
  most ``chunk`` tokens) whenever a sequence has prompt left, else a decode step of
  every running sequence;
- ``chunked``: each step decodes every running sequence and prefills at most ``chunk``
  prompt tokens besides (oldest first), as Sarathi-Serve does; priced as one step of
  both kinds of jobs (the RTL runs a round's jobs in one phase, so a mixed step is the
  cost model's composition, not a run of the chip).
- ``split``: a spatial split, as DistServe-style disaggregation does within one chip: the
  first ``prefill_tiles`` tiles prefill (each prefilling sequence's next chunk a step,
  its KV pages there), the others decode; a sequence whose prompt is done has its KV
  cache moved over the mesh to the decode tiles, where its pages were reserved when it
  was admitted. Each step, both groups' attention rounds run at once and one MoE pass
  takes every token (the experts are spread over the whole chip); a turn that hits its
  kept cache prefills its new tokens on the decode tiles, where the cache is. Priced by
  :meth:`serve.cost.CostModel.split_step` and :meth:`~serve.cost.CostModel.move`
  (composed as ``chunked`` is).

A step's time is its cycles over every layer (``windows``: each layer's sliding window or
None) at ``clock_hz``; its energy is shared by its sequences in proportion to their tokens.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from serve.cost import CostModel
from serve.trace import Request

__all__ = ["POLICIES", "Capacity", "Outcome", "serve"]

POLICIES = ("rounds", "chunked", "split")


@dataclass(frozen=True)
class Capacity:
    """What the chip holds: ``tiles`` tiles of ``pages`` KV pages of ``page_size`` tokens
    and ``jobs_per_tile`` block-table row pairs (K and V); ``kv_heads`` jobs a sequence.
    ``parts``: the shares a job's pages take under the placement (striped: 2, its own and
    those stored for others, so a tile keeps half its pages for its own jobs), and
    ``max_tokens`` the most a sequence's block-table row maps; ``page_words`` the words
    of a page (what moving a KV cache sends)."""
    tiles: int
    pages: int
    page_size: int
    jobs_per_tile: int
    kv_heads: int
    parts: int = 1
    max_tokens: int | None = None
    page_words: int = 0

    @property
    def max_sequences(self) -> int:
        return self.tiles * self.jobs_per_tile // self.kv_heads

    def pages_for(self, context: int) -> int:
        """A job's pages (its K and V) for ``context`` tokens."""
        return 2 * -(-context // self.page_size)

    def job_words(self, context: int) -> int:
        """The words of a job's pages for ``context`` tokens (what moving them sends)."""
        return self.pages_for(context) * self.page_words

    @property
    def job_pages(self) -> int:
        """A tile's pages for the jobs placed on it."""
        return self.pages // self.parts

    def max_context(self, sequences: int, tiles: int | None = None) -> int:
        """The longest context each of ``sequences`` sequences can hold at once (on
        ``tiles`` of the tiles, default all)."""
        jobs = -(-sequences * self.kv_heads // (tiles or self.tiles))
        held = (self.job_pages // jobs // 2) * self.page_size
        return held if self.max_tokens is None else min(held, self.max_tokens)


@dataclass
class Outcome:
    """A request's fate: times in seconds (``sent``, ``first``, ``done``), energy in J."""
    request: Request
    sent: float | None = None
    first: float | None = None
    done: float | None = None
    energy_j: float = 0.0
    hit_tokens: int = 0
    failed: str | None = None


@dataclass
class _Sequence:
    outcome: Outcome
    context: int
    prompt_left: int
    generated: int = 0
    jobs: list[tuple[int, int]] = field(default_factory=list)  # (tile, pages)
    # Split: the jobs on the prefill tiles while the prompt is prefilled there.
    staging: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class _Held:
    """A finished turn's KV cache kept for its conversation."""
    context: int
    jobs: list[tuple[int, int]]
    used: float


class _Tiles:
    """Free pages and job slots per tile."""

    def __init__(self, capacity: Capacity):
        self.capacity = capacity
        self.pages = [capacity.job_pages] * capacity.tiles
        self.slots = [capacity.jobs_per_tile] * capacity.tiles

    def place(self, context: int, among: range | None = None
              ) -> list[tuple[int, int]] | None:
        """Jobs of a sequence of ``context`` tokens on the tiles (``among``, default
        all) with the most free pages (a free slot each), or None if it does not fit
        now."""
        need = self.capacity.pages_for(context)
        pages, slots = list(self.pages), list(self.slots)
        jobs = []
        for _ in range(self.capacity.kv_heads):
            tile = max(among or range(len(pages)), key=lambda t: (slots[t] > 0, pages[t]))
            if slots[tile] == 0 or pages[tile] < need:
                return None
            pages[tile] -= need
            slots[tile] -= 1
            jobs.append((tile, need))
        self.pages, self.slots = pages, slots
        return jobs

    def grow(self, jobs: list[tuple[int, int]], context: int) -> list[tuple[int, int]] | None:
        """Held jobs grown in place to ``context`` tokens, or None if a tile lacks pages."""
        need = self.capacity.pages_for(context)
        extra: dict[int, int] = {}
        for tile, pages in jobs:
            extra[tile] = extra.get(tile, 0) + max(need - pages, 0)
        if any(self.pages[t] < more for t, more in extra.items()):
            return None
        for tile, more in extra.items():
            self.pages[tile] -= more
        return [(tile, max(pages, need)) for tile, pages in jobs]

    def free(self, jobs: list[tuple[int, int]]) -> None:
        for tile, pages in jobs:
            self.pages[tile] += pages
            self.slots[tile] += 1


def serve(requests: list[Request], model: CostModel, capacity: Capacity, *,
          concurrency: int, windows: list[int | None], clock_hz: float,
          policy: str = "rounds", chunk: int = 32, prefix_cache: bool = True,
          prefill_tiles: int | None = None) -> list[Outcome]:
    """Serve ``requests`` (module docstring); every request's outcome, in trace order.
    Without ``prefix_cache`` a finished turn's KV cache is freed at once: every later
    turn misses. ``prefill_tiles``: the split policy's prefill tiles (default half)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    if concurrency < 1 or chunk < 1 or clock_hz <= 0 or not windows:
        raise ValueError("concurrency and chunk must be >= 1, the clock > 0, layers >= 1")
    split = policy == "split"
    if prefill_tiles is not None and not split:
        raise ValueError(f"prefill tiles are the split policy's, not {policy}'s")
    if split:
        prefill_tiles = capacity.tiles // 2 if prefill_tiles is None else prefill_tiles
        if not 1 <= prefill_tiles < capacity.tiles:
            raise ValueError(f"prefill tiles: 1 to {capacity.tiles - 1} of the "
                             f"{capacity.tiles} tiles (the others decode), not {prefill_tiles}")
        staging_tiles = range(prefill_tiles)
        decode_tiles = range(prefill_tiles, capacity.tiles)
    layer_windows: dict[int | None, int] = {}
    for w in windows:
        layer_windows[w] = layer_windows.get(w, 0) + 1
    outcomes = [Outcome(r) for r in requests]
    tiles = _Tiles(capacity)
    held: dict[str, _Held] = {}
    # Requests not yet sent, per conversation in order (a lone request is its own).
    queues: dict[str, list[Outcome]] = {}
    for o in outcomes:
        queues.setdefault(o.request.conversation or f"\0{o.request.id}", []).append(o)
    ready: list[tuple[float, int, str]] = []  # (earliest send, trace order, queue)
    order = {id(o): i for i, o in enumerate(outcomes)}
    for name, queue in queues.items():
        heapq.heappush(ready, (queue[0].request.arrival, order[id(queue[0])], name))
    waiting: list[_Sequence] = []  # sent, not admitted
    running: list[_Sequence] = []
    now, in_flight, finished = 0.0, 0, 0

    def finish(seq: _Sequence, failed: str | None = None) -> None:
        nonlocal in_flight, finished
        o = seq.outcome
        o.failed = failed
        o.done = now
        in_flight -= 1
        finished += 1
        name = o.request.conversation or f"\0{o.request.id}"
        queue = queues[name]
        queue.pop(0)
        if failed is None and prefix_cache and o.request.conversation is not None:
            held[o.request.conversation] = _Held(seq.context, seq.jobs, now)
        elif seq.jobs:
            tiles.free(seq.jobs)
        if queue:
            nxt = queue[0].request
            heapq.heappush(ready, (max(nxt.arrival, now + nxt.tool_wait), order[id(queue[0])],
                                   name))

    def admit(seq: _Sequence) -> bool:
        r = seq.outcome.request
        total = r.input + r.output
        entry = held.pop(r.conversation, None) if r.conversation else None
        if entry is not None and r.prefix:
            jobs = tiles.grow(entry.jobs, total)
            while jobs is None and _evict_one(held, tiles):
                jobs = tiles.grow(entry.jobs, total)
            if jobs is not None:
                # The cache holds the previous turn but its last answer token, never fed.
                reused = min(entry.context, r.prefix)
                seq.jobs, seq.context = jobs, reused
                seq.prompt_left = r.input - reused
                seq.outcome.hit_tokens = reused
                return True
        if entry is not None:
            tiles.free(entry.jobs)  # a miss: the cache is rebuilt from the prompt
        staging = []
        if split:  # the prompt's pages on the prefill tiles (held caches are not there)
            staging = tiles.place(r.input, staging_tiles)
            if staging is None:
                return False
        among = decode_tiles if split else None
        jobs = tiles.place(total, among)
        while jobs is None and _evict_one(held, tiles):
            jobs = tiles.place(total, among)
        if jobs is None:
            tiles.free(staging)
            return False
        seq.jobs, seq.staging, seq.context, seq.prompt_left = jobs, staging, 0, r.input
        return True

    def fits(r: Request) -> str | None:
        """Why a request can never be held, or None."""
        if not split:
            most = capacity.max_context(1)
            return (None if most >= r.input + r.output else f"{r.input + r.output} tokens "
                    f"of context: a sequence holds at most {most} on this chip")
        most = capacity.max_context(1, len(decode_tiles))
        if most < r.input + r.output:
            return (f"{r.input + r.output} tokens of context: a sequence holds at most "
                    f"{most} on the {len(decode_tiles)} decode tiles")
        most = capacity.max_context(1, prefill_tiles)
        return (None if most >= r.input else f"a {r.input}-token prompt: the "
                f"{prefill_tiles} prefill tiles hold at most {most} tokens of one")

    while finished < len(outcomes):
        while ready and ready[0][0] <= now and in_flight < concurrency:
            _, _, name = heapq.heappop(ready)
            o = queues[name][0]
            o.sent = now
            in_flight += 1
            seq = _Sequence(o, 0, o.request.input)
            reason = fits(o.request)
            if reason:
                finish(seq, reason)
                continue
            waiting.append(seq)
        while waiting and len(running) < capacity.max_sequences and admit(waiting[0]):
            running.append(waiting.pop(0))
        if not running:
            if waiting:  # room only after held caches go: evict and retry
                if not _evict_one(held, tiles):
                    raise RuntimeError("a request that fits an empty chip cannot be placed")
                continue
            now = max(now, ready[0][0]) if ready else now
            continue
        prefilling = [s for s in running if s.prompt_left]
        decoding = [s for s in running if not s.prompt_left]
        if policy == "rounds":
            step = ([(s, min(chunk, s.prompt_left)) for s in prefilling] if prefilling
                    else [(s, 1) for s in decoding])
        elif policy == "chunked":
            budget, step = chunk, [(s, 1) for s in decoding]
            for s in prefilling:
                if budget:
                    take = min(budget, s.prompt_left)
                    step.append((s, take))
                    budget -= take
        else:
            step = [(s, min(chunk, s.prompt_left) if s.prompt_left else 1) for s in running]
        cycles = energy = 0.0
        jobs = [(t, s.context + t) for s, t in step]
        staged = [(job, s.staging != []) for job, (s, _) in zip(jobs, step, strict=True)]
        for window, count in layer_windows.items():
            if split:
                c, e = model.split_step([job for job, on in staged if on],
                                        [job for job, on in staged if not on],
                                        window, prefill_tiles)
            else:
                c, e = model.step(jobs, window)
            cycles, energy = cycles + count * c, energy + count * e
        now += cycles / clock_hz
        tokens = sum(t for _, t in step)
        moved = []  # split: prompts done on the prefill tiles, their caches to move
        for s, t in step:
            s.outcome.energy_j += energy * 1e-12 * t / tokens
            s.context += t
            if s.prompt_left:
                s.prompt_left -= t
                if s.prompt_left:
                    continue
                s.outcome.first = now  # the prompt's last step yields the first token
                if s.staging:
                    moved.append(s)
            s.generated += 1
            if s.generated == s.outcome.request.output:
                running.remove(s)
                finish(s)
        if moved:  # every layer's KV cache of each, over the mesh, before the next step
            for window, count in layer_windows.items():
                words = [capacity.job_words(s.context if window is None
                                            else min(s.context, window)) for s in moved]
                c, e = model.move([w for w in words for _ in range(capacity.kv_heads)],
                                  prefill_tiles)
                now += count * c / clock_hz
                total = sum(words) or 1
                for s, w in zip(moved, words, strict=True):  # by its words
                    s.outcome.energy_j += count * e * 1e-12 * w / total
            for s in moved:
                tiles.free(s.staging)
                s.staging = []
    for entry in held.values():  # the books: every page and slot is back
        tiles.free(entry.jobs)
    if tiles.pages != [capacity.job_pages] * capacity.tiles or \
            tiles.slots != [capacity.jobs_per_tile] * capacity.tiles:
        raise RuntimeError(f"the scheduler lost KV pages or slots: {tiles.pages} pages, "
                           f"{tiles.slots} slots free at the end")
    return outcomes


def _evict_one(held: dict[str, _Held], tiles: _Tiles) -> bool:
    """Free the least recently used held cache; False if none is left."""
    if not held:
        return False
    name = min(held, key=lambda n: held[n].used)
    tiles.free(held.pop(name).jobs)
    return True
