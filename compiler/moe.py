"""The MoE half of a decoder layer on a k x k chip of tiles, bit-exact with golden.

:func:`build_moe` (or :func:`moe_from_workload`) maps one MoE layer
(``golden.moe.moe_layer``: router GEMM, top-k, gating softmax, SwiGLU experts, shared
experts, combine) onto ``k * k`` tiles and returns a :class:`MoeChipProgram`: one
:class:`compiler.program.TileProgram` per tile (ops, instruction words, the scratchpad
words the host writes), where the output is and a reader, and a summary. docs/moe_mapping.md
explains the mapping; in short:

- **Home tile** (0, 0) holds the T tokens, the router and the gating constants; it
  multicasts the tokens to every other tile (one DMA), computes the router logits, the
  top-k and the gates, and does the weighted combine and the final requantisation.
- **Experts** are spread round-robin: expert e (routed, then shared ones numbered after
  them) runs on tile ``e mod k²``; its weights and its SiLU table live there. Each tile
  computes its experts' SwiGLU FFN on **all** T tokens and sends each expert's int8 output
  back to the home tile (one DMA per expert, a remote semaphore per DMA).
- **Dense-masked routing.** Programs are static (no data-dependent branch or address), so
  an expert tile cannot know which tokens picked its experts. Every expert computes
  every token, and the combine multiplies each expert's output by a gate that is exactly
  0 when the token did not pick it; the integer sum, hence the output, equals golden's
  (:func:`dense_masked_reference` is the NumPy form of this argument, tested against
  ``moe_layer``). The summary reports the MACs executed and those a sparse dispatch needs.

The gate matrix G (T x E, Q0.15, 0 off the top-k) is built on the vector unit without any
data-dependent address: router logits L (int32) are made distinct and ordered by
``v = (L << 8) + c8(e, t)`` (an accumulate GEMM adds ``c8 = (E-1-e) + 2**cb·(t mod B)``,
so ties go to the lower expert like golden ``topk``); TOPK over v gives each token's k
largest v; their low bytes (the c8 of the chosen experts) are the addresses of SILU_LOAD,
which writes a 1 into those entries of the vector unit's 256-entry SiLU table — the one
indexed write the ISA has — and a SILU lookup of every v then yields the 0/1 selection
mask in expert order (entries cleared again afterwards; B tokens share the table at once).
Then ``x' = log2-logit(L) + HUGE·sel``, MAX, EXP (shift 15), RECIP, DIV (sat) over all E
lanes is golden's softmax over the top k (the unselected EXPs are exactly 0), and one
1-lane SUM per expert turns G's column into the per-token scalar that RESCALE multiplies
the expert's output with: ``comb += ((y << 15)·G[:, e] + 2**14) >> 15`` is exact.

Engines are synchronised by an emitter that inserts the WAITs each cross-engine access
needs (``compiler.hazards`` rules; :func:`check_chip_synchronisation` verifies them).
Semaphores: 0 GEMM, 1 VEC, 2 DMA (local completions), 3 tokens arrived (expert tiles),
4 an expert's output arrived (home).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from compiler.emit import Emitter, Regions
from compiler.hazards import check_synchronisation
from compiler.kv import pack_word
from compiler.program import OutputRows, TileProgram, encode_ops, summarise
from golden.decoder import IDENTITY, ProjectionScales, project_residual
from golden.exp import LOG2E, NEG_INF, exp2_neg, logit_multiplier, to_log2_domain
from golden.gemm import quantize_multiplier, requantize, wrap
from golden.moe import MoEScales, MoEWeights, expert_ffn, router_logits, silu_table, topk
from golden.reciprocal import divide
from golden.tile_model import acc_accesses
from golden.vector_model import VectorOpcode as VOP
from golden.vector_model import default_max_top_k
from spec.config import TileConfig, ceil_div
from spec.isa import MAX_DMA_LENGTH, MAX_GEMM_DIM, MEM_ADDR_BITS, Opcode, VecDst, tile_bit
from spec.memory import length_bits, nearest_channel
from spec.numerics import NUMERICS

__all__ = [
    "SEM_TOKENS", "SEM_RESULTS", "MoeChipProgram", "MoeLayer", "Projection",
    "ProjectionPrograms", "WeightMemory",
    "build_moe",
    "check_chip_synchronisation", "dense_masked_reference", "executed_acc_accesses",
    "executed_macs", "layer_problems",
    "moe_from_workload", "moe_tile_config", "projection_problems", "run_on_chip_model",
    "run_projection_on_chip_model",
]

#: The arrival semaphores (above the engines' completion semaphores, compiler.emit).
SEM_TOKENS, SEM_RESULTS = 3, 4
#: The name of the regions every tile holds, in a :class:`compiler.emit.MemoryFull` message.
EVERY_TILE = "every tile"
#: Largest rows/beats of a VEC (7-bit fields; the docs use 1..64).
MAX_COUNT = 64
#: exp2_neg(d, 15) is exactly 0 once d >= (15 + 2) << 10 (numerics.md, exp2).
EXP_ZERO_DISTANCE = (NUMERICS.gate_frac_bits + 2) << NUMERICS.exp_frac_bits
#: The left shift LOGIT may apply (the vector unit's limit).
MAX_LEFT = NUMERICS.logit_max_left_shift
G_BITS = NUMERICS.gate_frac_bits
SILU_ENTRIES = 256


def moe_tile_config(**overrides) -> TileConfig:
    """A tile for MoE: the whole 64 Ki-word scratchpad for weights and activations (the
    KV region shrunk to one page at the top), other fields as :class:`TileConfig`."""
    return TileConfig(**{"spad_words": 1 << 16, "num_pages": 1, "kv_sequences": 1,
                         "max_pages": 1, **overrides})


# --- the layer's integer parameters ---------------------------------------------------------

@dataclass(frozen=True)
class MoeLayer:
    """What the programs need from ``golden.moe``: shapes, the integer multipliers of every
    requantisation ``(mult, shift)``, the router's log2-logit multiplier and the SiLU
    tables (one per expert, routed then shared)."""

    hidden: int
    ffn: int
    experts: int
    shared: int
    top_k: int
    logit: tuple[int, int]
    gate: tuple[tuple[int, int], ...]
    up: tuple[tuple[int, int], ...]
    swiglu: tuple[tuple[int, int], ...]
    down: tuple[tuple[int, int], ...]
    out: tuple[int, int]
    silu: np.ndarray = field(repr=False)

    @property
    def total(self) -> int:
        """Routed plus shared experts."""
        return self.experts + self.shared

    @classmethod
    def from_golden(cls, weights: MoEWeights, scales: MoEScales, top_k: int) -> MoeLayer:
        e_all = weights.experts + weights.num_shared
        for name in ("w_gate", "w_up", "w_down", "gate_act", "up_act", "silu_act",
                     "hidden_act"):
            if np.shape(getattr(scales, name)) != (e_all,):
                raise ValueError(f"scale {name} must hold {e_all} per-expert values")
        if not 1 <= top_k <= weights.experts:
            raise ValueError(f"top_k {top_k} must be between 1 and the {weights.experts} "
                             f"experts")
        q = quantize_multiplier
        sx = scales.x
        gate = tuple(q(sx * scales.w_gate[e] / scales.gate_act[e]) for e in range(e_all))
        up = tuple(q(sx * scales.w_up[e] / scales.up_act[e]) for e in range(e_all))
        swiglu = tuple(q(scales.silu_act[e] * scales.up_act[e] / scales.hidden_act[e])
                       for e in range(e_all))
        down = tuple(q(scales.hidden_act[e] * scales.w_down[e] / scales.expert_out)
                     for e in range(e_all))
        silu = np.stack([silu_table(scales.gate_act[e], scales.silu_act[e])
                         for e in range(e_all)])
        logit = logit_multiplier(sx * scales.router * LOG2E * (1 << NUMERICS.exp_frac_bits))
        out = q(scales.expert_out / scales.out / (1 << G_BITS))
        return cls(weights.hidden, weights.ffn, weights.experts, weights.num_shared, top_k,
                   logit, gate, up, swiglu, down, out, silu)


def _code_bits(experts: int) -> int:
    """Bits of the expert code in the low byte of an encoded logit."""
    return max(1, (experts - 1).bit_length())


def layer_problems(config: TileConfig, layer: MoeLayer, top_k: int, tokens: int) -> list[str]:
    """Why a tile of ``config`` cannot run ``layer``'s gating and experts on blocks of
    ``tokens`` (either mapping): the top-k list, the expert codes, the slots, the
    instruction fields."""
    n, problems = config.n, []
    if top_k > default_max_top_k(n):
        problems.append(f"top_k {top_k} exceeds the vector unit's top-k list of "
                        f"{default_max_top_k(n)} entries (N = {n})")
    if layer.experts > 128:
        problems.append(f"{layer.experts} routed experts: the encoded logits hold at "
                        "most 128 expert codes in a byte")
    rows_max = min(n, tokens)
    if config.slots < max(rows_max, top_k):
        problems.append(f"the vector unit has {config.slots} slots; a token block needs "
                        f"{max(rows_max, top_k)} (min(N, tokens) and top_k)")
    for name, dim in (("hidden", layer.hidden), ("ffn", layer.ffn),
                      ("experts", layer.experts)):
        if dim > MAX_GEMM_DIM:
            problems.append(f"{name} {dim} exceeds a GEMM's 12-bit field")
        if ceil_div(dim, n) > MAX_COUNT:
            problems.append(f"{name} {dim} needs {ceil_div(dim, n)} beats of {n} lanes; a "
                            f"VEC has at most {MAX_COUNT}")
    return problems


def projection_problems(projection: Projection, hidden: int, tokens: int) -> list[str]:
    """Why the attention output and ``W_o`` of ``projection`` do not fit ``tokens`` tokens
    of a ``hidden``-channel layer."""
    attn_out, w_o = np.asarray(projection.o), np.asarray(projection.w_o)
    if attn_out.dtype != np.int8 or attn_out.ndim != 2 or attn_out.shape[0] != tokens:
        return [f"the attention output must be int8 ({tokens}, channels), got "
                f"{attn_out.shape} {attn_out.dtype}"]
    if w_o.dtype != np.int8 or w_o.shape != (attn_out.shape[1], hidden):
        return [f"w_o must be int8 ({attn_out.shape[1]}, {hidden}), got {w_o.shape} "
                f"{w_o.dtype}"]
    if attn_out.shape[1] > MAX_GEMM_DIM:
        return [f"{attn_out.shape[1]} attention output channels exceed a GEMM's 12-bit "
                "field"]
    return []


def _huge(router: np.ndarray, logit: tuple[int, int]) -> int:
    """A bound above the spread of any token's log2-domain router logits plus the
    distance at which exp2 is 0: adding it to the selected logits pushes every
    unselected exp to exactly 0 (static: from the router weights alone)."""
    bound = int((np.abs(router.astype(np.int64)).sum(axis=0) * 128).max())
    x_bound = int(to_log2_domain(np.int64(bound), *logit)) + 1
    return 2 * x_bound + EXP_ZERO_DISTANCE + 1


def _encoding(experts: int, tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(A2 (T, 2), B2 (2, E), cb): ``A2 @ B2`` = c8 = (E-1-e) + 2**cb·(t mod B), all int8."""
    cb = _code_bits(experts)
    batch = SILU_ENTRIES >> cb
    step = min(1 << cb, 64)
    a2 = np.stack([np.ones(tokens, np.int64),
                   (np.arange(tokens) % batch) * ((1 << cb) // step)], axis=1)
    b2 = np.stack([experts - 1 - np.arange(experts), np.full(experts, step)])
    return a2, b2, cb


def dense_masked_reference(x: np.ndarray, weights: MoEWeights, scales: MoEScales,
                           top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The chip's arithmetic in NumPy: (int8 output, dense gates G (T, E) Q0.15).

    Encoded logits, top-k by value, the 0/1 mask, ``x' = x + HUGE·sel``, softmax over all
    E lanes, and the combine over every expert with G (0 off the top-k). Equal to
    ``moe_layer(...).out`` (tests check it on every workload and on forced ties)."""
    layer = MoeLayer.from_golden(weights, scales, top_k)
    logits = router_logits(x, weights)
    tokens, experts = logits.shape
    a2, b2, _ = _encoding(experts, tokens)
    v = (logits.astype(np.int64) << 8) + a2 @ b2
    kth = -np.sort(-v, axis=1)[:, top_k - 1:top_k]
    sel = (v >= kth).astype(np.int64)
    xs = to_log2_domain(logits, *layer.logit) + _huge(weights.router, layer.logit) * sel
    p = exp2_neg(xs.max(axis=1, keepdims=True) - xs, G_BITS)
    gates = np.minimum(divide(p, p.sum(axis=1, keepdims=True), G_BITS), (1 << G_BITS) - 1)
    acc = np.zeros(x.shape, np.int64)
    for e in range(layer.total):
        y = expert_ffn(x, e, weights, scales).astype(np.int64)
        acc += (gates[:, e:e + 1] if e < experts else 1 << G_BITS) * y
    return requantize(wrap(acc, NUMERICS.acc_bits), *layer.out), gates


# --- memory ----------------------------------------------------------------------------------

def _bump(start: int, limit: int, memory: str, owner: str, banks: int = 1) -> Regions:
    """Consecutive regions of ``[start, limit)``; a GEMM's A operands start in bank
    ``banks / 2`` and its B operands in bank 0 (see :class:`compiler.emit.Regions`)."""
    return Regions([(start, limit)], memory, owner, banks=banks,
                   per_tile=owner != EVERY_TILE)


@dataclass
class _Words:
    """Scratchpad words the host writes on one tile."""

    n: int
    writes: dict[int, int] = field(default_factory=dict)

    def put(self, base: int, rows) -> None:
        """Words ``base + i`` from int8 lane values ``rows[i]`` (up to N each; as
        ``compiler.kv.pack_word``, vectorised)."""
        rows = list(rows)
        try:  # rows of one length: one array
            square = np.asarray(rows, np.int64)
        except ValueError:
            square = None
        if square is not None and square.ndim == 2 and square.shape[1] <= self.n:
            lanes = np.zeros((len(rows), self.n), np.int64)
            lanes[:, :square.shape[1]] = square
        else:
            rows = [np.asarray(row, np.int64) for row in rows]
            lanes = np.zeros((len(rows), self.n), np.int64)
            for i, row in enumerate(rows):
                if row.size > self.n:
                    pack_word(row, self.n)  # raises: too many lanes
                lanes[i, :row.size] = row
        if lanes.size and (lanes.min() < -128 or lanes.max() > 127):
            raise ValueError("a lane value is not int8")
        data = lanes.astype(np.int8).view(np.uint8)
        # Zero words too: the scratchpad keeps what earlier programs left there.
        if self.n == 8:  # a word is one little-endian uint64
            words = data.view("<u8").ravel().tolist()
        else:
            words = [int.from_bytes(row.tobytes(), "little") for row in data]
        self.writes.update(enumerate(words, base))


def _column_layout(matrix: np.ndarray, n: int) -> list[np.ndarray]:
    """GEMM ``b_rows = 0`` words of a (K, P) matrix: block t, row kk = ``B[kk, tN:tN+N]``."""
    k, p = matrix.shape
    words = []
    for t in range(ceil_div(p, n)):
        words += list(matrix[:, t * n:(t + 1) * n])
    return words


def _token_layout(x: np.ndarray, n: int) -> list[np.ndarray]:
    """GEMM ``a_rows = 0`` words of (T, K) rows: block b, column kk = ``x[bN:bN+N, kk]``."""
    t, k = x.shape
    words = []
    for b in range(ceil_div(t, n)):
        words += list(x[b * n:(b + 1) * n].T)
    return words


def _row_layout(matrix: np.ndarray, n: int) -> list[np.ndarray]:
    """Rows of ⌈K/N⌉ consecutive words of a (T, K) matrix: word ``t·⌈K/N⌉ + c`` =
    ``matrix[t, cN:cN+N]`` (what an indexed DMA moves, GEMM ``a_row_major``)."""
    chunks = ceil_div(matrix.shape[1], n)
    return [row[c * n:(c + 1) * n] for row in matrix for c in range(chunks)]


def _int8(values) -> np.ndarray:
    """0..255 byte values as int8 lanes (what SILU_LOAD's ``c & 255`` reads back)."""
    return ((np.asarray(values, np.int64) + 128) & 255) - 128


# --- the chip program ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ProjectionPrograms:
    """The programs of the round before a MoE round that computes the layer's input
    ``x = clamp(residual + rq(o · W_o))`` (attention's output projection): ``tiles``
    (the host's scratchpad words of both rounds go with these), ``x`` read back from the
    home tile's token rows (``output_words``, ``read_output``), and ``memory_words``, the
    words its programs load from the memory channels."""

    tiles: list[TileProgram]
    output_words: list[int]
    _reader: OutputRows = field(repr=False)
    memory_words: int = 0

    def read_output(self, words) -> np.ndarray:
        read = words if callable(words) else words.__getitem__
        return self._reader(read)


@dataclass(frozen=True)
class MoeChipProgram:
    """Per-tile programs of one MoE layer (see the module docstring).

    ``tiles[i]``: the :class:`TileProgram` of tile (i % k, i // k) — ``ops``,
    ``instructions`` (256-bit words from pc 0), ``spad_writes`` ({address: word} the host
    writes before ``start``; weights, tokens, constants), ``summary``. ``home``: the tile
    index that holds the tokens and the output; ``output_words`` (home scratchpad
    addresses) and ``read_output(words)`` (home's scratchpad as a sequence or a function
    address -> word) give the int8 (T, hidden) result. ``expert_tile[e]``: where expert e
    runs. ``summary``: see :func:`build_moe`. ``memory``: with streamed weights,
    {channel: {address: word}}, the image the host writes into the memory channels once
    (empty when every weight is written into the scratchpads). ``attention_words``:
    with a projection whose attention outputs the host writes (not handed over by the
    attention round), the words of each tile's ``spad_writes`` that hold them.
    ``handed``: the memory words an attention round stored that the programs load (a
    projection's ``fetch``), {channel: {address: word}}: for a functional model's run
    of this round alone, not the host's image. ``projection``: the programs of the
    round before this one, which computes the layer's input (:class:`ProjectionPrograms`;
    the host writes the scratchpad words of both rounds before it), or None: this
    round's programs compute it, or the host writes it."""

    config: TileConfig
    k: int
    home: int
    tiles: list[TileProgram]
    expert_tile: tuple[int, ...]
    output_words: list[int]
    output_shape: tuple[int, int]
    summary: dict
    _reader: OutputRows = field(repr=False)
    memory: dict[int, dict[int, int]] = field(default_factory=dict)
    attention_words: dict[int, range] = field(default_factory=dict)
    handed: dict[int, dict[int, int]] = field(default_factory=dict)
    projection: ProjectionPrograms | None = None

    def read_output(self, words) -> np.ndarray:
        read = words if callable(words) else words.__getitem__
        return self._reader(read)


@dataclass(frozen=True)
class WeightMemory:
    """The memory channels the MoE layer's weights stream from (``--weights streamed``):
    the mesh node of each channel and the words of its store. A tile's weights (its
    slice of ``W_o``, the router, its experts' matrices and SiLU tables) sit in the
    channel nearest it (fewest hops, the lower index on a tie), one after another; the
    tile loads them with memory DMAs."""

    nodes: tuple[tuple[int, int], ...]
    words: int

    def nearest(self, x: int, y: int) -> int:
        """The channel a tile at (x, y) loads from."""
        if not self.nodes:
            raise ValueError("streamed weights need memory channels; the chip has none")
        return nearest_channel(self.nodes, x, y)


@dataclass(frozen=True)
class Projection:
    """The attention output and its projection, for a MoE layer whose input the home tile
    computes (``golden.decoder.project_residual``): ``o`` (T, H·d_v) int8, ``w_o``
    (H·d_v, hidden) int8 and their scales. ``at``: where ``o`` is on every tile, row
    after row, when the projection reads it (the attention round's hand-off,
    ``compiler.chip.handoff_at``), or None (the host writes it; the sparse mapping
    only). ``fetch``: with ``at``, the attention round stored ``o`` in the memory
    channels instead, in parts ((tile, channel, first word, first row, rows) each):
    each part's tile loads it to its rows and multicasts it to the other tiles that
    project."""

    o: np.ndarray
    w_o: np.ndarray
    scales: ProjectionScales
    at: int | None = None
    fetch: tuple | None = None


def build_moe(config: TileConfig, k: int, weights: MoEWeights, scales: MoEScales,
              top_k: int, x: np.ndarray, projection: Projection | None = None
              ) -> MoeChipProgram:
    """Compile the MoE layer ``golden.moe.moe_layer(x, weights, scales, top_k)`` for a
    ``k`` x ``k`` chip of ``config`` tiles; ``x`` the int8 tokens (T, hidden). With
    ``projection``, ``x`` is the residual stream and the layer's input is computed on the
    home tile first: ``clamp(x + rq(o · W_o))`` (``golden.decoder``), then multicast.

    ``summary`` (a dict): ``macs_executed`` (every GEMM on every tile), ``macs_sparse``
    (what a sparse dispatch needs: the router, top_k routed experts and the shared ones per
    token), ``dense_over_sparse`` (their ratio), ``expert_macs_dense`` /
    ``expert_macs_sparse`` (the expert FFNs alone), ``network_words_sent`` (DMA words
    injected; a multicast counts once), ``network_words_delivered`` (per destination),
    ``network_words_sparse`` (a sparse dispatch of this batch's routing: each token to the
    tiles of its experts, each result back), ``instructions`` (per tile),
    ``instructions_by_opcode`` (per tile), ``experts_per_tile``, ``tokens``.
    ValueError before anything is built if the mesh, the tile or the shapes cannot run it.
    """
    build = _MoeBuild(config, k, MoeLayer.from_golden(weights, scales, top_k), weights,
                      top_k, np.asarray(x), projection)
    build.place()
    if projection is not None:
        build.emit_projection()
    build.emit_experts()
    build.emit_gating_and_combine()
    return build.program()


class _ExpertTiles:
    """What both mappings (this module's and ``compiler.moe_sparse``) do on the tiles
    that run experts: place the identity, the table-index constants, the SwiGLU
    activations and each expert's weights and SiLU table; load words into the
    accumulator; write the vector unit's SiLU table. The builds provide ``n``,
    ``tiles``, ``home``, ``spad``, ``words``, ``emitters``, ``plans``, ``weights``,
    ``layer``, ``hidden``, ``ffn``, ``hc``, ``fc``, ``a_bank``, ``b_bank``, ``r_load``,
    ``q_entries``, ``q_words`` and ``experts_on``."""

    home = 0

    def __init__(self, config: TileConfig, k: int, layer: MoeLayer, weights: MoEWeights,
                 top_k: int, x: np.ndarray, projection: Projection | None,
                 memory: WeightMemory | None = None):
        """The layer's shapes and sizes, after the tokens and the mesh are checked and
        the subclass's ``_check(x)`` has refused what else it cannot run; with
        ``projection``, ``x`` is the residual stream and ``self.x`` the layer's input
        (``golden.decoder.project_residual``); with ``memory``, the weights go into
        the memory image (``self.image``) and ``self.streams[key]`` lists the loads that
        bring them into their tile, (scratchpad address, channel, memory address,
        words) each: ``key`` an expert (its weights and SiLU table) or ``("front", t)``
        (what tile t needs first: its slice of ``W_o``, the router on home)."""
        self.config, self.k, self.layer, self.weights = config, k, layer, weights
        self.top_k, self.projection, self.memory = top_k, projection, memory
        self.image: dict[int, dict[int, int]] = {}
        self.streams: dict[object, list[tuple[int, int, int, int]]] = {}
        self.n = n = config.n
        if x.dtype != np.int8 or x.ndim != 2 or x.shape[1] != layer.hidden or x.shape[0] < 1:
            raise ValueError(f"x must be int8 (tokens >= 1, {layer.hidden}), got {x.shape} "
                             f"{x.dtype}")
        if not isinstance(k, int) or not 1 <= k <= 8:
            raise ValueError(f"the mesh side k must be 1..8, not {k!r}")
        self.tiles = k * k
        self.expert_tile = tuple(e % self.tiles for e in range(layer.total))
        self._check(x)
        self.tokens, self.hidden, self.ffn = x.shape[0], layer.hidden, layer.ffn
        self.experts = layer.experts
        self.residual = x
        if projection is not None:
            self.attn_out, self.w_o = np.asarray(projection.o), np.asarray(projection.w_o)
            x = project_residual(self.attn_out, self.w_o, x, projection.scales)
        self.x = x
        self.tb = ceil_div(self.tokens, n)  # token blocks of N rows
        self.hc, self.fc, self.ec = (ceil_div(self.hidden, n), ceil_div(self.ffn, n),
                                     ceil_div(self.experts, n))
        self.block_rows = [min(n, self.tokens - b * n) for b in range(self.tb)]
        self.r_load = min(n, config.slots)  # table entries one SILU_LOAD writes
        self.q_entries = ceil_div(SILU_ENTRIES, self.r_load)  # accumulator entries of a table
        self.q_words = ceil_div(self.q_entries, n) * n
        self.emitters = [Emitter(n) for _ in range(self.tiles)]

    def _check(self, x: np.ndarray) -> None:
        raise NotImplementedError

    def experts_on(self, t: int) -> list[int]:
        return [e for e in range(self.layer.total) if self.expert_tile[e] == t]

    def place_expert_weights(self, regions: list) -> None:
        """Per expert, in ``regions[tile]`` of its tile, its three weight matrices and
        its SiLU table (their words written by the host, or streamed)."""
        n, b_bank, q_words = self.n, self.b_bank, self.q_words
        self.w_addr, self.tbl_addr = {}, {}
        for t in range(self.tiles):
            spad = regions[t]
            for e in self.experts_on(t):
                wg = spad.take(self.fc * self.hidden, f"expert{e} gate weights", b_bank)
                wu = spad.take(self.fc * self.hidden, f"expert{e} up weights", b_bank)
                wd = spad.take(self.hc * self.ffn, f"expert{e} down weights", b_bank)
                self.w_addr[e] = (wg, wu, wd)
                self.tbl_addr[e] = spad.take(q_words, f"expert{e} SiLU table", b_bank)
                table = np.zeros((q_words, n), np.int64)
                for q in range(self.q_entries):
                    part = self.layer.silu[e][q * self.r_load:(q + 1) * self.r_load]
                    table[q, :len(part)] = part
                self._weight_words(t, e, [
                    (wg, _column_layout(self.weights.w_gate[e], n)),
                    (wu, _column_layout(self.weights.w_up[e], n)),
                    (wd, _column_layout(self.weights.w_down[e], n)),
                    (self.tbl_addr[e], table)])

    def place_expert_tiles(self, per_expert=None) -> None:
        """Per busy tile (and home): identity, table-index constants, SwiGLU activations;
        per expert ``per_expert(tile, regions, expert)``'s regions (the weights are
        :meth:`place_expert_weights`')."""
        n, a_bank, b_bank, q_words = self.n, self.a_bank, self.b_bank, self.q_words
        self.ident, self.iota, self.h_addr = {}, {}, {}
        iota_rows = np.zeros((q_words, n), np.int64)
        for q in range(self.q_entries):
            values = np.arange(q * self.r_load, min((q + 1) * self.r_load, SILU_ENTRIES))
            iota_rows[q, :len(values)] = _int8(values)
        for t in range(self.tiles):
            spad, words, mine = self.spad[t], self.words[t], self.experts_on(t)
            if not mine and t != self.home:
                continue
            self.ident[t] = spad.take(n, "identity", a_bank)
            words.put(self.ident[t], np.eye(n, dtype=np.int64))
            self.iota[t] = spad.take(q_words, "table-index constants", b_bank)
            words.put(self.iota[t], iota_rows)
            self.h_addr[t] = spad.take(self.fc * n, "SwiGLU activations", a_bank)
            if per_expert is not None:
                for e in mine:
                    per_expert(t, spad, e)

    def check_memory(self) -> None:
        """ValueError if a channel's share of the streamed weights outgrows its store."""
        full = {c: len(image) for c, image in self.image.items()
                if self.memory is not None and len(image) > self.memory.words}
        if full:
            raise ValueError("the weights do not fit the memory channels: "
                             + ", ".join(f"channel {c} needs {used} words, its store "
                                         f"holds {self.memory.words}"
                                         for c, used in sorted(full.items())))

    def _weight_words(self, t: int, key, regions: list) -> None:
        """Weights ((scratchpad address, rows) each) into tile t's scratchpad words, or
        with streamed weights into the image of the channel nearest t, with the loads
        that bring them in (``self.streams[key]``; regions adjacent in both memories
        share one load, of at most what a DMA and a read request carry)."""
        if self.memory is None:
            for address, rows in regions:
                self.words[t].put(address, rows)
            return
        channel = self.memory.nearest(t % self.k, t // self.k)
        image = self.image.setdefault(channel, {})
        loads = self.streams.setdefault(key, [])
        for address, rows in regions:
            words = _Words(self.n)
            words.put(address, rows)
            base, count = len(image), len(words.writes)
            image.update((base + a - address, w) for a, w in words.writes.items())
            last = loads[-1] if loads else None
            if last and last[0] + last[3] == address and last[2] + last[3] == base:
                loads[-1] = (*last[:3], last[3] + count)
            else:
                loads.append((address, channel, base, count))
        most = self.longest_load()
        split = []
        for address, channel, base, count in loads:
            split += [(address + i, channel, base + i, min(most, count - i))
                      for i in range(0, count, most)]
        loads[:] = split

    def longest_load(self) -> int:
        """The most words one memory load moves: what a DMA and a read request carry."""
        return min(MAX_DMA_LENGTH, (1 << length_bits(self.n)) - 1)

    def tile_programs(self, output_words: list[int], shape: tuple[int, int],
                      reader: OutputRows, host: bool = True) -> list[TileProgram]:
        """Every tile's program (its emitter's operations and a HALT), the output and its
        reader on the home tile, the host's scratchpad words (none unless ``host``);
        ValueError if one outgrows the program memory."""
        config, k, n = self.config, self.k, self.n
        programs = []
        for t in range(self.tiles):
            ops = self.emitters[t].halt()
            if len(ops) > config.program_depth:
                raise ValueError(f"tile {t} ({t % k}, {t // k}) needs {len(ops)} "
                                 f"instructions; the program memory holds program_depth = "
                                 f"{config.program_depth}")
            summary = summarise(config, ops, self.spad[t].end, config.acc_depth,
                                {"experts": len(self.experts_on(t))})
            at_home = t == self.home
            programs.append(TileProgram(
                config, "moe", encode_ops(ops), ops, self.words[t].writes if host else {},
                None, [], [], {},
                output_words if at_home else [], shape if at_home else (0,),
                summary, reader if at_home else OutputRows((0,), n, 0, [])))
        return programs

    def load_words(self, t: int, src: int, entry: int, count: int) -> None:
        """count words (a multiple of N) into count consecutive entries: I · words."""
        n = self.n
        self.emitters[t].gemm(a=self.ident[t], b=src, c=entry, m=n, k=n, p=count, a_rows=1,
                              b_rows=0)

    def load_table(self, t: int, value_entry: int | None) -> None:
        """Write the 256-entry SiLU table: from the plan's table entries, or one value
        entry (a_scalar: lane r of value_entry) into every slot."""
        plan = self.plans[t]
        for q in range(self.q_entries):
            rows = min(self.r_load, SILU_ENTRIES - q * self.r_load)
            a = plan["table"] + q if value_entry is None else value_entry
            self.emitters[t].vec(VOP.SILU_LOAD, rows, 1, a, a_scalar=1, c=plan["iota"] + q,
                                 lo=0, hi=1)


class _MoeBuild(_ExpertTiles):
    """The stages of :func:`build_moe` and the state they share: checks and sizes,
    scratchpad regions and host words, accumulator plans, then each tile's instructions
    (projection, expert FFNs and their DMAs, the home tile's gating and combine)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.dmas_to_home = 0

    def _check(self, x: np.ndarray) -> None:
        """Refuse what the mesh, the tile or the shapes cannot run (one ValueError naming
        every problem); the selection offset's multiplier and table value."""
        config, layer, top_k = self.config, self.layer, self.top_k
        problems = layer_problems(config, layer, top_k, x.shape[0])
        huge = _huge(self.weights.router, layer.logit)
        # x' = x + sel·SV·mult·2**16 by one LOGIT (mult 16 bits, SV an int8 table value).
        sel_mult = ceil_div(huge, (1 << MAX_LEFT) * 127)
        sel_value = ceil_div(huge, (1 << MAX_LEFT) * sel_mult)
        if sel_mult >= 1 << NUMERICS.requant_mult_bits or huge >= 1 << 44:
            problems.append(f"the router logits' spread needs an offset of {huge}, beyond "
                            "the lanes' range")
        if self.projection is not None:
            problems += self._projection_problems(x.shape[0])
        if problems:
            raise ValueError("cannot map this MoE layer: " + "; ".join(problems))
        self.sel_mult, self.sel_value = sel_mult, sel_value

    def _projection_problems(self, tokens: int) -> list[str]:
        n, hidden, slots = self.n, self.layer.hidden, self.config.slots
        problems = projection_problems(self.projection, hidden, tokens)
        if hidden % n:
            problems.append(f"the projection needs hidden ({hidden}) a multiple of N ({n})")
        if slots < n:
            problems.append(f"the projection's vector ops take N = {n} rows; the vector "
                            f"unit has {slots} slots")
        return problems

    # -- scratchpad and accumulator ----------------------------------------------------------

    def place(self) -> None:
        """Scratchpad regions (global ones at the same address on every tile, then each
        tile's own), the words the host writes, and each tile's accumulator plan."""
        config, n, k, home = self.config, self.n, self.k, self.home
        glob = _bump(0, config.kv_start, "scratchpad", EVERY_TILE, config.banks)
        self.a_bank, self.b_bank = config.banks // 2, 0  # where GEMM A and B operands start
        self.x_addr = glob.take(self.tb * self.hidden, "tokens", self.a_bank)
        self.y_stride = self.tb * self.hc * n
        self.y_addr = [glob.take(self.y_stride, f"expert{e} output", self.b_bank)
                       for e in range(self.layer.total)]
        self.out_addr = glob.take(self.y_stride, "output")
        self.spad = [_bump(glob.end, config.kv_start, "scratchpad",
                           f"tile {t} ({t % k}, {t // k})", config.banks)
                     for t in range(self.tiles)]
        self.words = [_Words(n) for _ in range(self.tiles)]
        if self.projection is None:
            self.words[home].put(self.x_addr, _token_layout(self.x, n))
        else:
            self._place_projection()
        self.place_expert_weights(self.spad)
        self.place_expert_tiles()
        self._place_router()
        self.plans = [self._acc_plan(t) for t in range(self.tiles)]

    def _place_projection(self) -> None:
        """The home tile computes x from the attention outputs, the residual and W_o."""
        spad, words, n = self.spad[self.home], self.words[self.home], self.n
        self.channels = self.attn_out.shape[1]
        self.o_addr = spad.take(self.tb * self.channels, "attention outputs", self.b_bank)
        self.res_addr = spad.take(self.tb * self.hidden, "residual stream", self.b_bank)
        self.wo_addr = spad.take(self.hc * self.channels, "output projection", self.a_bank)
        words.put(self.o_addr, _token_layout(self.attn_out, n))
        words.put(self.res_addr, _token_layout(self.residual, n))
        words.put(self.wo_addr, _column_layout(self.w_o, n))

    def _place_router(self) -> None:
        """Home: the router, the encoding constants, the accumulator constants."""
        spad, words, n = self.spad[self.home], self.words[self.home], self.n
        self.router_addr = spad.take(self.ec * self.hidden, "router weights", self.b_bank)
        words.put(self.router_addr, _column_layout(self.weights.router, n))
        a2, b2, self.cb = _encoding(self.experts, self.tokens)
        self.enc_a = spad.take(self.tb * 2, "encoding constants", self.a_bank)
        words.put(self.enc_a, _token_layout(a2, n))
        self.enc_b = spad.take(self.ec * 2, "encoding constants", self.b_bank)
        words.put(self.enc_b, _column_layout(b2, n))
        self.const_addr = spad.take(2 * n, "accumulator constants", self.b_bank)
        consts = np.zeros((2 * n, n), np.int64)
        consts[1] = self.sel_value
        consts[n:] = -128
        words.put(self.const_addr, consts)

    def _acc_plan(self, t: int) -> dict:
        """Entries of tile t's phases (they follow one another, so they overlap)."""
        n, depth, hc, home = self.n, self.config.acc_depth, self.hc, self.home
        bump = _bump(0, depth, "accumulator memory", f"tile {t}")
        plan = {"iota": bump.take(self.q_words, "table-index entries"),
                "table": bump.take(self.q_words, "SiLU table entries")}
        if t == home:
            plan["zero"] = bump.take(n, "constants")  # zero row, SV row
            plan["m128"] = bump.take(n, "constants")
        base = bump.end
        # FFN phase: g, u (y overlays them once h is out); y in column chunks.
        ffn_bump = _bump(base, depth, "accumulator memory", f"tile {t}")
        plan["g"] = ffn_bump.take(self.fc * n, "FFN gate")
        plan["u"] = ffn_bump.take(self.fc * n, "FFN up")
        plan["y_tiles"] = min(hc, (depth - plan["g"]) // n)
        if plan["y_tiles"] < 1:
            ffn_bump.take(n, "FFN output")
        if t == home and self.projection is not None:  # in chunks of channel tiles
            plan["p_tiles"] = min(hc, (depth - base) // n)
            plan["proj"] = _bump(base, depth, "accumulator memory",
                                 f"tile {t}").take(n, "projected attention")
        if t == home:
            gate_bump = _bump(base, depth, "accumulator memory", f"tile {t}")
            plan["r"] = gate_bump.take(self.ec * n, "router logits")
            plan["v"] = gate_bump.take(self.ec * n, "encoded logits")
            plan["s"] = gate_bump.take(self.ec * n, "top-k / selection")
            plan["k128"] = gate_bump.take(n, "top-k addresses")
            plan["max"] = gate_bump.take(1, "row max")
            plan["sum"] = gate_bump.take(1, "row sum")
            plan["gates"] = gate_bump.take(self.experts, "gate scalars")
            # The combine overlays r/v/s (dead by then): comb + y in column chunks.
            plan["c_tiles"] = min(hc, (plan["gates"] - base) // (2 * n))
            if plan["c_tiles"] < 1:
                gate_bump.take(2 * n, "combine buffers")
            plan["comb"] = base
            plan["yacc"] = base + plan["c_tiles"] * n
        return plan

    # -- instructions ----------------------------------------------------------------------

    def emit_projection(self) -> None:
        """x = clamp(residual + rq(o . W_o)) on the home tile, block by block."""
        n, hc, home = self.n, self.hc, self.home
        e, plan = self.emitters[home], self.plans[home]
        pm, ps = self.projection.scales.multiplier()
        proj, chunk = plan["proj"], plan["p_tiles"]
        for b, rows in enumerate(self.block_rows):
            for j0 in range(0, hc, chunk):
                width = min(chunk, hc - j0)
                every = {"lo": 0, "hi": width * n}
                # The transposed product x^T = W_o^T . o^T: entry proj + c holds channel
                # j0·N + c of the block's tokens (one per lane), as x's token words do.
                e.gemm(a=self.wo_addr + j0 * self.channels, b=self.o_addr + b * self.channels,
                       c=proj, m=width * n, k=self.channels, p=rows, a_rows=0, b_rows=0)
                e.vec(VOP.REQUANT, n, width, proj, mult=pm, shift=ps, dst=proj,
                      dst_kind=VecDst.TILE, **every)
                # + the residual's token words (I . words, accumulated), then the clamp.
                e.gemm(a=self.ident[home], b=self.res_addr + b * self.hidden + j0 * n,
                       c=proj, m=n, k=n, p=width * n, a_rows=1, b_rows=0, accumulate=1,
                       acc_shift=0)
                e.vec(VOP.REQUANT, n, width, proj, mult=IDENTITY[0], shift=IDENTITY[1],
                      dst=self.x_addr + b * self.hidden + j0 * n, dst_kind=VecDst.SPAD,
                      **every)

    def emit_experts(self) -> None:
        """Home multicasts the tokens; each expert tile waits for them, runs its experts'
        FFNs and sends each result home."""
        home, k, tb, hidden = self.home, self.k, self.tb, self.hidden
        others = [t for t in range(self.tiles) if t != home and self.experts_on(t)]
        if others:
            mask = sum(tile_bit(t % k, t // k) for t in others)
            for start in range(0, tb * hidden, MAX_DMA_LENGTH):
                self.emitters[home].dma(src=self.x_addr + start, dst=self.x_addr + start,
                                        length=min(MAX_DMA_LENGTH, tb * hidden - start),
                                        tiles=mask, remote_signal=1,
                                        remote_semaphore=SEM_TOKENS)
        token_dmas = ceil_div(tb * hidden, MAX_DMA_LENGTH) if others else 0
        for t in range(self.tiles):
            e, mine = self.emitters[t], self.experts_on(t)
            if not mine:
                continue
            if t != home:
                e.wait_arrivals(SEM_TOKENS, token_dmas)
            self.load_words(t, self.iota[t], self.plans[t]["iota"], self.q_words)
            for ex in mine:
                self._expert_ffn(t, ex)
                if t != home:
                    self._send_home(t, ex)

    def _expert_ffn(self, t: int, ex: int) -> None:
        n, hidden, ffn, hc, fc = self.n, self.hidden, self.ffn, self.hc, self.fc
        e, plan, layer = self.emitters[t], self.plans[t], self.layer
        wg, wu, wd = self.w_addr[ex]
        self.load_words(t, self.tbl_addr[ex], plan["table"], self.q_words)
        self.load_table(t, None)
        (gm, gs), (um, us) = layer.gate[ex], layer.up[ex]
        (hm, hs), (dm, ds) = layer.swiglu[ex], layer.down[ex]
        chunk = plan["y_tiles"]
        for b, rows in enumerate(self.block_rows):
            xa = self.x_addr + b * hidden
            e.gemm(a=xa, b=wg, c=plan["g"], m=rows, k=hidden, p=ffn, a_rows=0, b_rows=0)
            e.gemm(a=xa, b=wu, c=plan["u"], m=rows, k=hidden, p=ffn, a_rows=0, b_rows=0)
            e.vec(VOP.REQUANT, rows, fc, plan["g"], mult=gm, shift=gs, dst=plan["g"],
                  dst_kind=VecDst.TILE, lo=0, hi=fc * n)
            e.vec(VOP.REQUANT, rows, fc, plan["u"], mult=um, shift=us, dst=plan["u"],
                  dst_kind=VecDst.TILE, lo=0, hi=fc * n)
            e.vec(VOP.SWIGLU, rows, fc, plan["g"], b=plan["u"], mult=hm, shift=hs, sat=1,
                  dst=self.h_addr[t], dst_kind=VecDst.SPAD, lo=0, hi=fc * n)
            for j0 in range(0, hc, chunk):
                width = min(chunk, hc - j0)
                cols = min(width * n, hidden - j0 * n)
                e.gemm(a=self.h_addr[t], b=wd + j0 * ffn, c=plan["g"], m=rows, k=ffn,
                       p=cols, a_rows=1, b_rows=0)
                e.vec(VOP.REQUANT, rows, width, plan["g"], mult=dm, shift=ds,
                      dst=self.y_addr[ex] + b * hc * n + j0 * rows, dst_kind=VecDst.SPAD,
                      lo=0, hi=width * n)

    def _send_home(self, t: int, ex: int) -> None:
        home_mask = tile_bit(self.home % self.k, self.home // self.k)
        y = self.y_addr[ex]
        for start in range(0, self.y_stride, MAX_DMA_LENGTH):
            self.emitters[t].dma(src=y + start, dst=y + start,
                                 length=min(MAX_DMA_LENGTH, self.y_stride - start),
                                 tiles=home_mask, remote_signal=1,
                                 remote_semaphore=SEM_RESULTS)
            self.dmas_to_home += 1

    def emit_gating_and_combine(self) -> None:
        """Home: per token block the router's gates, then the gated sum of the experts'
        outputs (the first remote result waited for once)."""
        home, n = self.home, self.n
        plan = self.plans[home]
        if not self.experts_on(home):
            self.load_words(home, self.iota[home], plan["iota"], self.q_words)
        self.load_words(home, self.const_addr, plan["zero"], 2 * n)
        self.load_table(home, plan["zero"])  # clear the SiLU table (the experts' last one)
        order = self.experts_on(home) + [ex for ex in range(self.layer.total)
                                         if self.expert_tile[ex] != home]
        self.waited = False
        for b, rows in enumerate(self.block_rows):
            self._emit_gates(b, rows)
            self._emit_combine(b, rows, order)

    def _emit_gates(self, b: int, rows: int) -> None:
        """Router logits, top-k selection (the SiLU table marks the chosen experts),
        softmax over the selected logits, one gate scalar per expert."""
        n, ec, experts, top_k = self.n, self.ec, self.experts, self.top_k
        e, plan = self.emitters[self.home], self.plans[self.home]
        zero, sv = plan["zero"], plan["zero"] + 1
        xa = self.x_addr + b * self.hidden
        r, v, s = plan["r"], plan["v"], plan["s"]
        e.gemm(a=xa, b=self.router_addr, c=r, m=rows, k=self.hidden, p=experts, a_rows=0,
               b_rows=0)
        e.gemm(a=xa, b=self.router_addr, c=v, m=rows, k=self.hidden, p=experts, a_rows=0,
               b_rows=0)
        e.gemm(a=self.enc_a + 2 * b, b=self.enc_b, c=v, m=rows, k=2, p=experts, a_rows=0,
               b_rows=0, accumulate=1, acc_shift=8)
        lanes = {"lo": 0, "hi": experts}
        e.vec(VOP.TOPK, rows, ec, v, imm=0, dst=s, dst_kind=VecDst.TILE, **lanes)
        e.vec(VOP.ADD, rows, 1, s + (ec - 1) * n, b=plan["m128"], dst=plan["k128"],
              dst_kind=VecDst.TILE, lo=0, hi=n)
        batch = min(SILU_ENTRIES >> self.cb, n)
        for o in range(0, rows, batch):
            group = range(o, min(rows, o + batch))
            for row in group:  # table[c8 of each chosen expert] = SV
                e.vec(VOP.SILU_LOAD, top_k, 1, sv, a_scalar=1, c=plan["k128"] + row,
                      lo=0, hi=1)
            e.vec(VOP.SILU, len(group), ec, v + o, dst=s + o, dst_kind=VecDst.TILE, **lanes)
            for row in group:
                e.vec(VOP.SILU_LOAD, top_k, 1, zero, a_scalar=1, c=plan["k128"] + row,
                      lo=0, hi=1)
        lm, ls = self.layer.logit
        e.vec(VOP.LOGIT, rows, ec, r, mult=lm, shift=ls, imm=NEG_INF, dst=r,
              dst_kind=VecDst.TILE, **lanes)
        e.vec(VOP.LOGIT, rows, ec, s, mult=self.sel_mult, shift=-MAX_LEFT, imm=NEG_INF,
              dst=s, dst_kind=VecDst.TILE, **lanes)
        e.vec(VOP.ADD, rows, ec, r, b=s, dst=r, dst_kind=VecDst.TILE, **lanes)
        e.vec(VOP.MAX, rows, ec, r, imm=NEG_INF, total=plan["max"], total_write=1, **lanes)
        e.vec(VOP.EXP, rows, ec, r, c=plan["max"], shift=G_BITS, dst=r,
              dst_kind=VecDst.TILE, total=plan["sum"], total_write=1, **lanes)
        e.vec(VOP.RECIP, rows, 1, plan["sum"], a_scalar=1, c=plan["sum"], lo=0, hi=1)
        e.vec(VOP.DIV, rows, ec, r, shift=G_BITS, sat=1, dst=r, dst_kind=VecDst.TILE,
              **lanes)
        for ex in range(experts):
            e.vec(VOP.SUM, rows, 1, r + (ex // n) * n, total=plan["gates"] + ex,
                  total_write=1, lo=ex % n, hi=ex % n + 1)

    def _emit_combine(self, b: int, rows: int, order: list[int]) -> None:
        """comb = sum over experts of G·y (+ y_shared << 15), in column chunks, then the
        output requantised into the block's output words."""
        n, hc, home = self.n, self.hc, self.home
        e, plan = self.emitters[home], self.plans[home]
        chunk = plan["c_tiles"]
        for j0 in range(0, hc, chunk):
            width = min(chunk, hc - j0)
            cols = min(width * n, self.hidden - j0 * n)
            comb, yacc = plan["comb"], plan["yacc"]
            for i, ex in enumerate(order):
                if self.expert_tile[ex] != home and not self.waited:
                    e.wait_arrivals(SEM_RESULTS, self.dmas_to_home)
                    self.waited = True
                e.gemm(a=self.ident[home], b=self.y_addr[ex] + b * hc * n + j0 * rows,
                       c=yacc, m=rows, k=rows, p=cols, a_rows=1, b_rows=0)
                e.vec(VOP.LOGIT, rows, width, yacc, mult=1, shift=-G_BITS, imm=NEG_INF,
                      dst=yacc, dst_kind=VecDst.TILE, lo=0, hi=width * n)
                gate = ({"c": plan["gates"] + ex} if ex < self.experts
                        else {"imm": 1 << G_BITS})
                first = {"b": plan["zero"], "b_scalar": 1} if i == 0 else {"b": comb}
                e.vec(VOP.RESCALE, rows, width, yacc, **first, **gate, dst=comb,
                      dst_kind=VecDst.TILE, lo=0, hi=width * n)
            om, osh = self.layer.out
            e.vec(VOP.REQUANT, rows, width, comb, mult=om, shift=osh,
                  dst=self.out_addr + b * hc * n + j0 * rows, dst_kind=VecDst.SPAD, lo=0,
                  hi=width * n)

    def program(self) -> MoeChipProgram:
        """Every tile's program (the output and its reader on the home tile) and the
        chip's summary; ValueError if a program outgrows the program memory."""
        n, hc, k, home, config = self.n, self.hc, self.k, self.home, self.config
        shape = (self.tokens, self.hidden)
        output_words = [self.out_addr + b * hc * n + j * rows + r_
                        for b, rows in enumerate(self.block_rows)
                        for j in range(hc) for r_ in range(rows)]
        reader = OutputRows(shape, n, self.hidden, [
            ((b * n + r_,), [self.out_addr + b * hc * n + j * rows + r_ for j in range(hc)])
            for b, rows in enumerate(self.block_rows) for r_ in range(rows)])
        programs = self.tile_programs(output_words, shape, reader)
        projection_macs = (0 if self.projection is None
                           else self.tokens * self.channels * self.hidden)
        summary = _chip_summary(self.layer, self.weights, self.x, programs, self.expert_tile,
                                self.tiles, home, k, projection_macs)
        attention = ({} if self.projection is None else
                     {home: range(self.o_addr, self.o_addr + self.tb * self.channels)})
        return MoeChipProgram(config, k, home, programs, self.expert_tile, output_words,
                              shape, summary, reader, attention_words=attention)


def _chip_summary(layer: MoeLayer, weights: MoEWeights, x: np.ndarray,
                  programs: list[TileProgram], expert_tile, tiles: int, home: int,
                  k: int, projection_macs: int) -> dict:
    tokens, hidden, ffn = x.shape[0], layer.hidden, layer.ffn
    per_expert = 3 * tokens * hidden * ffn
    router = tokens * hidden * layer.experts
    executed = sum(p.summary.macs for p in programs)
    sparse_experts = (layer.top_k + layer.shared) * tokens * 3 * hidden * ffn
    sparse = projection_macs + router + sparse_experts
    sent = delivered = 0
    for p in programs:
        for op, f in p.ops:
            if op == Opcode.DMA:
                sent += f["length"]
                delivered += f["length"] * bin(f["tiles"]).count("1")
    # A sparse dispatch of this batch: each token to the tiles of its chosen experts
    # (other than home), each chosen expert's row back; shared experts see every token.
    chosen = topk(router_logits(x, weights), layer.top_k)
    words_per_row = ceil_div(hidden, programs[0].config.n)
    sparse_words = 0
    for t in range(tokens):
        experts = set(int(e) for e in chosen[t]) | set(range(layer.experts, layer.total))
        remote = [e for e in experts if expert_tile[e] != home]
        sparse_words += words_per_row * (len({expert_tile[e] for e in remote}) + len(remote))
    return {
        "tokens": tokens, "mesh": f"{k}x{k}", "home": home,
        "macs_executed": executed, "macs_sparse": sparse,
        "dense_over_sparse": executed / sparse,
        "expert_macs_dense": layer.total * per_expert,
        "expert_macs_sparse": sparse_experts,
        "expert_dense_over_sparse": layer.total * per_expert / sparse_experts,
        "overhead_macs": executed - layer.total * per_expert,
        "projection_macs": projection_macs,
        "network_words_sent": sent, "network_words_delivered": delivered,
        "network_words_sparse": sparse_words,
        "instructions": [p.summary.length for p in programs],
        "instructions_by_opcode": [dict(p.summary.instructions) for p in programs],
        "vec_ops": [dict(p.summary.vec_ops) for p in programs],
        "experts_per_tile": [sum(1 for t in expert_tile if t == i) for i in range(tiles)],
        "scratchpad_words": [p.summary.spad_words for p in programs],
    }


def moe_from_workload(config: TileConfig, workload, k: int = 2,
                      tokens: int | None = None) -> MoeChipProgram:
    """:func:`build_moe` of a golden ``Workload``'s MoE layer on its first ``tokens``
    MoE tokens (all of ``moe.x`` by default)."""
    x = workload.tensors["moe.x"]
    x = x if tokens is None else x[:tokens]
    return build_moe(config, k, workload.moe_weights(), workload.moe_scales(),
                     workload.config.top_k, x)


def run_on_chip_model(program: MoeChipProgram, chip=None, projected: bool = False):
    """Run ``program`` on ``golden.chip_model.ChipModel`` (a fresh one sized by the config,
    with the channels its memory image names, unless given): the memory image and the
    host writes, every tile's instructions — after its projection round's
    (:func:`run_projection_on_chip_model`), unless ``projected`` (``chip`` ran it) —
    then the reader on the home tile. Returns (output, chip). ValueError if a tile does
    not halt with its semaphores back at zero."""
    if program.projection is None:
        chip = _loaded_model(program, chip)
    elif not projected:
        _, chip = run_projection_on_chip_model(program, chip)
    elif chip is None:
        raise ValueError("a MoE round after its projection round runs on the chip that ran it")
    _run_tiles(chip, program.tiles)
    return program.read_output(chip.tiles[program.home].spad), chip


def run_projection_on_chip_model(program: MoeChipProgram, chip=None):
    """Run the round before ``program`` (:attr:`MoeChipProgram.projection`) as
    :func:`run_on_chip_model` runs a round; returns (the layer's input read from the
    home tile, chip)."""
    chip = _loaded_model(program, chip)
    _run_tiles(chip, program.projection.tiles)
    return program.projection.read_output(chip.tiles[program.home].spad), chip


def _loaded_model(program: MoeChipProgram, chip=None):
    """``chip`` (or a fresh ``golden.chip_model.ChipModel`` for ``program``) with the
    program's memory image and the host's scratchpad words written."""
    from golden.chip_model import ChipModel

    cfg = program.config
    if chip is None:
        chip = ChipModel(program.k, n=cfg.n, spad_words=cfg.spad_words,
                         acc_depth=cfg.acc_depth, slots=cfg.slots,
                         memory_channels=1 + max([*program.memory, *program.handed],
                                                 default=-1),
                         channel_words=1 << MEM_ADDR_BITS
                         if program.memory or program.handed else 0)
    for image in (program.memory, program.handed):
        for channel, words in image.items():
            chip.channels[channel].update(words)
    first = program.tiles if program.projection is None else program.projection.tiles
    for tile, p in zip(chip.tiles, first, strict=True):
        for address, word in p.spad_writes.items():
            tile.spad[address] = word
    return chip


def _run_tiles(chip, programs: list[TileProgram]) -> None:
    """Run one program a tile on ``chip``; ValueError unless each halts with its
    semaphores back at zero."""
    chip.run([p.ops for p in programs])
    for i, tile in enumerate(chip.tiles):
        if not tile.halted:
            raise ValueError(f"tile {i} ended without HALT")
        if any(tile.semaphores):
            raise ValueError(f"tile {i}: semaphores not balanced at HALT: {tile.semaphores}")


def executed_macs(chip, since: list[int] | None = None) -> int:
    """m·k·p of every GEMM the tiles of a ``golden.chip_model.ChipModel`` dispatched
    (registers added; ``since``: from each tile's operation ``since[t]`` on): what
    their ``macs`` counters count on the RTL."""
    since = since or [0] * len(chip.tiles)
    return sum(f["m"] * f["k"] * f["p"] for tile, first in zip(chip.tiles, since, strict=True)
               for op, f in tile.issued[first:] if op == "GEMM")


def executed_acc_accesses(chip, since: list[int] | None = None) -> tuple[int, int]:
    """The accumulator entries the engine operations the tiles of a
    ``golden.chip_model.ChipModel`` dispatched read and write (``since`` as for
    :func:`executed_macs`): what their ``acc_reads`` and ``acc_writes`` count."""
    since = since or [0] * len(chip.tiles)
    reads = writes = 0
    for tile, first in zip(chip.tiles, since, strict=True):
        for op, f in tile.issued[first:]:
            r, w = acc_accesses(op, f, tile.n)
            reads, writes = reads + r, writes + w
    return reads, writes


def check_chip_synchronisation(program: MoeChipProgram) -> None:
    """``compiler.hazards.check_synchronisation`` on every tile's program. The WAITs on
    arrival semaphores (raised by other tiles' DMAs, which the single-tile checker cannot
    see) are left out; they order reads of arrived words, which no local engine writes."""
    for i, p in enumerate(program.tiles):
        local = [(op, f) for op, f in p.ops
                 if not (op == Opcode.WAIT and f["semaphore"] in (SEM_TOKENS, SEM_RESULTS))]
        try:
            check_synchronisation(local, program.config.n)
        except ValueError as error:
            raise ValueError(f"tile {i}: {error}") from None
