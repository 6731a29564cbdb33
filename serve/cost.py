"""The cost of a chip step, fitted to rounds the RTL ran (docs/serving.md#cost-model).

A serving run takes thousands of decoder steps over many layers: too many to simulate
cycle by cycle. Each step is priced from the rounds of :func:`compiler.chip.layer_rounds`
it would run, each round by a linear model fitted to rounds the cycle-accurate chip ran
(:func:`calibrate`):

- an **attention round** (one job per tile: a sequence's KV head) by the job with the
  most work — its new tokens ``t`` and ``t`` x its context, the tiles working in parallel —
  for cycles, and by the sums over its jobs for energy; with far placement (KV pages
  loaded from the memory channels every step) also by the busiest channel's contexts
  (the pages its tiles load) for cycles and all the jobs' contexts for energy; with
  streamed weights also by the tokens its jobs store in the memory channels, the rows
  of a step's later projection rounds (:class:`Job`);
- a **MoE round** of ``τ`` tokens by its routing: ``τ``, the routed experts with tokens,
  whether it loads the layer's first weights (``W_o``, the router) and the most experts
  it loads behind one memory channel (expert ``e`` on tile ``e mod tiles``, a tile on
  its nearest channel) for cycles; for energy also the experts it loads and the most
  experts and token-expert pairs on one tile. With streamed weights a step's rounds
  are a chain (``compiler.chip.MoeChain``): the first loads the first weights and its
  experts, each later one only the experts no round before it loaded. A serving step
  does not know its routing: it is priced at these features' means over uniform top-k
  routings (:meth:`Shape.expected_step`), which over a model's tens of layers is what a
  step costs on average.

A step's jobs are placed as the compiler places them (job ``j`` = sequence ``j // kv``,
KV head ``j % kv``, on tile ``j mod tiles``, in rounds of ``tiles`` jobs), its tokens
split into MoE rounds of the chip's size. A round's cycles are the tiles': the host
port's before and after it are kept apart (:func:`kept`) and not priced, being mostly a
calibration run's set-up (docs/serving.md). Energies are the access model's
(:func:`sim.chip_run.round_energy`). The fit is measured on runs left out of it, each
MoE round priced at the routing the run had: p95 over their steps of |predicted -
measured| / measured.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["KEPT", "MOVE_CYCLES_PER_WORD", "MOVE_LATENCY", "CostModel", "Job", "Plan", "Shape",
           "attention_features", "calibrate", "calibration_plan", "fit", "fit_runs", "kept",
           "load_or_calibrate", "round_samples", "source_digest", "step_totals"]

MOE_FEATURES = ("round", "first", "tokens", "experts", "loaded", "experts_per_tile",
                "loaded_per_channel", "pairs_per_tile")
#: The MoE cycle models' features: the experts loaded (their bytes are in the busiest
#: channel's count) and the busiest tile's experts and token-expert pairs left out,
#: which over the few routings a calibration sees overfit (energy keeps every feature).
MOE_CYCLE_FEATURES = ("round", "first", "tokens", "experts", "loaded_per_channel")
#: The source packages whose change can change a round's cycles or energy: saved
#: calibration runs are reused only while their files are the same.
SOURCES = ("spec", "golden", "rtl", "compiler", "sim", "tb")
#: What a calibration keeps of a round record besides its host cycles and energy
#: (:func:`kept`); part of a saved calibration's key.
KEPT = ("phase", "contexts", "tokens", "cycles", "expert_load")
#: Uniform routings drawn to price a MoE round of a given size.
ROUTING_DRAWS = 256
#: Moving a KV cache from tile to tile (the split policy, :meth:`CostModel.move`): the
#: cycles of a DMA stream of w words are MOVE_LATENCY + MOVE_CYCLES_PER_WORD x w, as the
#: 2 x 2 chip streams them (``tb.chip_tb.chip_stream``: 512 words in 617 cycles, 2,048
#: in 2,360, over one hop or two, two pairs of tiles at once no slower; checked by
#: tests/test_serve.py): a word a flit, a packet of 8 words a cycle more.
MOVE_LATENCY, MOVE_CYCLES_PER_WORD = 36, 1.135


class Job(NamedTuple):
    """An attention job: a sequence's KV head over the ``tokens`` the step adds, its
    ``context`` after them; ``stored``, of those tokens, the ones whose rows a later MoE
    round of the step takes through the memory channels, the job storing its heads'
    outputs there (``compiler.chip.HandOffPlan``)."""
    tokens: int
    context: int
    stored: int = 0


@dataclass(frozen=True)
class Shape:
    """What pricing a step needs to know of the chip and the model layer."""
    tiles: int
    kv_heads: int
    experts: int
    top_k: int
    moe_tokens: int
    moe: bool = True
    #: Each tile's memory channel (the nearest), whose bandwidth its expert weights
    #: share; empty on a chip without channels.
    channels: tuple[int, ...] = ()
    #: A step's MoE rounds share the weights they stream (sparse, streamed).
    chained: bool = False
    #: Every job loads its KV pages from its tile's memory channel (far placement).
    kv_from_memory: bool = False
    #: The energy of moving a word of KV cache to another tile (pJ): its scratchpad
    #: read and write and its flit through the network (:meth:`CostModel.move`).
    move_word_pj: float = 0.0

    @property
    def kv_channels(self) -> tuple[int, ...]:
        """The tiles' channels when the jobs load their KV pages from them, else ()."""
        return self.channels if self.kv_from_memory else ()

    def jobs(self, sequences: list[tuple[int, int]], window: int | None = None
             ) -> list[Job]:
        """A step's attention jobs over ``sequences`` (new tokens, context after them):
        one a KV head of each sequence with new tokens, its context capped by the
        ``window`` (None: full). The step's token rows are the sequences' tokens in turn;
        in a chain (:meth:`chain`) the rows past the first MoE round's are stored."""
        chain = self.chain(len(self.moe_rounds(sum(t for t, _ in sequences))))
        out, row = [], 0
        for t, context in sequences:
            stored = min(t, max(0, row + t - self.moe_tokens)) if chain else 0
            row += t
            if t:
                job = Job(t, context if window is None else min(context, window), stored)
                out += [job] * self.kv_heads
        return out

    def attention_rounds(self, jobs: list[Job], tiles: int | None = None
                         ) -> list[list[Job]]:
        """Jobs in rounds of one job per tile (of ``tiles``, default every tile)."""
        size = tiles or self.tiles
        return [jobs[i:i + size] for i in range(0, len(jobs), size)]

    def moe_rounds(self, tokens: int) -> list[int]:
        """Tokens of each MoE round of a step that adds ``tokens`` tokens."""
        if not self.moe:
            return []
        full, last = divmod(tokens, self.moe_tokens)
        return [self.moe_tokens] * full + ([last] if last else [])

    def chain(self, rounds: int) -> bool:
        """Whether a step's ``rounds`` MoE rounds form a chain (two or more, the weights
        streamed: ``compiler.chip.layer_rounds``)."""
        return self.chained and rounds > 1

    def routing_features(self, load: list[int], before: np.ndarray | None = None
                         ) -> list[float]:
        """A MoE round's features (:data:`MOE_FEATURES`) from its routing, tokens per
        routed expert (expert ``e`` on tile ``e mod tiles``); ``before``: in a chain
        after its first round, the experts the rounds before it loaded (a mask)."""
        return self.features(np.asarray(load)[None],
                             None if before is None else before[None])[0].tolist()

    def features(self, loads: np.ndarray, before: np.ndarray | None) -> np.ndarray:
        """:meth:`routing_features` of many routings at once: ``loads`` (routings,
        experts), ``before`` None or a mask of the same shape."""
        used = loads > 0
        loaded = used if before is None else used & ~before
        on_tile = np.eye(self.tiles)[np.arange(self.experts) % self.tiles]  # experts x tiles
        loading = loaded @ on_tile
        per_channel = (loading @ np.eye(max(self.channels) + 1)[list(self.channels)]
                       if self.channels else loading)
        ones = np.ones(len(loads))
        return np.column_stack([
            ones, ones * (before is None), loads.sum(axis=1) / self.top_k, used.sum(axis=1),
            loaded.sum(axis=1), (used @ on_tile).max(axis=1), per_channel.max(axis=1),
            (loads @ on_tile).max(axis=1)])

    def chain_features(self, loads: list[np.ndarray]) -> list[np.ndarray]:
        """:meth:`features` of a step's MoE rounds, in order, each of many routings
        (``loads[r]``: routings x experts): in a chain, a round after the first knows
        the experts the rounds before it loaded, routing by routing."""
        chain = self.chain(len(loads))
        out, before = [], None
        for load in loads:
            out.append(self.features(load, before))
            if chain:
                before = (load > 0) if before is None else before | (load > 0)
        return out

    def step_features(self, loads: list[list[int]]) -> list[list[float]]:
        """The features of a step's MoE rounds from their routings, in order."""
        return [f[0].tolist() for f in self.chain_features([np.asarray(load)[None]
                                                             for load in loads])]

    def expected_step(self, tokens: int) -> list[list[float]]:
        """The mean of :meth:`step_features` over uniform top-k routings of the MoE
        rounds of a step adding ``tokens`` tokens (seeded: the same every call)."""
        sizes = self.moe_rounds(tokens)
        if not self.chain(len(sizes)):
            return [list(_expected_routing(self, t)) for t in sizes]
        return [list(f) for f in _expected_chain(self, tuple(sizes))]


@cache
def _draws(shape: Shape, tokens: int, seed) -> np.ndarray:
    """:data:`ROUTING_DRAWS` uniform top-k routings of ``tokens`` tokens (seeded by
    ``seed``): per draw the tokens per expert."""
    rng = np.random.default_rng(seed)
    draws = np.argsort(rng.random((ROUTING_DRAWS, tokens, shape.experts)), axis=2)
    chosen = draws[:, :, :shape.top_k].reshape(ROUTING_DRAWS, -1)
    return np.array([np.bincount(c, minlength=shape.experts) for c in chosen])


@cache
def _expected_routing(shape: Shape, tokens: int) -> tuple[float, ...]:
    return tuple(shape.features(_draws(shape, tokens, tokens), None).mean(axis=0))


@cache
def _expected_chain(shape: Shape, sizes: tuple[int, ...]) -> tuple[tuple[float, ...], ...]:
    """Each round's mean features in a chain of rounds of ``sizes`` tokens (round r's
    draws seeded by (its size, r): the same whatever follows it)."""
    loads = [_draws(shape, size, (size, r)) for r, size in enumerate(sizes)]
    return tuple(tuple(f.mean(axis=0)) for f in shape.chain_features(loads))


def attention_features(jobs: list[Job], channels: tuple[int, ...] = (), stores: bool = False
                       ) -> tuple[list[float], list[float]]:
    """A round's features for cycles, (1, t, t x context) of its largest job, and for
    energy, (1, Σ t, Σ t x context, jobs) over its jobs. ``channels``, each tile's memory
    channel when the jobs load their KV pages from it (job i on tile i): then also the
    most context behind one channel for cycles and Σ context for energy. ``stores``, a
    chip whose jobs may store their outputs for a later projection round (streamed weights):
    then also the tokens they store, Σ stored for both (the stores are spread over the
    channels)."""
    biggest = max(jobs, key=lambda job: (job.tokens * job.context, job.tokens))
    cycles = [1.0, biggest.tokens, biggest.tokens * biggest.context]
    energy = [1.0, sum(job.tokens for job in jobs),
              sum(job.tokens * job.context for job in jobs), len(jobs)]
    if channels:
        behind = [0] * (max(channels) + 1)
        for tile, job in enumerate(jobs):
            behind[channels[tile]] += job.context
        cycles.append(max(behind))
        energy.append(sum(job.context for job in jobs))
    if stores:
        stored = sum(job.stored for job in jobs)
        cycles.append(stored)
        energy.append(stored)
    return cycles, energy


@dataclass
class CostModel:
    """Linear models of a round's cycles and energy (pJ), by kind; :meth:`step` prices
    one decoder layer's step."""
    shape: Shape
    coefficients: dict[str, list[float]]
    #: How the fit was made: the runs' points and the error on the held-out runs.
    calibration: dict = field(default_factory=dict)

    def step(self, sequences: list[tuple[int, int]], window: int | None = None
             ) -> tuple[float, float]:
        """Cycles and energy (pJ) of one layer's step over ``sequences`` (new tokens,
        context after them) whose attention layer has ``window`` (None: full), its MoE
        rounds at their expected routing."""
        cycles, energy = self.attention(self.shape.jobs(sequences, window))
        c, e = self._moe_step(sum(t for t, _ in sequences))
        return cycles + c, energy + e

    def split_step(self, prefill: list[tuple[int, int]], decode: list[tuple[int, int]],
                   window: int | None, prefill_tiles: int) -> tuple[float, float]:
        """:meth:`step` with the attention jobs of ``prefill`` on the first
        ``prefill_tiles`` tiles and those of ``decode`` on the others, the two groups'
        rounds running at once (the step's attention takes the longer group's time), then
        one MoE pass over every token of both on the whole chip (the prefill's rows
        first)."""
        jobs = self.shape.jobs(prefill + decode, window)
        first = self.shape.kv_heads * sum(1 for t, _ in prefill if t)
        groups = ((jobs[:first], range(prefill_tiles)),
                  (jobs[first:], range(prefill_tiles, self.shape.tiles)))
        cycles = energy = 0.0
        for group, tiles in groups:
            c, e = self.attention(group, tiles)
            cycles, energy = max(cycles, c), energy + e
        c, e = self._moe_step(sum(t for t, _ in prefill + decode))
        return cycles + c, energy + e

    def move(self, job_words: list[int], senders: int) -> tuple[float, float]:
        """Cycles and energy (pJ) of moving KV caches between tiles: jobs of
        ``job_words`` words each, dealt in turn to ``senders`` tiles that send at once to
        tiles of their own (:data:`MOVE_LATENCY`, :data:`MOVE_CYCLES_PER_WORD` for the
        busiest sender; ``Shape.move_word_pj`` a word)."""
        if not job_words:
            return 0.0, 0.0
        busiest = max(sum(job_words[i::senders]) for i in range(senders))
        return (MOVE_LATENCY + MOVE_CYCLES_PER_WORD * busiest,
                sum(job_words) * self.shape.move_word_pj)

    def _moe_step(self, tokens: int) -> tuple[float, float]:
        cycles = energy = 0.0
        for features in self.shape.expected_step(tokens):
            c, e = self.moe(features)
            cycles, energy = cycles + c, energy + e
        return cycles, energy

    def attention(self, jobs: list[Job], tiles: range | None = None
                  ) -> tuple[float, float]:
        """Cycles and energy of a step's attention rounds over ``jobs``, on ``tiles``
        (default every tile; a job a tile a round)."""
        tiles = range(self.shape.tiles) if tiles is None else tiles
        channels = self.shape.kv_channels
        channels = tuple(channels[t] for t in tiles) if channels else ()
        cycles = energy = 0.0
        for rnd in self.shape.attention_rounds(jobs, len(tiles)):
            fc, fe = attention_features(rnd, channels, self.shape.chained)
            cycles += self._apply("attention_cycles", fc)
            energy += self._apply("attention_energy", fe)
        return cycles, energy

    def moe(self, features: list[float]) -> tuple[float, float]:
        """Cycles and energy of a MoE round with these routing features: by the model
        of rounds that load the first weights, or of a chain's later rounds."""
        kind = "moe" if features[1] else "moe_later"
        return self._apply(f"{kind}_cycles", features), self._apply(f"{kind}_energy", features)

    def _apply(self, name: str, features: list[float]) -> float:
        return max(float(np.dot(self.coefficients[name], features)), 0.0)


def kept(record: dict, energy_pj: float) -> dict:
    """What a calibration keeps of a round record (``tb.chip_tb``): :data:`KEPT`, the
    host port's cycles before and after the round as one count (not priced: the
    report gives their share), and its energy."""
    return {**{k: record[k] for k in KEPT if k in record},
            "host_cycles": sum(record["host_cycles"].values()),
            "energy_pj": round(energy_pj)}


def _jobs(shape: Shape, record: dict) -> list[Job]:
    """An attention record's step's jobs."""
    contexts = record["contexts"]
    per_sequence = record["tokens"] // len(contexts)
    return shape.jobs([(per_sequence, context) for context in contexts])


def _steps(rounds: list[dict]) -> list[list[dict]]:
    """A run's rounds by phase step: a step's attention rounds (one per job slot, the
    same phase and contexts) and the MoE rounds after them, each with the cycles, host
    cycles and energy of the projection round before it added (the models price the
    two as one)."""
    steps: list[list[dict]] = []
    previous = None
    folded, before = [], None
    for record in rounds:
        if record["phase"].endswith("proj"):
            before = record
            continue
        if before is not None:
            record = {**record, **{key: record[key] + before[key]
                                   for key in ("cycles", "host_cycles", "energy_pj")}}
            before = None
        folded.append(record)
    for record in folded:
        if not record["phase"].endswith("moe"):
            key = (record["phase"], tuple(record["contexts"]))
            if key != previous:
                steps.append([])
            previous = key
        steps[-1].append(record)
    return steps


def round_samples(shape: Shape, rounds: list[dict]) -> list[tuple]:
    """The fit's samples from a run's kept rounds: per round its kind, features for
    cycles and for energy, measured cycles and energy."""
    out = []
    for step in _steps(rounds):
        slots = shape.attention_rounds(_jobs(shape, step[0]))
        attention = [r for r in step if not r["phase"].endswith("moe")]
        for record, jobs in zip(attention, slots, strict=True):
            fc, fe = attention_features(jobs, shape.kv_channels, shape.chained)
            out.append(("attention", fc, fe, record["cycles"], record["energy_pj"]))
        moe = step[len(attention):]
        for record, f in zip(moe, shape.step_features([r["expert_load"] for r in moe]),
                             strict=True):
            kind = "moe" if f[1] else "moe_later"
            out.append((kind, f, f, record["cycles"], record["energy_pj"]))
    return out


def fit(shape: Shape, samples: list) -> CostModel:
    """Least-squares coefficients of each model from :func:`round_samples`: attention
    rounds; MoE rounds that load the first weights (lone ones, a chain's first); a
    chain's later rounds, which load few experts and are bound by their compute where
    the others wait on memory (without such samples, the first model prices them)."""
    coefficients = {}
    for kind in ("attention", "moe", "moe_later"):
        rows = [s for s in samples if s[0] == kind]
        if kind != "attention" and not shape.moe:
            coefficients[f"{kind}_cycles"] = coefficients[f"{kind}_energy"] = [
                0.0] * len(MOE_FEATURES)
            continue
        if kind == "moe_later" and not rows:
            coefficients["moe_later_cycles"] = coefficients["moe_cycles"]
            coefficients["moe_later_energy"] = coefficients["moe_energy"]
            continue
        if not rows:
            raise ValueError(f"no {kind} rounds to fit the {kind} model to")
        for target, features, index in (("cycles", 1, 3), ("energy", 2, 4)):
            x = np.array([s[features] for s in rows], dtype=float)
            y = np.array([s[index] for s in rows], dtype=float)
            used = (np.isin(MOE_FEATURES, MOE_CYCLE_FEATURES)
                    if kind != "attention" and target == "cycles"
                    else np.ones(x.shape[1], dtype=bool))
            # Scaled columns: features span 1 to ~10^6.
            scale = np.maximum(np.abs(x[:, used]).max(axis=0), 1e-12)
            solution = np.zeros(x.shape[1])
            solution[used] = np.linalg.lstsq(x[:, used] / scale, y, rcond=None)[0] / scale
            coefficients[f"{kind}_{target}"] = [float(c) for c in solution]
    return CostModel(shape, coefficients)


def step_totals(model: CostModel, rounds: list[dict], routing: bool = True
                ) -> list[tuple[float, float, float, float]]:
    """Per step of a run (a phase step's attention rounds and the MoE rounds after
    them), measured and predicted cycles and energy, (cycles, predicted, energy,
    predicted); each MoE round predicted at the routing it had (``routing``) or at the
    expected routing of its size."""
    shape = model.shape
    out = []
    for step in _steps(rounds):
        cycles, pj = model.attention(_jobs(shape, step[0]))
        moe = [r for r in step if r["phase"].endswith("moe")]
        for features in (shape.step_features([r["expert_load"] for r in moe]) if routing
                         else shape.expected_step(sum(r["tokens"] for r in moe))):
            c, e = model.moe(features)
            cycles, pj = cycles + c, pj + e
        out.append((sum(r["cycles"] for r in step), cycles,
                    sum(r["energy_pj"] for r in step), pj))
    return out


@dataclass(frozen=True)
class Plan:
    """One calibration run: a phase step of ``batch`` sequences (``tokens`` prompt tokens
    for a prefill, else one decode step at ``context``); ``held_out`` runs measure the
    fit's error and are not fitted."""
    phase: str
    batch: int
    tokens: int
    held_out: bool = False


def calibration_plan(max_sequences: int, max_context: Callable[[int], int]) -> list[Plan]:
    """Runs that span the batches and contexts a serving run reaches on the chip:
    ``max_context(batch)``, the longest context each batch holds."""
    def decode(batch: int, share: float, held_out: bool = False) -> Plan:
        return Plan("decode", batch, max(16, int(share * max_context(batch))), held_out)
    big = max_sequences
    # The decodes: batches from one to the most the chip holds, a quarter and a half of
    # it between (their routings load from a few experts behind a memory channel to all
    # of them). The prefills: steps of one to eight sequences' 32-token chunks, whose MoE
    # rounds are chains of one to eight (docs/moe_mapping.md#streamed-weights): a chain's
    # later rounds have a model of their own, fitted to the seven of the longest.
    plans = [decode(1, 0.1), decode(2, 0.8), decode(min(4, big), 0.4),
             decode(max(1, big // 4), 0.5), decode(max(1, big // 2), 0.25), decode(big, 0.9),
             decode(big, 0.15), Plan("prefill", 1, 96), Plan("prefill", min(2, big), 64),
             Plan("prefill", min(4, big), 32), Plan("prefill", min(8, big), 32),
             decode(min(3, big), 0.6, True), decode(max(1, big * 3 // 4), 0.3, True),
             Plan("prefill", min(3, big), 32, True)]
    return list(dict.fromkeys(plans))


def calibrate(plans: list[Plan], run: Callable[[Plan], list[dict]],
              progress: Callable[[str], None] = print) -> list[dict]:
    """Run every plan on the chip (``run`` returns its rounds as :func:`kept` keeps
    them); the runs, each its plan, wall time and rounds."""
    runs = []
    for i, plan in enumerate(plans, 1):
        started = time.monotonic()
        progress(f"calibration {i}/{len(plans)}: {plan.phase} of {plan.batch} sequence"
                 f"{'s' * (plan.batch > 1)}, {plan.tokens} "
                 f"{'prompt tokens' if plan.phase == 'prefill' else 'tokens of context'}"
                 f"{' (held out)' if plan.held_out else ''}")
        rounds = run(plan)
        runs.append({**asdict(plan), "wall_s": round(time.monotonic() - started, 1),
                     "rounds": rounds})
    return runs


def fit_runs(shape: Shape, runs: list[dict]) -> CostModel:
    """The model fitted to the runs not held out, with its error on the held-out ones:
    p95 over their steps of |predicted - measured| / measured, cycles and energy, each
    MoE round priced at the routing it had (``error_p95_{cycles,energy}``: the model's
    error) and at the expected routing of its size (``..._expected_routing``: what a
    step priced as serving prices it differs from this one draw of the routing)."""
    model = fit(shape, [s for r in runs if not r["held_out"]
                        for s in round_samples(shape, r["rounds"])])
    errors: dict[str, list[float]] = {}
    for r in runs:
        if r["held_out"]:
            for routing, suffix in ((True, ""), (False, "_expected_routing")):
                for cycles, p_cycles, pj, p_pj in step_totals(model, r["rounds"], routing):
                    errors.setdefault(f"cycles{suffix}", []).append(
                        abs(p_cycles - cycles) / cycles)
                    errors.setdefault(f"energy{suffix}", []).append(abs(p_pj - pj) / pj)
    model.calibration = {
        "runs": [{k: v for k, v in r.items() if k != "rounds"}
                 | {"cycles": sum(x["cycles"] for x in r["rounds"]),
                    "host_cycles": sum(x["host_cycles"] for x in r["rounds"])} for r in runs],
        **{f"error_p95_{kind}": round(float(np.percentile(values, 95)), 4)
           for kind, values in errors.items()},
        "held_out_steps": len(errors.get("cycles", []))}
    return model


def source_digest(root: Path) -> str:
    """A digest of the Python sources of :data:`SOURCES` under ``root``."""
    digest = hashlib.sha256()
    for package in SOURCES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def load_or_calibrate(path: Path, key: dict, shape: Shape,
                      make: Callable[[], list[dict]], fresh: bool = False) -> CostModel:
    """The model fitted to the runs saved at ``path`` if they were made for ``key`` (the
    design point and the sources' digest) and not ``fresh``, else to ``make()``'s, saved
    there once they are all made: a calibration stopped half-way leaves the saved one as
    it was."""
    runs = None
    if path.exists() and not fresh:
        try:
            saved = json.loads(path.read_text())
            if saved.get("key") == key:
                runs = saved["runs"]
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # unreadable: calibrate again
    if runs is None:
        runs = make()
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(json.dumps({"key": key, "runs": runs}) + "\n")
        partial.replace(path)
    return fit_runs(shape, runs)
