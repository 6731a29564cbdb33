"""The MoE layer dispatched sparsely over a k x k chip: each token travels only to the
tiles of its k experts, and each expert computes exactly the tokens it received.

:func:`build_sparse_moe` compiles ``golden.moe.moe_layer`` (as :func:`compiler.moe.build_moe`
does, same arguments and the same :class:`compiler.moe.MoeChipProgram`), bit for bit,
with programs that follow the routing at run time (docs/moe_mapping.md, "Sparse
dispatch"):

- **Projection**, after an attention round, in a round of its own: each tile computes a
  slice of the channels of the layer's input ``clamp(residual + rq(o · W_o))`` and
  multicasts it to the tiles that read whole token rows (home, the shared experts').
- **Home tile** (0, 0) holds the tokens as rows (``hidden / N`` words each). Per block of
  N tokens it computes the router logits, their top k (TOPK over logits made distinct
  and ordered, ``v = (L << 8) + c8``), the gates in top-k order (golden's softmax over
  the k selected logits, ``L = floor(v / 256)``) and two selection masks by the
  vector unit's SiLU table: a token's rank of each expert (j + 1, 0 if not chosen) and
  0/1. From the masks, GEMMs with constant matrices build **index tables** on chip: per
  expert, the rows of its tokens (others the empty entry) and where its results go (row
  ``t + T·j`` of the home's slot buffer for a token's j-th expert), and its token count.
- **Dispatch**: one indexed DMA (IDMA gather) per expert sends exactly its tokens' rows,
  packed, to its tile; the count and the result table go along.
- **Experts** run their SwiGLU FFN in a loop over blocks of at most N received rows, the
  trip count and the rows of the last block from the count (registers, ``WITH``), then
  scatter the results into the home's slot buffers (IDMA scatter over the result table).
  Shared experts see every token (the rows multicast once).
- **Combine** by slices of the channels, on home and every expert tile: per block,
  ``Σ_j diag(G_j) · Y_j`` by GEMMs whose A operand is the diagonal of slot j's gates
  (Q0.15 as a 1-bit and a 14-bit part, the latter as joined 7-bit limbs, multicast by
  home) and whose B operand is slot j's result slices (scattered to each tile by the
  experts); shared experts add ``2^15 · y``; the output slices go to home's rows.

Expert e runs on tile ``e mod k²`` (round-robin, routed then shared). Semaphores: 0 GEMM,
1 VEC, 2 DMA (local completions), 3 inputs arrived (counts and tables, shared experts'
tokens; at the end, the loaded-expert flags a chain's round wrote), 4 results arrived
(home), 5 + i the rows of a tile's i-th routed expert.

With streamed weights, the rounds of one step (a chain, :class:`StepRound`) load each
expert's weights once — the weights sit from each tile's word 0, where no round's size
moves them: the chain's first round loads ``W_o``, the router, the shared experts and
the routed experts its tokens chose; a later round only the routed experts no round
before it loaded, which it finds at run time in per-expert flags the tiles keep between
rounds (two words an expert: one round reads what the one before wrote).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from compiler.emit import Emitter
from compiler.moe import (
    EVERY_TILE,
    G_BITS,
    SILU_ENTRIES,
    MoeChipProgram,
    MoeLayer,
    Projection,
    ProjectionPrograms,
    WeightMemory,
    _bump,
    _column_layout,
    _encoding,
    _ExpertTiles,
    _row_layout,
    _token_layout,
    _Words,
    layer_problems,
    projection_problems,
)
from compiler.program import OutputRows
from golden.decoder import IDENTITY
from golden.exp import NEG_INF
from golden.moe import MoEScales, MoEWeights, router_logits, topk
from golden.vector_model import VectorOpcode as VOP
from spec.config import TileConfig, ceil_div
from spec.isa import (
    MAX_DMA_LENGTH,
    SEMAPHORES,
    DmaTarget,
    Opcode,
    VecDst,
    VecPack,
    entries_per_word,
    tile_bit,
    tile_index,
)

__all__ = ["SEM_INPUTS", "SEM_RESULTS", "SEM_WEIGHTS", "StepRound", "build_sparse_moe"]

#: Arrival semaphores (above the engines' 0, 1, 2): inputs of an expert tile, results on
#: home, then one per routed expert of a tile for its rows; with streamed weights, the
#: last counts the loads of a tile's weights (a tile loads from one channel, whose words
#: arrive in the order they were asked for).
SEM_INPUTS, SEM_RESULTS, FIRST_ROWS_SEM = 3, 4, 5
SEM_WEIGHTS = SEMAPHORES - 1
#: Registers of the expert loop: rows left, rows of this block, the block's first word,
#: N, N - 1, the loop counter, its limit, and the block's first word in a result slice.
R_LEFT, R_ROWS, R_OFF, R_N, R_NM1, R_IT, R_LIM, R_YOFF = range(8)


@dataclass(frozen=True)
class StepRound:
    """A MoE round's place in its step's chain of rounds (the weights streamed, at
    addresses no round's size moves): ``index`` (0: the first), ``last`` (none
    follows), and ``loaded``, the routed experts the chain's earlier rounds loaded: what
    the summary expects this round not to load (its programs find it at run time, in
    the flags)."""

    index: int = 0
    last: bool = True
    loaded: frozenset[int] = frozenset()


def build_sparse_moe(config: TileConfig, k: int, weights: MoEWeights, scales: MoEScales,
                     top_k: int, x: np.ndarray, projection: Projection | None = None,
                     memory: WeightMemory | None = None,
                     step: StepRound = StepRound()) -> MoeChipProgram:
    """Compile ``golden.moe.moe_layer(x, weights, scales, top_k)`` for a ``k`` x ``k``
    chip of ``config`` tiles with sparse dispatch (module docstring); arguments and
    result as :func:`compiler.moe.build_moe`. The output is read from home's rows. With
    ``projection``, the layer's input is computed by programs of a round of their own,
    before this one (``program.projection``, :class:`compiler.moe.ProjectionPrograms`:
    every tile a slice of the channels, the rows then multicast to the tiles that read
    them); the host writes the words of both before the first.
    ``summary``: ``macs_sparse`` (the router, each token's top_k routed experts and the
    shared ones: what the programs execute, plus the table, gating and combine GEMMs
    counted at run time), ``instructions``, ``experts_per_tile``, ``tokens``,
    ``memory_words`` (words the tiles load from the memory channels, the projection
    round's not counted). With ``memory``
    (streamed weights) the router, ``W_o`` and the experts' weights and SiLU tables are
    in the program's memory image: each tile loads its slice of ``W_o`` (home the router
    too) as the projection round starts, and each expert tile the weights of its experts
    that have tokens once their counts are known, all at once, the first expert computing while the
    others' arrive; ``step`` places the round in its step's chain (module docstring): a
    round after the first loads only the routed experts no earlier round of the chain
    loaded, on a chip whose tiles kept the earlier rounds' words.
    ValueError before anything is built if the mesh, the tile, the memory or the shapes
    cannot run it."""
    if step != StepRound() and memory is None:
        raise ValueError("a chain of MoE rounds shares streamed weights: give the memory")
    if step.index < 0 or (step.index == 0 and step.loaded):
        raise ValueError(f"a chain's round {step.index} with experts loaded before it "
                         f"{sorted(step.loaded)}")
    build = _SparseBuild(config, k, MoeLayer.from_golden(weights, scales, top_k), weights,
                         top_k, np.asarray(x), projection, memory, step=step)
    build.place()
    build.emit_home_inputs()
    if projection is not None:
        build.end_projection()
    build.emit_gating()
    build.emit_tables_and_dispatch()
    build.emit_experts()
    build.emit_combine()
    return build.program()


class _SparseBuild(_ExpertTiles):
    """The stages of :func:`build_sparse_moe` and the state they share."""

    def __init__(self, *args, step: StepRound):
        super().__init__(*args)
        self.step = step
        if self.memory is not None and FIRST_ROWS_SEM + max(
                len(self.routed_on(t)) for t in range(self.tiles)) > SEM_WEIGHTS:
            raise ValueError("cannot stream the weights: semaphore "
                             f"{SEM_WEIGHTS} counts their loads, and a tile's routed experts "
                             "need every semaphore above 4")
        self.tw = ceil_div(self.tokens, entries_per_word(self.n))  # an index table's words
        self.meta_words = 1 + self.tw  # per expert: its count, then its result table
        # The router's lanes (and the index tables' rows) hold the routed experts in tile
        # order: a tile's experts' counts and result tables go to it in one DMA.
        self.lanes = sorted(range(self.experts), key=lambda ex: (self.expert_tile[ex], ex))
        self.lane = {ex: p for p, ex in enumerate(self.lanes)}  # an expert's lane
        self.shared_dmas: dict[int, int] = {}  # a tile's shared experts' result DMAs
        self.front_waited: set[int] = set()  # tiles that waited for their first weights
        self.meta_dmas: dict[int, int] = {}  # the DMAs of a tile's experts' metadata
        # The attention outputs an attention round stored, loaded from memory.
        self.handed: dict[int, dict[int, int]] = {}
        self.fetched_words = 0
        self.before: ProjectionPrograms | None = None  # the projection round's programs

    def _check(self, x: np.ndarray) -> None:
        """One ValueError naming every reason the layer cannot run this way."""
        config, layer, top_k = self.config, self.layer, self.top_k
        tokens = x.shape[0]
        problems = layer_problems(config, layer, top_k, tokens)
        if tokens > 126 or tokens * top_k > 256:
            problems.append(f"{tokens} tokens x top_k {top_k}: a sparse round takes at most "
                            "126 tokens and 256 token-expert pairs (index-table rows are "
                            "built as bytes)")
        busiest = max(sum(1 for e in range(layer.experts) if self.expert_tile[e] == t)
                      for t in range(self.tiles))
        if FIRST_ROWS_SEM + busiest > SEMAPHORES:
            problems.append(f"{busiest} routed experts on one tile: each needs a semaphore "
                            f"for its rows, {SEMAPHORES - FIRST_ROWS_SEM} are free")
        if self.projection is not None:
            problems += projection_problems(self.projection, layer.hidden, tokens)
        if problems:
            raise ValueError("cannot map this MoE layer sparsely: " + "; ".join(problems))

    def routed_on(self, t: int) -> list[int]:
        return [e for e in self.experts_on(t) if e < self.experts]

    def _mask(self, tiles) -> int:
        """The tile mask of tiles given by index."""
        return sum(tile_bit(t % self.k, t // self.k) for t in tiles)

    def index_of(self, t: int) -> int:
        """Tile t's index in a tile mask (``spec.isa.tile_index``)."""
        return tile_index(t % self.k, t // self.k)

    # -- scratchpad and accumulator ------------------------------------------------------

    def place(self) -> None:
        config, n, t, hc, home = self.config, self.n, self.tokens, self.hc, self.home
        self.a_bank, self.b_bank = config.banks // 2, 0
        a, b = self.a_bank, self.b_bank
        # Home and every expert tile combine (and project) a slice of the channels, w
        # words of each row; what they exchange sits at the same address on each.
        doers = sorted({home} | set(self.expert_tile))
        self.w = w = ceil_div(hc, len(doers))
        self.slices = {i: (j * w, min(hc, (j + 1) * w)) for j, i in enumerate(doers)
                       if j * w < hc}
        self.words = [_Words(n) for _ in range(self.tiles)]
        # The weights first, from each tile's word 0, where no round's token count moves
        # them: the rounds of a step, whatever their sizes, share them (a chain).
        # Up to the KV pages, or to the attention outputs the attention round left
        # below them (its hand-off).
        at = None if self.projection is None else self.projection.at
        top = config.kv_start if at is None else at
        held = [_bump(0, top, "scratchpad",
                      f"tile {i} ({i % self.k}, {i // self.k})", config.banks)
                for i in range(self.tiles)]
        self.router_addr = held[home].take(self.ec * self.hidden, "router weights", b)
        self._weight_words(home, ("front", home), [
            (self.router_addr, _column_layout(self.weights.router[:, self.lanes], n))])
        if self.projection is not None:
            self.channels = self.attn_out.shape[1]
            self.wo_addr = {}
            for i, (c0, c1) in self.slices.items():
                cols = slice(c0 * n, min(c1 * n, self.hidden))
                self.wo_addr[i] = held[i].take((c1 - c0) * self.channels,
                                               "output projection", b)
                self._weight_words(i, ("front", i), [
                    (self.wo_addr[i], _column_layout(self.w_o[:, cols], n))])
        self.place_expert_weights(held)
        # Two flags a routed expert (its count when a round of a chain loaded it):
        # a round reads one and writes the other.
        self.flags = {ex: held[i].take(2, f"expert{ex} loaded flags")
                      for i in range(self.tiles) for ex in self.routed_on(i)}
        glob = _bump(max(r.end for r in held), top, "scratchpad", EVERY_TILE, config.banks)
        self.xr = glob.take(t * hc, "token rows", a)
        self.meta = glob.take(self.experts * self.meta_words, "counts and result tables")
        self.slot_rows = glob.take(self.top_k * t * w, "result slices by top-k slot", b)
        shared = range(self.experts, self.layer.total)
        self.shared_rows = {s: glob.take(t * w, f"expert{s} result slices", b) for s in shared}
        diag = self.tb * self.top_k * n
        self.d_lo = glob.take(diag, "gate diagonals, low limbs", a)
        self.d_hi = glob.take(diag, "gate diagonals, high limbs", a)
        self.d_top = glob.take(diag, "gate diagonals, bit 14", a)
        self.d_two = glob.take(n, "2 on the diagonal", a)
        self.spad = [_bump(glob.end, top, "scratchpad",
                           f"tile {i} ({i % self.k}, {i // self.k})", config.banks)
                     for i in range(self.tiles)]
        self._place_home()
        self.recv, self.y_rows = {}, {}
        self.place_expert_tiles(self._expert_regions)
        self.out_part = {}
        for i in self.slices:
            self.words[i].put(self.d_two, 2 * np.eye(n, dtype=np.int64))
            if i != home:
                self.out_part[i] = self.spad[i].take(t * self.w, "output slices")
        if self.projection is not None:
            self._place_projection()
        self.check_memory()
        self.plans = [self._acc_plan(i) for i in range(self.tiles)]

    def _place_home(self) -> None:
        n, t, hc, ec, home, top_k = self.n, self.tokens, self.hc, self.ec, self.home, self.top_k
        spad, words, a, b = self.spad[home], self.words[home], self.a_bank, self.b_bank
        if self.projection is None:
            words.put(self.xr, _row_layout(self.x, n))
        a2, b2, self.cb = _encoding(self.experts, t)
        self.enc_a = spad.take(self.tb * 2, "encoding constants", a)
        words.put(self.enc_a, _token_layout(a2, n))
        self.enc_b = spad.take(ec * 2, "encoding constants", b)
        words.put(self.enc_b, _column_layout(b2[:, self.lanes], n))
        # Accumulator constants: zero, -128 (N rows), rank j + 1 and 1 per lane, identity.
        consts = np.zeros((4 * n, n), np.int64)
        consts[1:1 + n] = -128
        consts[1 + n, :top_k] = np.arange(1, top_k + 1)
        consts[2 + n] = 1
        consts[3 + n:3 + 2 * n] = np.eye(n, dtype=np.int64)
        self.const_addr = spad.take(4 * n, "accumulator constants", b)
        words.put(self.const_addr, consts)
        # The masks, transposed: word j·T + t = expert block j of token t.
        self.sel_rank = spad.take(ec * t, "rank mask", a)
        self.sel_one = spad.take(ec * t, "selection mask", a)
        self.ones_col = spad.take(ec, "ones", a)
        words.put(self.ones_col, [np.ones(n, np.int64)] * ec)
        tw2 = ceil_div(2 * t, n)
        self.neg_row = spad.take(tw2, "minus ones", b)
        words.put(self.neg_row, [np.full(n, -1)] * tw2)
        self.ones_tn = spad.take(t, "ones", b)
        words.put(self.ones_tn, [np.ones(n, np.int64)] * t)
        # Per token block, what its tokens' 0/1 and rank masks add to the low and high
        # bytes of their entries (columns 2t and 2t + 1; see emit_tables_and_dispatch).
        self.d_gather, self.d_result, self.d_rank = [], [], []
        for blk, rows in enumerate(self.block_rows):
            first = blk * n + np.arange(rows)
            for name, low, high, out in (("gather", first + 1, 1, self.d_gather),
                                         ("result", first + 1 - t, 1, self.d_result),
                                         ("rank", np.full(rows, t), 0, self.d_rank)):
                d = np.zeros((rows, 2 * rows), np.int64)
                d[np.arange(rows), 2 * np.arange(rows)] = low
                d[np.arange(rows), 2 * np.arange(rows) + 1] = high
                out.append(spad.take(2 * rows, f"{name} table constants", b))
                words.put(out[-1], _column_layout(d, n))
        self.gtab = spad.take(self.experts * self.tw, "gather tables")
        self.out_addr = spad.take(t * hc, "output rows")

    def _place_projection(self) -> None:
        """Each tile with an identity (home and the expert tiles) projects a slice of the
        channels: the attention outputs and its columns of the residual (its columns of
        ``W_o`` are with the weights). The attention outputs are the GEMM's A by blocks
        of N tokens (a column of a block a word); or row after row where the attention
        round handed them over (``Projection.at``; their words are still listed with
        the host's, for a functional model's run of this round alone, or with
        ``Projection.fetch`` in :attr:`MoeChipProgram.handed`, where its parts are in
        memory)."""
        n, t, a, b = self.n, self.tokens, self.a_bank, self.b_bank
        at = self.projection.at
        self.o_addr, self.res_addr = {}, {}
        for i, (c0, c1) in self.slices.items():
            spad, words, w = self.spad[i], self.words[i], c1 - c0
            cols = slice(c0 * n, min(c1 * n, self.hidden))
            if at is None:
                self.o_addr[i] = spad.take(self.tb * self.channels, "attention outputs", a)
                words.put(self.o_addr[i], _token_layout(self.attn_out, n))
            else:
                self.o_addr[i] = at
                if self.projection.fetch is None:
                    words.put(at, _row_layout(self.attn_out, n))
            self.res_addr[i] = spad.take(t * w, "residual rows", b)
            words.put(self.res_addr[i], _row_layout(self.residual[:, cols], n))

    def _expert_regions(self, i: int, spad, e: int) -> None:
        """A routed expert's received token rows; its result rows by slice (slice j of
        every row, w words each, then slice j + 1: what goes to each combining tile
        is consecutive)."""
        if e < self.experts:
            self.recv[e] = spad.take(self.tokens * self.hc, f"expert{e} token rows",
                                     self.a_bank)
        self.y_rows[e] = spad.take(len(self.slices) * self.tokens * self.w,
                                   f"expert{e} result slices")

    def _y_slice(self, ex: int, i: int) -> int:
        """Where expert ex's results for tile i's slice of the channels start."""
        return self.y_rows[ex] + list(self.slices).index(i) * self.tokens * self.w

    def _acc_plan(self, i: int) -> dict:
        """Tile i's accumulator entries: constants, then phases that overlay one another."""
        n, depth, hc = self.n, self.config.acc_depth, self.hc
        bump = _bump(0, depth, "accumulator memory", f"tile {i}")
        plan = {"iota": bump.take(self.q_words, "table-index entries")}
        if i == self.home:  # the constants' words, in their order (see _place_home)
            at = bump.take(4 * n, "constants")
            plan.update(zero=at, m128=at + 1, rank=at + 1 + n, one=at + 2 + n, eye=at + 3 + n,
                        eye15=bump.take(n, "identity x 2^15"))
        base = bump.end
        ffn = _bump(base, depth, "accumulator memory", f"tile {i}")
        plan["table"] = ffn.take(self.q_words, "SiLU table entries")
        plan["g"] = ffn.take(self.fc * n, "FFN gate")
        plan["u"] = ffn.take(self.fc * n, "FFN up")
        plan["y_tiles"] = min(hc, (depth - plan["g"]) // n)
        if plan["y_tiles"] < 1:
            ffn.take(n, "FFN output")
        # The combine and the projection in column chunks of what is left.
        plan["c_tiles"] = min(hc, (depth - base) // n)
        plan["proj"] = _bump(base, depth, "accumulator memory", f"tile {i}").take(
            n, "projected attention")
        plan["comb"] = plan["proj"]
        if i == self.home:
            gating = _bump(base, depth, "accumulator memory", f"tile {i}")
            # What the gates read first (the top-k list, the gates, their sums), then
            # what only the masks need.
            for name, size in (("k128", n), ("gt", n), ("max", 1), ("sum", 1),
                               ("gs", self.top_k), ("v", self.ec * n), ("s", self.ec * n),
                               ("rank_mask", self.ec * n)):
                plan[name] = gating.take(size, name)
            plan["one_mask"] = plan["s"]  # the top-k tile is dead once k128 holds its list
            # Index tables for every expert at once when the tokens are one block and
            # they fit (else a group of N experts at a time), in two buffers if they fit:
            # the gather tables' GEMMs run while the result tables go out. With one
            # block, past the gates' entries if they fit there: the gates are then
            # computed after the dispatch has begun (``late_gates``), off its path.
            tw2 = ceil_div(2 * self.tokens, n)
            def all_at_once(start: int) -> bool:  # every expert's tables from start
                return len(self.block_rows) == 1 and start + self.ec * n * (2 * tw2 + 1) <= depth

            kept = plan["gs"] + self.top_k
            plan["late_gates"] = all_at_once(kept)
            start = kept if plan["late_gates"] else base
            tables = _bump(start, depth, "accumulator memory", f"tile {i}")
            plan["groups"] = self.ec if all_at_once(start) else 1
            size = plan["groups"] * tw2 * n
            two = start + (2 * tw2 + 1) * plan["groups"] * n <= depth
            first = tables.take(size, "index tables")
            plan["tabs"] = (first, tables.take(size, "index tables") if two else first)
            plan["cnt"] = tables.take(plan["groups"] * n, "token counts")
        return plan

    # -- instructions --------------------------------------------------------------------

    def emit_home_inputs(self) -> None:
        """Constants into the accumulator, the SiLU table cleared (while home's first
        projection GEMM streams, if it has one), the token rows (projected by every
        tile, a slice each, or written by the host) where the router and the shared
        experts read them."""
        home, n, plan = self.home, self.n, self.plans[self.home]
        e = self.emitters[home]
        for i in range(self.tiles):  # streamed: each tile's first weights on their way
            if not self.step.index:  # (a later round of a chain finds them loaded)
                self.emitters[i].ops.extend(self._loads(("front", i)))
        if self.projection is not None and self.projection.fetch is not None:
            self._emit_fetch()
        self.load_words(home, self.const_addr, plan["zero"], 4 * n)
        self.load_words(home, self.iota[home], plan["iota"], self.q_words)

        def vector_constants():
            e.vec(VOP.LOGIT, n, 1, plan["eye"], mult=1, shift=-G_BITS, imm=NEG_INF,
                  dst=plan["eye15"], dst_kind=VecDst.TILE, lo=0, hi=n)
            self.load_table(home, plan["zero"])

        shared_tiles = {self.expert_tile[s] for s in range(self.experts, self.layer.total)}
        readers = {home} | shared_tiles  # tiles that read every token row
        if self.projection is not None:
            for i in self.slices:
                self._emit_projection(i, readers - {i},
                                      vector_constants if i == home else None)
            self.x_inputs = {r: self.tokens * len(set(self.slices) - {r}) for r in readers}
        else:
            vector_constants()
            others = sorted(shared_tiles - {home})
            if others:
                mask = self._mask(others)
                size = self.tokens * self.hc
                for start in range(0, size, MAX_DMA_LENGTH):
                    e.dma(src=self.xr + start, dst=self.xr + start,
                          length=min(MAX_DMA_LENGTH, size - start), tiles=mask,
                          remote_signal=1, remote_semaphore=SEM_INPUTS)
            self.x_inputs = {r: ceil_div(self.tokens * self.hc, MAX_DMA_LENGTH)
                             for r in shared_tiles - {home}}
        e.wait_arrivals(SEM_INPUTS, self.x_inputs.get(home, 0))

    def end_projection(self) -> None:
        """End the projection's programs (:class:`compiler.moe.ProjectionPrograms`, a
        round of their own): every tile that reads the token rows waits for them there;
        the programs that follow start on tiles that hold them."""
        n, t, hc = self.n, self.tokens, self.hc
        for r, count in self.x_inputs.items():
            if r != self.home:  # home waited in emit_home_inputs
                self.emitters[r].wait_arrivals(SEM_INPUTS, count)
        self.x_inputs = {}
        rows = [[self.xr + r * hc + j for j in range(hc)] for r in range(t)]
        words = [w for row in rows for w in row]
        reader = OutputRows((t, self.hidden), n, self.hidden,
                            [((r,), row) for r, row in enumerate(rows)])
        front = 0 if self.step.index else sum(
            count for key, loads in self.streams.items() if not isinstance(key, int)
            for *_, count in loads)
        self.before = ProjectionPrograms(self.tile_programs(words, (t, self.hidden), reader),
                                         words, reader, front + self.fetched_words)
        self.emitters = [Emitter(n) for _ in range(self.tiles)]

    def _emit_fetch(self) -> None:
        """The attention outputs from the memory channels (``Projection.fetch``): each
        part's tile loads its rows (raising :data:`SEM_WEIGHTS`, which no load of this
        round's weights raises before them) and multicasts them to the other tiles that
        project (raising :data:`SEM_RESULTS` there, no result arriving before every
        tile has projected), which wait for every part."""
        at, n = self.projection.at, self.n
        row = ceil_div(self.channels, n)
        most = self.longest_load()
        arrivals = dict.fromkeys(self.slices, 0)
        for tile, channel, word, first, rows in self.projection.fetch:
            e, size = self.emitters[tile], rows * row
            part = _Words(n)
            part.put(0, _row_layout(self.attn_out[first:first + rows], n))
            self.handed.setdefault(channel, {}).update(
                (word + a, w) for a, w in part.writes.items())
            dst = at + first * row
            loads = range(0, size, most)
            for p in loads:
                e.dma(target=DmaTarget.LOAD, channel=channel, mem_addr=word + p, dst=dst + p,
                      length=min(most, size - p), remote_signal=1,
                      remote_semaphore=SEM_WEIGHTS)
            e.wait_arrivals(SEM_WEIGHTS, len(loads))
            others = set(self.slices) - {tile}
            for p in range(0, size, MAX_DMA_LENGTH) if others else ():
                e.dma(src=dst + p, dst=dst + p, length=min(MAX_DMA_LENGTH, size - p),
                      tiles=self._mask(others), remote_signal=1,
                      remote_semaphore=SEM_RESULTS)
                for r in others:
                    arrivals[r] += 1
            self.fetched_words += size
        for i, count in arrivals.items():
            self.emitters[i].wait_arrivals(SEM_RESULTS, count)

    def _emit_projection(self, i: int, readers: set[int], meanwhile=None) -> None:
        """Tile i's slice of x = clamp(residual + rq(o · W_o)) into its token rows, block
        by block, then each row's slice to the ``readers`` (one multicast DMA a row).
        ``meanwhile()`` emits what runs while the first GEMM streams."""
        n, hc = self.n, self.hc
        e, plan = self.emitters[i], self.plans[i]
        c0, c1 = self.slices[i]
        w = c1 - c0
        pm, ps = self.projection.scales.multiplier()
        self._wait_front(i)
        proj, chunk = plan["proj"], plan["c_tiles"]
        for b, rows in enumerate(self.block_rows):
            if self.projection.at is None:  # block b's columns
                o = {"a": self.o_addr[i] + b * self.channels, "a_rows": 0}
            else:  # its rows
                o = {"a": self.o_addr[i] + b * n * ceil_div(self.channels, n), "a_rows": 1,
                     "a_row_major": 1}
            for j0 in range(0, w, chunk):
                width = min(chunk, w - j0)
                cols = min(width * n, self.hidden - (c0 + j0) * n)
                every = {"lo": 0, "hi": width * n}
                e.gemm(**o, b=self.wo_addr[i] + j0 * self.channels, c=proj, m=rows,
                       k=self.channels, p=cols, b_rows=0)
                if meanwhile is not None:
                    meanwhile()
                    meanwhile = None
                e.vec(VOP.REQUANT, rows, width, proj, mult=pm, shift=ps, dst=proj,
                      dst_kind=VecDst.TILE, **every)
                e.gemm(a=self.ident[i], b=self.res_addr[i] + b * n * w + j0, c=proj, m=rows,
                       k=rows, p=cols, a_rows=1, b_rows=0, b_stride=w, accumulate=1,
                       acc_shift=0)
                e.vec(VOP.REQUANT, rows, width, proj, mult=IDENTITY[0], shift=IDENTITY[1],
                      dst=self.xr + b * n * hc + c0 + j0, dst_kind=VecDst.SPAD,
                      dst_stride=hc, **every)
        mask = self._mask(readers)
        if mask:
            for row in range(self.tokens):
                at = self.xr + row * hc + c0
                e.dma(src=at, dst=at, length=w, tiles=mask, remote_signal=1,
                      remote_semaphore=SEM_INPUTS)

    def emit_gating(self) -> None:
        """Per block: router logits, top k, the rank and 0/1 masks (transposed into the
        scratchpad), the gates in top-k order and their diagonals."""
        n, ec, experts, top_k, t = self.n, self.ec, self.experts, self.top_k, self.tokens
        e, plan = self.emitters[self.home], self.plans[self.home]
        lanes = {"lo": 0, "hi": experts}
        batch = min(SILU_ENTRIES >> self.cb, n)
        self._wait_front(self.home)
        for b, rows in enumerate(self.block_rows):
            v, s = plan["v"], plan["s"]
            e.gemm(a=self.xr + b * n * self.hc, b=self.router_addr, c=v, m=rows,
                   k=self.hidden, p=experts, a_rows=1, a_row_major=1, b_rows=0)
            e.gemm(a=self.enc_a + 2 * b, b=self.enc_b, c=v, m=rows, k=2, p=experts,
                   a_rows=0, b_rows=0, accumulate=1, acc_shift=8)
            e.vec(VOP.TOPK, rows, ec, v, imm=0, dst=s, dst_kind=VecDst.TILE, **lanes)
            e.vec(VOP.ADD, rows, 1, s + (ec - 1) * n, b=plan["m128"], dst=plan["k128"],
                  dst_kind=VecDst.TILE, lo=0, hi=n)
            for o in range(0, rows, batch):
                group = range(o, min(rows, o + batch))
                for value, mask in ((plan["rank"], plan["rank_mask"]),
                                    (plan["one"], plan["one_mask"])):
                    for row in group:  # table[c8 of the row's j-th expert] = value lane j
                        e.vec(VOP.SILU_LOAD, top_k, 1, value, a_scalar=1,
                              c=plan["k128"] + row, lo=0, hi=1)
                    e.vec(VOP.SILU, len(group), ec, v + o, dst=mask + o,
                          dst_kind=VecDst.TILE, **lanes)
                for row in group:
                    e.vec(VOP.SILU_LOAD, top_k, 1, plan["zero"], a_scalar=1,
                          c=plan["k128"] + row, lo=0, hi=1)
            for j in range(ec):
                for mask, dst in ((plan["rank_mask"], self.sel_rank),
                                  (plan["one_mask"], self.sel_one)):
                    e.vec(VOP.REQUANT, rows, 1, mask + j * n, mult=IDENTITY[0],
                          shift=IDENTITY[1], dst=dst + j * t + b * n, dst_kind=VecDst.SPAD,
                          lo=0, hi=n)
            if not plan["late_gates"]:
                self._emit_gates(b, rows)

    def _emit_gates(self, b: int, rows: int) -> None:
        """Golden's softmax over the k selected logits, L = floor(v / 256) of the top-k
        list, then per slot j the diagonal of the gates as the combine's A operand."""
        n, top_k = self.n, self.top_k
        e, plan = self.emitters[self.home], self.plans[self.home]
        gt, slots = plan["gt"], {"lo": 0, "hi": top_k}
        lm, ls = self.layer.logit
        e.vec(VOP.LOGIT, rows, 1, plan["k128"], mult=1, shift=8, imm=NEG_INF, dst=gt,
              dst_kind=VecDst.TILE, **slots)
        e.vec(VOP.LOGIT, rows, 1, gt, mult=lm, shift=ls, imm=NEG_INF, dst=gt,
              dst_kind=VecDst.TILE, total=plan["max"], total_write=1, **slots)
        e.vec(VOP.EXP, rows, 1, gt, c=plan["max"], shift=G_BITS, dst=gt, dst_kind=VecDst.TILE,
              total=plan["sum"], total_write=1, **slots)
        e.vec(VOP.RECIP, rows, 1, plan["sum"], a_scalar=1, c=plan["sum"], lo=0, hi=1)
        e.vec(VOP.DIV, rows, 1, gt, shift=G_BITS, sat=1, dst=gt, dst_kind=VecDst.TILE,
              **slots)
        for j in range(top_k):
            e.vec(VOP.SUM, rows, 1, gt, total=plan["gs"] + j, total_write=1, lo=j, hi=j + 1)
            at = (b * top_k + j) * n
            zero = {"b": plan["zero"], "b_scalar": 1, "c": plan["gs"] + j, "lo": 0, "hi": n}
            for pack, dst in ((VecPack.LIMB_LO, self.d_lo), (VecPack.LIMB_HI, self.d_hi)):
                e.vec(VOP.RESCALE, rows, 1, plan["eye15"], dst=dst + at,
                      dst_kind=VecDst.SPAD, pack=pack, **zero)  # lane r: gate bits 0-13
            e.vec(VOP.RESCALE, rows, 1, plan["eye"], dst=self.d_top + at,
                  dst_kind=VecDst.SPAD, **zero)  # lane r: (gate + 2^14) >> 15, bit 14

    def emit_tables_and_dispatch(self) -> None:
        """Per group of experts (all of them, or N at a time: the plan's ``groups``):
        counts, result tables (into each expert's metadata) and gather tables; then each
        tile's experts' metadata (one DMA) and every expert's rows go."""
        n, t, home = self.n, self.tokens, self.home
        e, plan = self.emitters[home], self.plans[home]
        tw2, per = ceil_div(2 * t, n), plan["groups"] * n
        for g0 in range(0, self.experts, per):
            rows = min(per, self.experts - g0)
            one, rank = self.sel_one + g0 // n * t, self.sel_rank + g0 // n * t
            e.gemm(a=one, b=self.ones_tn, c=plan["cnt"], m=rows, k=t, p=n, a_rows=0, b_rows=0)
            # (entries, beats, dst, stride, op) of each write-out (:meth:`_rows_out`)
            outs = [(plan["cnt"], 1, self.meta + g0 * self.meta_words, self.meta_words,
                     VOP.REQUANT)]
            shared = plan["tabs"][0] == plan["tabs"][1]
            for tab, (dst, stride, terms) in zip(plan["tabs"], (
                    (self.meta + g0 * self.meta_words + 1, self.meta_words,
                     ((one, self.d_result), (rank, self.d_rank))),
                    (self.gtab + g0 * self.tw, self.tw, ((one, self.d_gather),))),
                    strict=True):
                if shared:  # one buffer: each table out before the next is built
                    for entries, beats, at, step, op in outs:
                        self._rows_out(entries, rows, beats, at, step, op)
                    outs = []
                # Token block b's entries are columns 2bN .. of the table: one GEMM per
                # block over its own tokens (the constants are block-diagonal).
                for blk, block_rows in enumerate(self.block_rows):
                    for index, (a, d) in enumerate(terms):
                        e.gemm(a=a + blk * n, b=d[blk], c=tab + 2 * blk * n, m=rows,
                               k=block_rows, p=2 * block_rows, a_rows=0, b_rows=0,
                               accumulate=int(index > 0), acc_shift=0)
                e.gemm(a=self.ones_col, b=self.neg_row, c=tab, m=rows, k=1, p=2 * t,
                       a_rows=0, b_rows=0, accumulate=1, acc_shift=0)
                outs.append((tab, tw2, dst, stride, VOP.LOGIT))
            # With two buffers every GEMM goes first, then what the vector engine writes
            # out of them: the GEMM engine does not wait for the vector engine.
            for entries, beats, at, step, op in outs:
                self._rows_out(entries, rows, beats, at, step, op)
        for tile in range(self.tiles):
            mine = self.routed_on(tile)
            if tile != home and mine:
                at = self._meta(mine[0])
                size = len(mine) * self.meta_words
                for start in range(0, size, MAX_DMA_LENGTH):
                    e.dma(src=at + start, dst=at + start,
                          length=min(MAX_DMA_LENGTH, size - start),
                          tiles=self._mask([tile]), remote_signal=1,
                          remote_semaphore=SEM_INPUTS)
                self.meta_dmas[tile] = ceil_div(size, MAX_DMA_LENGTH)
        # The tables and the token rows are written (the vector engine writes what the
        # engines put in the scratchpad): the IDMAs read them. The metadata DMAs need
        # not have finished: the DMA engine takes the IDMAs' rows after them.
        e.wait_engine(Opcode.VEC)
        # Each expert's rows: IDMAs placed by emit_experts, home's own before each of
        # its experts, the others' while home's experts compute; then the gate diagonals
        # to the other combining tiles (counted with their results).
        self.gathers = {ex: (Opcode.IDMA, {
            "src": self.xr, "dst": self.recv[ex], "table": self.gtab + self.lane[ex] * self.tw,
            "count": t, "row": self.hc, "tile_base": self.index_of(self.expert_tile[ex]),
            "remote_signal": 1, "remote_semaphore": self._rows_sem(ex)})
            for ex in range(self.experts)}
        combiners = self._mask(set(self.slices) - {home})
        size = self.tb * self.top_k * n
        self.diag_sends = [
            (Opcode.DMA, {"src": region + start, "dst": region + start,
                          "length": min(MAX_DMA_LENGTH, size - start), "tiles": combiners,
                          "remote_signal": 1, "remote_semaphore": SEM_RESULTS})
            for region in (self.d_lo, self.d_hi, self.d_top)
            for start in range(0, size, MAX_DMA_LENGTH)] if combiners else []
        # Late gates: every other tile's first expert's rows go first, then the gates
        # are computed (drained before the diagonals go, see _dispatch_slots).
        self.early = []
        if plan["late_gates"]:
            self.early = [mine[0] for tile in range(self.tiles)
                          if tile != home and (mine := self.routed_on(tile))]
            e.ops.extend(self.gathers[ex] for ex in self.early)
            self._emit_gates(0, self.block_rows[0])

    def _rows_out(self, entries: int, rows: int, beats: int, dst: int, stride: int,
                  op: VOP) -> None:
        """Rows (experts) of a GEMM's entries, ``beats`` tiles of N columns (row r of
        tile j at ``entries + (⌊r / N⌋·beats + j)·N + r mod N``), into the scratchpad, row
        r at ``dst + r·stride``, as bytes (REQUANT: clamped; LOGIT by 1: the low 8 bits)."""
        e, n = self.emitters[self.home], self.n
        step = min(n, self.config.slots)
        scale = {"mult": IDENTITY[0], "shift": IDENTITY[1]} if op == VOP.REQUANT else {
            "mult": 1, "shift": 0, "imm": NEG_INF}
        for t0 in range(0, rows, n):
            for r0 in range(t0, min(rows, t0 + n), step):
                part = min(step, rows - r0, t0 + n - r0)
                e.vec(op, part, beats, entries + t0 * beats + r0 - t0, dst=dst + r0 * stride,
                      dst_kind=VecDst.SPAD, dst_stride=stride, lo=0, hi=beats * n, **scale)

    def _meta(self, ex: int) -> int:
        """Where routed expert ex's count (then its result table) is."""
        return self.meta + self.lane[ex] * self.meta_words

    def _load_count(self, rd: int, addr: int) -> tuple:
        """The LOAD of a count word at ``addr`` (an expert's count or loaded flag, the
        same in every lane: its last byte, 0 above it) into register ``rd``."""
        return (Opcode.LOAD, {"rd": rd, "addr": addr, "lane": self.n - 1})

    def _rows_sem(self, ex: int) -> int:
        return FIRST_ROWS_SEM + self.routed_on(self.expert_tile[ex]).index(ex)

    def emit_experts(self) -> None:
        """Each expert tile: its inputs, then per expert the FFN over the rows it
        received and the results back to home."""
        n, t = self.n, self.tokens
        for i in range(self.tiles):
            mine = self.experts_on(i)
            if not mine:
                continue
            e, plan = self.emitters[i], self.plans[i]
            if i != self.home:  # the table's indices (constants) while home routes
                self.load_words(i, self.iota[i], plan["iota"], self.q_words)
                e.wait_arrivals(SEM_INPUTS, self.meta_dmas.get(i, 0) + self.x_inputs.get(i, 0))
            for reg, value in ((R_N, n), (R_NM1, n - 1), (R_LIM, ceil_div(t, n))):
                e.ops.append((Opcode.SET, {"rd": reg, "value": value}))
            if self.memory is not None:
                self._load_weights(i, mine)
            once = self._dispatch_slots() if i == self.home else {}
            previous, scatter = None, []  # the expert before and its result scatters
            for ex in mine:
                e.drain()
                if ex < self.experts:
                    if i == self.home:
                        e.ops.append(self.gathers[ex])
                    count = self._load_count(R_LEFT, self._meta(ex))
                    arrival = [(Opcode.WITH, {"field0": 1, "reg0": R_LEFT}),
                               (Opcode.WAIT, {"semaphore": self._rows_sem(ex), "count": 0})]
                    source = self.recv[ex]
                else:
                    count, arrival, source = (Opcode.SET, {"rd": R_LEFT, "value": t}), [], self.xr
                self._expert_loop(i, ex, source, count, arrival, (previous, scatter),
                                  once.get(ex, []))
                previous, scatter = ex, self._send_results(i, ex)
            self._results_if_rows(i, previous, scatter, zeroed=False)
            if self.memory is not None and not self.step.last:  # the flags have landed
                e.wait_arrivals(SEM_INPUTS, len(self.routed_on(i)))

    def _loads(self, key) -> list:
        """The memory DMAs of ``self.streams[key]`` (none with resident weights), each
        raising :data:`SEM_WEIGHTS` when its last word has landed."""
        return [(Opcode.DMA, {"target": DmaTarget.LOAD, "channel": channel, "mem_addr": base,
                              "dst": address, "length": count, "remote_signal": 1,
                              "remote_semaphore": SEM_WEIGHTS})
                for address, channel, base, count in self.streams.get(key, [])]

    def _wait_front(self, i: int) -> None:
        """Tile i's WAIT for its first weights (once; none if it loads none)."""
        if ("front", i) in self.streams and i not in self.front_waited and not self.step.index:
            self.front_waited.add(i)
            self.emitters[i].wait_arrivals(SEM_WEIGHTS, len(self.streams[("front", i)]))

    def _load_weights(self, i: int, mine: list[int]) -> None:
        """Memory DMAs for the weights and tables of tile i's experts: every shared
        expert's, and a routed expert's when its count is not 0 (what its loop's WAIT on
        :data:`SEM_WEIGHTS` expects) — in a later round of a chain only a routed
        expert's whose flag says no earlier round loaded it. A chain's round that another
        follows writes each routed expert's next flag: its count if it loads it now,
        else the flag it read (a one-word DMA to this tile, counted on
        :data:`SEM_INPUTS` before HALT)."""
        e = self.emitters[i]
        first, more = not self.step.index, not self.step.last
        e.drain()  # home: the counts are written
        ops = e.ops
        ops.append((Opcode.SET, {"rd": R_IT, "value": 0}))
        for ex in mine:
            if ex >= self.experts:  # a shared expert: the chain's first round loads it
                if first:
                    ops.extend(self._loads(ex))
                continue
            ops.append(self._load_count(R_LEFT, self._meta(ex)))
            if first:
                if more:
                    ops.append(self._flag_copy(i, self._meta(ex), ex))
                skip = len(ops)
                ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_LEFT, "target": 0}))
                ops.extend(self._loads(ex))
                ops[skip][1]["target"] = len(ops)
                continue
            previous = self._flag(ex, self.step.index - 1)
            ops.append(self._load_count(R_ROWS, previous))
            idle = len(ops)  # no rows
            ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_LEFT, "target": 0}))
            fresh = len(ops)  # rows, and no earlier round loaded it
            ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_ROWS, "target": 0}))
            ops[idle][1]["target"] = len(ops)
            if more:
                ops.append(self._flag_copy(i, previous, ex))
            done = len(ops)
            ops.append((Opcode.SKIP, {"ra": R_N, "rb": R_N, "target": 0}))
            ops[fresh][1]["target"] = len(ops)
            ops.extend(self._loads(ex))
            if more:
                ops.append(self._flag_copy(i, self._meta(ex), ex))
            ops[done][1]["target"] = len(ops)

    def _flag(self, ex: int, index: int) -> int:
        """Routed expert ex's flag that round ``index`` of a chain writes."""
        return self.flags[ex] + index % 2

    def _flag_copy(self, i: int, src: int, ex: int) -> tuple:
        """The DMA that writes word ``src`` of tile i into expert ex's next flag there."""
        return (Opcode.DMA, {"src": src, "dst": self._flag(ex, self.step.index), "length": 1,
                             "tiles": self._mask([i]), "remote_signal": 1,
                             "remote_semaphore": SEM_INPUTS})

    def _dispatch_slots(self) -> dict[int, list]:
        """The other tiles' experts' rows, as IDMAs issued while home's routed experts
        compute (:meth:`_expert_loop`'s ``once``), every tile's first expert's first
        (those already sent with late gates left out): each home expert takes as many
        as the sequencer walks while its gate and up GEMMs stream their weights (an
        IDMA estimated at 24 cycles, 2 an entry and 6 + hc a row, for the mean rows an
        expert gets), its last the rest and the gate diagonals for the other combining
        tiles (all at once if home has none, once the gates are written)."""
        home = self.routed_on(self.home)
        others = sorted((rank, ex) for t in range(self.tiles) if t != self.home
                        for rank, ex in enumerate(self.routed_on(t)) if ex not in self.early)
        gathers = [self.gathers[ex] for _, ex in others]
        if not home:
            e = self.emitters[self.home]
            e.ops.extend(gathers)
            e.drain()  # the gates' diagonals are written (late gates)
            e.ops.extend(self.diag_sends)
            return {}
        gathers += self.diag_sends
        shadow = 2 * self.hidden * self.ffn // self.n  # the gate and up GEMMs' beats
        rows = self.tokens * self.top_k / self.experts
        per = max(1, int(shadow // (24 + 2 * self.tokens + rows * (6 + self.hc))))
        slots = {ex: gathers[j * per:(j + 1) * per] for j, ex in enumerate(home)}
        slots[home[-1]] += gathers[len(home) * per:]
        return slots

    def _results_if_rows(self, i: int, ex: int | None, scatter: list, zeroed: bool) -> None:
        """Routed expert ex's result ``scatter`` (:meth:`_send_results`), past which a
        SKIP jumps when its count is 0 (R_ROWS; R_IT set to 0 unless ``zeroed`` says it
        is): an expert without rows sends nothing, and its scatters would walk empty
        tables."""
        if not scatter:
            return
        ops = self.emitters[i].ops
        if not zeroed:
            ops.append((Opcode.SET, {"rd": R_IT, "value": 0}))
        ops.append(self._load_count(R_ROWS, self._meta(ex)))
        skip = len(ops)
        ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_ROWS, "target": 0}))
        ops.extend(scatter)
        ops[skip][1]["target"] = len(ops)

    def _expert_loop(self, i: int, ex: int, source: int, count: tuple, arrival: list,
                     previous: tuple[int | None, list], once: list) -> None:
        """The SwiGLU FFN of expert ex over R_LEFT rows at ``source`` (row-major), N rows
        at a time, the results by slice into the expert's result rows. ``count`` sets
        R_LEFT; ``arrival`` waits for the rows to arrive (only when there are some).
        ``previous``: the expert before on the tile and its result scatters, which go
        home in the first block while the gate and up GEMMs run, or at once (unless it
        had no rows) if this one has none; ``once``: raw IDMAs issued with them (other
        experts' rows)."""
        n, hidden, ffn, hc, fc = self.n, self.hidden, self.ffn, self.hc, self.fc
        e, plan, layer = self.emitters[i], self.plans[i], self.layer
        wg, wu, wd = self.w_addr[ex]
        (gm, gs), (um, us) = layer.gate[ex], layer.up[ex]
        (hm, hs), (dm, ds) = layer.swiglu[ex], layer.down[ex]
        ops = e.ops
        ops.append(count)
        ops.append((Opcode.SET, {"rd": R_IT, "value": 0}))
        skip_all = len(ops)  # no rows (R_IT is 0): not even the SiLU table is loaded
        ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_LEFT, "target": 0}))
        ops.extend(arrival)
        for reg in (R_OFF, R_YOFF):
            ops.append((Opcode.SET, {"rd": reg, "value": 0}))
        first = previous[1] + once
        if self.memory is not None:  # its weights and table have arrived
            self._wait_weights(i, ex)
        body = len(ops)
        ops.append((Opcode.ADD, {"rd": R_ROWS, "ra": R_LEFT, "imm": 0}))
        short = len(ops)
        ops.append((Opcode.SKIP, {"ra": R_NM1, "rb": R_LEFT, "target": 0}))
        ops.append((Opcode.SET, {"rd": R_ROWS, "value": n}))
        ops[short][1]["target"] = len(ops)
        # The SiLU table's entries, the gate and up GEMMs, then (while they run) the
        # previous expert's results home and the table into the vector unit, in order
        # before SWIGLU. Every block loads the table again: the body's WAITs are for its
        # own operations, so they count the same in every iteration.
        self.load_words(i, self.tbl_addr[ex], plan["table"], self.q_words)
        rows, full = [("m", R_ROWS)], {"m": n}
        # Gate and up in one GEMM when the up weights' blocks follow the gate's (and the
        # up entries the gate's): one pipeline fill less per block.
        fused = ffn % n == 0 and wu == wg + fc * hidden and plan["u"] == plan["g"] + fc * n
        for w, c, p in (((wg, plan["g"], 2 * ffn),) if fused else
                        ((wg, plan["g"], ffn), (wu, plan["u"], ffn))):
            e.dynamic(Opcode.GEMM, {"a": source, "b": w, "c": c, "m": 0, "k": hidden, "p": p,
                                    "a_rows": 1, "a_row_major": 1, "b_rows": 0},
                      [("a", R_OFF)] + rows, full)
        if first:  # in the first block only (R_OFF is 0 there, then N·hc)
            guard = len(ops)
            ops.append((Opcode.SKIP, {"ra": R_OFF, "rb": R_N, "target": 0}))
            ops.extend(first)
            ops[guard][1]["target"] = len(ops)
        self.load_table(i, None)
        by_rows = {"registers": [("rows", R_ROWS)], "assume": {"rows": n}}
        every = {"lo": 0, "hi": fc * n}
        e.vec(VOP.REQUANT, 0, fc, plan["g"], mult=gm, shift=gs, dst=plan["g"],
              dst_kind=VecDst.TILE, **every, **by_rows)
        e.vec(VOP.REQUANT, 0, fc, plan["u"], mult=um, shift=us, dst=plan["u"],
              dst_kind=VecDst.TILE, **every, **by_rows)
        e.vec(VOP.SWIGLU, 0, fc, plan["g"], b=plan["u"], mult=hm, shift=hs, sat=1,
              dst=self.h_addr[i], dst_kind=VecDst.SPAD, **every, **by_rows)
        chunk = plan["y_tiles"]
        for j0 in range(0, hc, chunk):
            width = min(chunk, hc - j0)
            e.dynamic(Opcode.GEMM, {"a": self.h_addr[i], "b": wd + j0 * ffn, "c": plan["g"],
                                    "m": 0, "k": ffn, "p": min(width * n, hidden - j0 * n),
                                    "a_rows": 1, "b_rows": 0}, rows, full)
            for tile, (c0, c1) in self.slices.items():  # each combining tile's columns
                lo, hi = max(c0, j0), min(c1, j0 + width)
                if lo < hi:
                    e.vec(VOP.REQUANT, 0, hi - lo, plan["g"] + (lo - j0) * n, mult=dm,
                          shift=ds, dst=self._y_slice(ex, tile) + lo - c0,
                          dst_kind=VecDst.SPAD, dst_stride=self.w, lo=0, hi=(hi - lo) * n,
                          registers=[("rows", R_ROWS), ("dst", R_YOFF)], assume={"rows": n})
        e.drain()
        done = len(ops)
        ops.append((Opcode.SKIP, {"ra": R_N, "rb": R_LEFT, "target": 0}))
        ops.append((Opcode.ADD, {"rd": R_LEFT, "ra": R_LEFT, "imm": -n}))
        ops.append((Opcode.ADD, {"rd": R_OFF, "ra": R_OFF, "imm": n * hc}))
        ops.append((Opcode.ADD, {"rd": R_YOFF, "ra": R_YOFF, "imm": n * self.w}))
        ops.append((Opcode.LOOP, {"counter": R_IT, "limit": R_LIM, "target": body,
                                  "bound": ceil_div(self.tokens, n)}))
        ops[done][1]["target"] = len(ops)
        if first:  # the loop ran: on past the copy for no rows
            jump = len(ops)
            ops.append((Opcode.SKIP, {"ra": R_N, "rb": R_N, "target": 0}))
            ops[skip_all][1]["target"] = len(ops)
            self._results_if_rows(i, *previous, zeroed=True)
            ops.extend(once)
            ops[jump][1]["target"] = len(ops)
        else:
            ops[skip_all][1]["target"] = len(ops)

    def _wait_weights(self, i: int, ex: int) -> None:
        """The WAIT for expert ex's weights, if this round loads them: always in a
        chain's first round; in a later one a routed expert's when its flag says no
        earlier round did (R_IT is 0)."""
        e = self.emitters[i]
        if not self.step.index:
            e.wait_arrivals(SEM_WEIGHTS, len(self.streams[ex]))
        elif ex < self.experts:
            ops = e.ops
            ops.append(self._load_count(R_ROWS, self._flag(ex, self.step.index - 1)))
            fresh = len(ops)
            ops.append((Opcode.SKIP, {"ra": R_IT, "rb": R_ROWS, "target": 0}))
            loaded = len(ops)
            ops.append((Opcode.SKIP, {"ra": R_N, "rb": R_N, "target": 0}))
            ops[fresh][1]["target"] = len(ops)
            e.wait_arrivals(SEM_WEIGHTS, len(self.streams[ex]))
            ops[loaded][1]["target"] = len(ops)

    def _send_results(self, i: int, ex: int) -> list:
        """A routed expert's result slices into each combining tile's slot buffer: IDMA
        scatters over its result table (one a tile), returned for the caller to place.
        A shared expert's slices to the other combining tiles by DMA, emitted here
        (nothing returned)."""
        e, t, w = self.emitters[i], self.tokens, self.w
        if ex < self.experts:
            return [(Opcode.IDMA, {
                "src": self._y_slice(ex, d), "dst": self.slot_rows,
                "table": self._meta(ex) + 1, "count": t, "row": w,
                "scatter": 1, "tile_base": self.index_of(d), "remote_signal": 1,
                "remote_semaphore": SEM_RESULTS}) for d in self.slices]
        for d in self.slices:
            if d != i:
                for start in range(0, t * w, MAX_DMA_LENGTH):
                    e.dma(src=self._y_slice(ex, d) + start, dst=self.shared_rows[ex] + start,
                          length=min(MAX_DMA_LENGTH, t * w - start), tiles=self._mask([d]),
                          remote_signal=1, remote_semaphore=SEM_RESULTS)
                    self.shared_dmas[d] = self.shared_dmas.get(d, 0) + 1
        return []

    def emit_combine(self) -> None:
        """Each combining tile, its slice of the channels once its results (and the gate
        diagonals) have arrived: per block ``Σ_j diag(G_j)·Y_j`` (+ the shared experts'
        2^15·y) in two passes (bit 14 first, shifted by 14 under the low 14 bits),
        requantised into the output rows; the slices go to home's output rows."""
        n, hc, w, home, top_k, t = self.n, self.hc, self.w, self.home, self.top_k, self.tokens
        shared = range(self.experts, self.layer.total)
        om, osh = self.layer.out
        for i, (c0, c1) in self.slices.items():
            e, plan = self.emitters[i], self.plans[i]
            e.drain()
            e.wait_arrivals(SEM_RESULTS, t * top_k + self.shared_dmas.get(i, 0)
                            + (0 if i == home else len(self.diag_sends)))
            comb, chunk = plan["comb"], plan["c_tiles"]
            for b, rows in enumerate(self.block_rows):
                slot = [self.slot_rows + (j * t + b * n) * w for j in range(top_k)]
                terms = [({"a": self.d_top + (b * top_k + j) * n}, slot[j])
                         for j in range(top_k)]
                terms += [({"a": self.d_two}, b * n * w + (
                    self._y_slice(s, i) if self.expert_tile[s] == i else self.shared_rows[s]))
                    for s in shared]
                terms += [({"a": self.d_hi + (b * top_k + j) * n, "a_lo": self.d_lo
                            + (b * top_k + j) * n, "a_limbs": 1}, slot[j])
                          for j in range(top_k)]
                out, stride = ((self.out_addr + b * n * hc + c0, hc) if i == home
                               else (self.out_part[i] + b * n * w, w))
                for j0 in range(0, c1 - c0, chunk):
                    width = min(chunk, c1 - c0 - j0)
                    for index, (a, rows_at) in enumerate(terms):
                        e.gemm(**a, b=rows_at + j0, c=comb, m=rows, k=rows,
                               p=min(width * n, self.hidden - (c0 + j0) * n), a_rows=1,
                               b_rows=0, b_stride=w, accumulate=int(index > 0),
                               acc_shift=14 if index == top_k + len(shared) else 0)
                    e.vec(VOP.REQUANT, rows, width, comb, mult=om, shift=osh, dst=out + j0,
                          dst_kind=VecDst.SPAD, dst_stride=stride, lo=0, hi=width * n)
            if i != home:
                for r in range(t):
                    e.dma(src=self.out_part[i] + r * w, dst=self.out_addr + r * hc + c0,
                          length=c1 - c0, tiles=self._mask([home]), remote_signal=1,
                          remote_semaphore=SEM_INPUTS)
        self.emitters[home].wait_arrivals(SEM_INPUTS, t * (len(self.slices) - 1))

    def _words_moved(self, load: np.ndarray) -> dict:
        """Words over the mesh: ``dispatch_words``, token rows to the experts' tiles;
        ``combine_words``, result slices to other combining tiles, the gate diagonals and
        the output slices to home (metadata and the projection's rows not counted)."""
        t, w, hc, home = self.tokens, self.w, self.hc, self.home
        tiles = list(self.slices)
        dispatch = sum(int(c) * hc for e, c in enumerate(load) if self.expert_tile[e] != home)
        combine = sum(int(c) * w * sum(1 for d in tiles if d != self.expert_tile[e])
                      for e, c in enumerate(load))
        combine += sum(t * w * sum(1 for d in tiles if d != self.expert_tile[s])
                       for s in range(self.experts, self.layer.total))
        combine += sum(op[1]["length"] for op in self.diag_sends) * (len(tiles) - 1)
        combine += t * sum(c1 - c0 for d, (c0, c1) in self.slices.items() if d != home)
        return {"dispatch_words": dispatch, "combine_words": combine}

    def program(self) -> MoeChipProgram:
        n, hc, k, home, config, t = self.n, self.hc, self.k, self.home, self.config, self.tokens
        shape = (t, self.hidden)
        output_words = [self.out_addr + r * hc + j for r in range(t) for j in range(hc)]
        reader = OutputRows(shape, n, self.hidden, [
            ((r,), [self.out_addr + r * hc + j for j in range(hc)]) for r in range(t)])
        before = self.before
        programs = self.tile_programs(output_words, shape, reader, host=before is None)
        layer = self.layer
        chosen = topk(router_logits(self.x, self.weights), self.top_k)
        load = np.bincount(chosen.ravel(), minlength=self.experts)
        per_token = 3 * self.hidden * self.ffn
        # A chain's first round loads the front and the shared experts; every round the
        # routed experts with tokens that no earlier round of the chain loaded.
        streamed = sum(count for key, loads in self.streams.items()
                       if (not isinstance(key, int) or key >= self.experts)
                       and not self.step.index
                       or isinstance(key, int) and key < self.experts and load[key]
                       and key not in self.step.loaded
                       for *_, count in loads) + self.fetched_words
        if before is not None:  # the projection round loads the front and the fetch
            streamed -= before.memory_words
        summary = {
            "tokens": t, "mesh": f"{k}x{k}", "home": home, "dispatch": "sparse",
            "macs_sparse": (t * self.hidden * self.experts
                            + (self.top_k + layer.shared) * t * per_token
                            + (0 if self.projection is None or before is not None
                               else t * self.channels * self.hidden)),
            "expert_load": load.tolist(),
            **self._words_moved(load),
            "instructions": [p.summary.length for p in programs],
            "experts_per_tile": [len(self.experts_on(i)) for i in range(self.tiles)],
            "scratchpad_words": [p.summary.spad_words for p in programs],
            "memory_words": streamed,
        }
        attention = ({} if self.projection is None or self.projection.at is not None else
                     {i: range(at, at + self.tb * self.channels)
                      for i, at in self.o_addr.items()})
        return MoeChipProgram(config, k, home, programs, self.expert_tile, output_words,
                              shape, summary, reader, self.image, attention, self.handed,
                              before)
