"""The tile instruction set, defined once: the sequencer decodes these layouts and the
program builder encodes with them (see docs/isa.md).

An instruction is one 256-bit word: a 4-bit :class:`Opcode` in the low bits, then the
operation's fields (:data:`INSTRUCTION`, a struct of the opcode and a union of one
layout per operation). Engine operations (GEMM, VEC, DMA) carry a :data:`SIGNAL` field:
when the engine finishes the operation, the tile increments that local semaphore.

Two memories are named: the scratchpad (``ADDR_BITS`` word addresses, a word holds N
int8 values) and the accumulator memory (``ACC_ADDR_BITS`` entry addresses, an entry
holds N signed 48-bit lanes), where GEMM results land and vector operations work.

Programs follow data through :data:`REGISTERS` scalar registers: SET, ADD and LOAD (two
bytes of a scratchpad word) write them, LOOP and SKIP branch on them, and WITH adds them
to fields of the instruction after it (:data:`WITH_FIELDS`), so one instruction can run
at addresses, counts and destination tiles computed at run time.
"""

from __future__ import annotations

from enum import Enum as PyEnum

from amaranth import Shape, signed, unsigned
from amaranth.lib import data, enum

__all__ = [
    "ACC_ADDR_BITS", "ADDR_BITS", "CHANNEL_BITS", "EMPTY_ENTRY", "ENTRY_BITS", "ENTRY_ROW_BITS",
    "INSTRUCTION", "INSTRUCTION_BITS", "MASK_COLUMNS", "MEM_ADDR_BITS", "PC_BITS", "REGISTERS",
    "REG_BITS", "SEMAPHORES", "SIGNAL", "WITH_FIELDS", "WITH_SLOTS", "AddArgs", "DmaArgs",
    "DmaTarget", "GemmArgs", "IdmaArgs", "LoadArgs", "LoopArgs", "Opcode", "SetArgs",
    "SkipArgs", "VecArgs", "VecDst", "VecPack", "WaitArgs", "WithArgs", "decode", "encode",
    "entries_per_word", "field_width", "index_entry", "mesh_mask", "tile_bit", "tile_index"
]

#: Width of an instruction word.
INSTRUCTION_BITS = 256
#: Scratchpad word address width (a tile addresses at most 2**16 words).
ADDR_BITS = 16
#: Accumulator-memory entry address width (at most 1024 entries of N x 48 bits).
ACC_ADDR_BITS = 10
#: Width of a GEMM's m, k, p and of a DMA's length.
DIM_BITS = 12
#: Largest GEMM dimension one instruction takes.
MAX_GEMM_DIM = (1 << DIM_BITS) - 1
#: Most words one DMA instruction moves.
MAX_DMA_LENGTH = (1 << DIM_BITS) - 1
#: Width of a vector instruction's row and beat counts (1..127 each).
COUNT_FIELD_BITS = 7
#: Width of a vector instruction's signed key bounds (see :class:`VecArgs`).
BOUND_BITS = 13
#: Semaphore counters per tile; a semaphore is named by a 4-bit index.
SEMAPHORES = 16
#: Scalar registers per tile (r0..r7, all 0 when a program starts) and their width.
REGISTERS = 8
REG_BITS = 16
#: Width of a branch target (program memories of up to 2**16 instructions).
PC_BITS = 16
#: Width of a semaphore count (the counters themselves are this wide).
COUNT_BITS = 16
#: Mesh coordinates are 3 bits each (meshes up to 8 x 8); a tile set is a 64-bit mask,
#: bit :func:`tile_index` ``(x, y)`` for tile (x, y).
TILE_MASK_BITS = 64
#: Columns of a tile mask's grid (a tile's bit index is ``y * MASK_COLUMNS + x``).
MASK_COLUMNS = 8
#: Memory channels a DMA can name, and the width of a word address in a channel.
CHANNEL_BITS = 3
MEM_ADDR_BITS = 24


def tile_index(x: int, y: int) -> int:
    """The bit of tile (x, y) in a tile mask, as an index."""
    return y * MASK_COLUMNS + x


def tile_bit(x: int, y: int) -> int:
    """The tile mask naming tile (x, y) alone."""
    return 1 << tile_index(x, y)


def mesh_mask(mesh: tuple[int, int]) -> int:
    """The tile mask naming every tile of a (columns, rows) mesh."""
    columns, rows = mesh
    return sum(tile_bit(x, y) for y in range(rows) for x in range(columns))


class Opcode(enum.Enum, shape=4):
    """Operation codes. 0 and 15 are illegal, so a word of zeros never executes."""

    HALT = 1  # stop; the sequencer reports `halted`
    NOP = 2
    GEMM = 3  # tensor-core GEMM between scratchpad regions
    VEC = 4  # vector-unit operation between scratchpad regions
    DMA = 5  # copy a scratchpad region to a set of tiles' scratchpads (this one included)
    WAIT = 6  # block until a semaphore reaches a count, then subtract the count
    SIGNAL = 7  # add a count to a local semaphore
    SET = 8  # write a register
    ADD = 9  # a register plus a signed immediate into a register
    LOOP = 10  # count a register up; branch back while it is below a limit register
    SKIP = 11  # branch when one register is at least another
    WITH = 12  # add registers to fields of the next instruction
    LOAD = 13  # two bytes of a scratchpad word into a register
    IDMA = 14  # DMA rows listed in an index table (gather, or scatter into rows)


#: Optional completion signal of an engine operation.
SIGNAL = data.StructLayout({"enable": 1, "semaphore": unsigned(4)})


class GemmArgs(data.StructLayout):
    """C[m x p] (+)= A[m x k] · B[k x p]: scratchpad operands, C in the accumulator memory.

    Operand layouts (N = the tensor core size, ⌈x⌉ = ceil(x / N)):

    - ``a_rows = 0``: ⌈m⌉ blocks of k words, word = a column of an N-row block of A
      (``A[rows, kk]``, the tensor core's beat); ``a_rows = 1``: A row-major in chunks,
      word ``a + c·m + i`` = ``A[i, c·N : c·N + N]`` (⌈k⌉ chunks of m words); with
      ``a_row_major`` as well, row after row: word ``a + i·⌈k⌉ + c`` (a row is ⌈k⌉
      consecutive words, the rows an indexed DMA moves; ``a_row_major`` without
      ``a_rows`` changes nothing).
    - ``b_rows = 0``: ⌈p⌉ blocks of k words, word = a row of an N-column block of B
      (with a ``b_stride`` s > 0, B row after row instead: word ``b + kk·s + t`` =
      ``B[kk, t·N : t·N + N]``, rows s words apart as an indexed DMA leaves them, the
      region ``(k - 1)·s + ⌈p⌉`` words; ignored with ``b_rows``);
      ``b_rows = 1``: Bᵀ row-major in chunks, word ``b + c·p + j`` = ``B[c·N : c·N + N, j]``
      (a KV page: one word per key per chunk of N channels).
    - ``a_limbs = 1``: A is joined from two int8 limb regions of the same layout,
      ``A = A_hi·2⁷ + A_lo`` with the high limbs at ``a`` and the low limbs at ``a_lo``
      (a probability of 14 bits, multiplied in one pass; int32 products and sums wrap
      as always). ``a_lo`` is ignored when ``a_limbs = 0``.
    - C: tile (ti, tj), row r at entry ``c + (ti·⌈p⌉ + tj)·N + r``, N int32 results
      sign-extended to 48 bits; ``accumulate`` adds to the entry shifted left by
      ``acc_shift`` instead: ``C = (C << acc_shift) + A·B``.
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "a": unsigned(ADDR_BITS),
            "b": unsigned(ADDR_BITS),
            "c": unsigned(ACC_ADDR_BITS),
            "m": unsigned(DIM_BITS),
            "k": unsigned(DIM_BITS),
            "p": unsigned(DIM_BITS),
            "a_rows": 1,
            "b_rows": 1,
            "accumulate": 1,
            "acc_shift": unsigned(4),
            "a_limbs": 1,
            "a_lo": unsigned(ADDR_BITS),
            "a_row_major": 1,
            "b_stride": unsigned(COUNT_FIELD_BITS),
        })


class VecDst(enum.Enum, shape=2):
    """Where a vector instruction's lanes go."""

    TILE = 0  # accumulator entries, the C-tile layout
    SCALAR = 1  # lane 0 of each row into lane (row mod N) of entry dst + row // N
    SPAD = 2  # scratchpad words: word dst + beat·rows + row, or dst + row·stride + beat
    #           with a dst_stride (see VecPack)
    NONE = 3  # nothing (only the total, or only the unit's slot state, is wanted)


class VecPack(enum.Enum, shape=2):
    """How a lane becomes a byte of a scratchpad word (``VecDst.SPAD``)."""

    BYTE = 0  # bits 0-7 (an int8 result, e.g. REQUANT)
    LIMB_LO = 1  # bits 0-6, zero-extended (low 7-bit limb of a probability)
    LIMB_HI = 2  # bits 7-13, zero-extended (high limb)


class VecArgs(data.StructLayout):
    """One vector-unit op over ``rows`` x ``beats`` beats (row r uses slot ``slot + r``).

    Beat (r, j) reads lanes ``a`` (entry ``a + (r // N)·beats·N + j·N + r mod N``, the C
    tile layout; with ``a_scalar``, lane ``r mod N`` of entry ``a + r // N`` into lane 0
    and the other lanes disabled), the same for ``b``, and ``c`` (lane ``r mod N`` of
    entry ``c + r // N``, or ``imm`` when ``c_imm``). Lane i is enabled iff
    ``lo + r·causal <= j·N + i < hi + r·causal`` (signed bounds: a key window relative to
    the block, stepping one key per row for a causal prefill). ``first`` is set on beat 0
    of every row. Results: lanes to ``dst`` as ``dst_kind`` says; the row's final
    ``total`` into lane ``r mod N`` of entry ``total + r // N`` when ``total_write``.
    Scratchpad words (``SPAD``) are chunk-major, word ``dst + j·rows + r``, or with a
    ``dst_stride`` s > 0 row after row, word ``dst + r·s + j`` (the region is then
    ``(rows - 1)·s + beats`` words).
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "op": unsigned(4),  # rtl.vector_unit.VectorOpcode
            "a": unsigned(ACC_ADDR_BITS),
            "a_scalar": 1,
            "b": unsigned(ACC_ADDR_BITS),
            "b_scalar": 1,
            "c": unsigned(ACC_ADDR_BITS),
            "c_imm": 1,
            "imm": signed(48),
            "dst": unsigned(ADDR_BITS),
            "dst_kind": VecDst,
            "pack": VecPack,
            "total": unsigned(ACC_ADDR_BITS),
            "total_write": 1,
            "rows": unsigned(COUNT_FIELD_BITS),
            "beats": unsigned(COUNT_FIELD_BITS),
            "slot": unsigned(6),
            "mult": unsigned(16),
            "shift": signed(7),
            "sat": 1,
            "lo": signed(BOUND_BITS),
            "hi": signed(BOUND_BITS),
            "causal": 1,
            "dst_stride": unsigned(COUNT_FIELD_BITS),
        })


class DmaTarget(enum.Enum, shape=2):
    """Where a DMA moves words: between scratchpads, or to or from a memory channel."""

    TILES = 0  # from ``src`` here to ``dst`` on every tile of ``tiles``
    STORE = 1  # from ``src`` here into memory channel ``channel`` from ``mem_addr`` on
    LOAD = 2  # from memory channel ``channel``'s ``mem_addr`` on into ``dst`` here


class DmaArgs(data.StructLayout):
    """Copy ``length`` words; ``target`` says between what (:class:`DmaTarget`).

    TILES: from local ``src`` to ``dst`` on every tile in ``tiles``; on arrival at each
    destination, that tile's semaphore ``remote_semaphore`` is incremented when
    ``remote_signal`` is set. ``length`` 0 sends only the signal.

    STORE: from local ``src`` into memory channel ``channel``, from word ``mem_addr`` on
    (``tiles``, ``dst`` and the remote signal unused). LOAD: from memory channel
    ``channel``'s words ``mem_addr`` on into local ``dst``; ``remote_semaphore`` is raised
    here (with ``remote_signal``) when the last word has arrived; ``length`` 0 raises it
    once every earlier request to the channel has been served (a fence). ``signal``: the
    engine has sent the words (STORE) or the request (LOAD).
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "src": unsigned(ADDR_BITS),
            "dst": unsigned(ADDR_BITS),
            "length": unsigned(DIM_BITS),
            "tiles": unsigned(TILE_MASK_BITS),
            "remote_signal": 1,
            "remote_semaphore": unsigned(4),
            "target": DmaTarget,
            "channel": unsigned(CHANNEL_BITS),
            "mem_addr": unsigned(MEM_ADDR_BITS),
        })


#: An index-table entry (:class:`IdmaArgs`): 16 bits, a row number in the low
#: :data:`ENTRY_ROW_BITS` and a tile index (:func:`tile_index`) above them.
ENTRY_BITS = 16
ENTRY_ROW_BITS = 10
#: The empty entry: an IDMA passes over it (no row moves, the consecutive side does not
#: advance), so a table may list every candidate row and mark those that do not go.
EMPTY_ENTRY = (1 << ENTRY_BITS) - 1


def index_entry(row: int, tile: int) -> int:
    """The index-table entry naming ``row`` on the tile of index ``tile``."""
    if not 0 <= row < 1 << ENTRY_ROW_BITS:
        raise ValueError(f"index entry row {row} does not fit {ENTRY_ROW_BITS} bits")
    if not 0 <= tile < TILE_MASK_BITS:
        raise ValueError(f"index entry tile {tile} is past the {TILE_MASK_BITS}-tile mask")
    entry = row | tile << ENTRY_ROW_BITS
    if entry == EMPTY_ENTRY:
        raise ValueError(f"index entry row {row} of tile {tile} is the empty entry")
    return entry


def entries_per_word(n: int) -> int:
    """Index-table entries in a scratchpad word of ``n`` int8 lanes."""
    return max(1, 8 * n // ENTRY_BITS)


class IdmaArgs(data.StructLayout):
    """Indexed DMA: ``count`` rows of ``row`` words each, one per entry of the index
    table at scratchpad word ``table`` (entries packed :func:`entries_per_word` to a
    word, entry i in bits 16·(i mod e) .. of word ``table + i div e``; see
    :func:`index_entry`). Entry i = (r, t) moves one row to tile ``t + tile_base``, the
    q-th row moved (empty entries, :data:`EMPTY_ENTRY`, move nothing and are not
    counted in q):

    - gather (``scatter = 0``): local words ``src + r·row ..`` to ``dst + q·row ..``;
    - scatter (``scatter = 1``): local words ``src + q·row ..`` to ``dst + r·row ..``.

    Each row is a DMA of ``row`` words to its tile alone, in entry order, raising
    ``remote_semaphore`` there when ``remote_signal`` is set (so a receiver counts
    rows); ``signal`` is raised once, after the last entry (an empty last entry, or
    ``count`` 0, sends a DMA of no words to no tile that carries it). The table and the
    consecutive side (``count·row`` words) are checked before anything moves
    (BAD_ADDRESS; ``row`` = 0 is BAD_SHAPE); an entry whose row runs past the
    scratchpad or whose tile (plus ``tile_base``) is outside the mesh stops the
    program at this instruction (BAD_INDEX) with the rows before it moved and none
    after; an uncorrectable table word stops it too (MEMORY_ERROR).
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "src": unsigned(ADDR_BITS),
            "dst": unsigned(ADDR_BITS),
            "table": unsigned(ADDR_BITS),
            "count": unsigned(DIM_BITS),
            "row": unsigned(8),
            "scatter": 1,
            "remote_signal": 1,
            "remote_semaphore": unsigned(4),
            "tile_base": unsigned(6),
        })


class WaitArgs(data.StructLayout):
    """WAIT: until semaphore >= count, then semaphore -= count. SIGNAL: semaphore += count."""

    def __init__(self):
        super().__init__({"semaphore": unsigned(4), "count": unsigned(COUNT_BITS)})


_REG = unsigned(3)  # a register index


class SetArgs(data.StructLayout):
    """SET: register ``rd`` = ``value``."""

    def __init__(self):
        super().__init__({"rd": _REG, "value": unsigned(REG_BITS)})


class AddArgs(data.StructLayout):
    """ADD: register ``rd`` = register ``ra`` + ``imm``; a result outside 0 .. 2**16 - 1
    stops the program (``BAD_REGISTER``), the register unchanged."""

    def __init__(self):
        super().__init__({"rd": _REG, "ra": _REG, "imm": signed(REG_BITS + 1)})


class HaltArgs(data.StructLayout):
    """HALT: stop once every dispatched operation has finished; the tile's next start
    runs from ``next`` (0: from pc 0). A ``next`` past the program memory stops the
    program at the HALT with ``PC_OVERFLOW``."""

    def __init__(self):
        super().__init__({"next": unsigned(PC_BITS)})


class LoopArgs(data.StructLayout):
    """LOOP, the last instruction of a loop body: register ``counter`` += 1; then back
    to ``target`` while ``counter`` < register ``limit``, else on to the next
    instruction. A ``limit`` above ``bound`` stops the program (``LOOP_BOUND``) before
    anything changes, so a loop runs at most ``bound`` times whatever the data says;
    a counter that would pass 2**16 - 1 stops it too (``BAD_REGISTER``). The body runs
    once before the first LOOP: a loop that may run zero times starts with a SKIP."""

    def __init__(self):
        super().__init__({"counter": _REG, "limit": _REG, "target": unsigned(PC_BITS),
                          "bound": unsigned(REG_BITS)})


class SkipArgs(data.StructLayout):
    """SKIP: on to ``target`` when register ``ra`` >= register ``rb``, else to the next
    instruction."""

    def __init__(self):
        super().__init__({"ra": _REG, "rb": _REG, "target": unsigned(PC_BITS)})


class LoadArgs(data.StructLayout):
    """LOAD: register ``rd`` = bytes ``lane`` and ``lane + 1`` of scratchpad word
    ``addr`` (lane ``lane`` the low byte, unsigned; past the word's last lane the high
    byte is 0), or with ``acc`` lane ``lane`` of accumulator entry ``addr``, which must
    lie in 0 .. 2**16 - 1 (else ``BAD_REGISTER``, the register unchanged). An ``addr``
    past the memory or a ``lane`` past the word or entry stops the program
    (``BAD_ADDRESS``), an uncorrectable scratchpad word too (``MEMORY_ERROR``). The
    sequencer reads the memory itself, so an engine writing the word or entry must be
    waited for first; an accumulator read waits for the vector engine to be idle."""

    def __init__(self):
        super().__init__({"rd": _REG, "addr": unsigned(ADDR_BITS), "lane": unsigned(5),
                          "acc": 1})


#: The fields WITH may add a register to, per opcode (field code = position + 1). A
#: DMA's ``tiles`` takes a tile index (``tile_index``): its bit is set in the mask.
WITH_FIELDS = {
    Opcode.GEMM: ("a", "b", "c", "a_lo", "m", "k", "p"),
    Opcode.VEC: ("a", "b", "c", "dst", "total", "rows", "beats"),
    Opcode.DMA: ("src", "dst", "length", "tiles", "mem_addr"),
    Opcode.WAIT: ("count",),
    Opcode.SIGNAL: ("count",),
    Opcode.LOAD: ("addr",),
    Opcode.IDMA: ("src", "dst", "table", "count"),
}
#: Register/field pairs of one WITH.
WITH_SLOTS = 3


class WithArgs(data.StructLayout):
    """WITH: for each slot i with ``field{i}`` != 0, the next instruction runs with
    register ``reg{i}`` added to its field number ``field{i}`` (:data:`WITH_FIELDS`;
    two slots on one field add both). The sum must fit the field, the field must exist,
    and the next instruction must be one :data:`WITH_FIELDS` names: else the program
    stops at that instruction with ``BAD_REGISTER``. The checks of the instruction
    (shape, bounds, tiles) apply to the sums."""

    def __init__(self):
        fields = {}
        for i in range(WITH_SLOTS):
            fields |= {f"field{i}": unsigned(4), f"reg{i}": _REG}
        super().__init__(fields)


#: One instruction word.
INSTRUCTION = data.StructLayout({
    "opcode": Opcode,
    "args": data.UnionLayout({
        "gemm": GemmArgs(),
        "vec": VecArgs(),
        "dma": DmaArgs(),
        "wait": WaitArgs(),
        "set": SetArgs(),
        "add": AddArgs(),
        "loop": LoopArgs(),
        "skip": SkipArgs(),
        "halt": HaltArgs(),
        "with_": WithArgs(),
        "load": LoadArgs(),
        "idma": IdmaArgs(),
    }),
})
assert INSTRUCTION.size <= INSTRUCTION_BITS

#: Which union member holds an opcode's fields (NOP has none).
ARGS_OF = {
    Opcode.HALT: "halt",
    Opcode.GEMM: "gemm", Opcode.VEC: "vec", Opcode.DMA: "dma",
    Opcode.WAIT: "wait", Opcode.SIGNAL: "wait", Opcode.SET: "set", Opcode.ADD: "add",
    Opcode.LOOP: "loop", Opcode.SKIP: "skip", Opcode.WITH: "with_", Opcode.LOAD: "load",
    Opcode.IDMA: "idma",
}


def field_width(opcode: Opcode, name: str) -> int:
    """The width in bits of field ``name`` of ``opcode``'s instruction."""
    return Shape.cast(INSTRUCTION["args"].shape[ARGS_OF[opcode]].shape[name].shape).width


def encode(opcode: Opcode, **fields) -> int:
    """One instruction word, e.g. ``encode(Opcode.WAIT, semaphore=3, count=2)``; fields
    not given are 0. ``ValueError`` for an unknown field, a value that does not fit its
    field (which the layout would truncate) or that is no member of its enumeration."""
    member = ARGS_OF.get(opcode)
    if member is None and fields:
        raise ValueError(f"{opcode.name} takes no fields, got {sorted(fields)}")
    word = Opcode(opcode).value << INSTRUCTION["opcode"].offset
    if member is not None:
        word |= _pack(fields, _DECODE_PLANS[opcode], opcode.name) << INSTRUCTION["args"].offset
    return word


def _pack(fields: dict, plan: tuple, path: str) -> int:
    """The bits of ``fields`` laid out by ``plan`` (:func:`_plan`), each value checked."""
    known = {entry[0]: entry for entry in plan}
    unknown = set(fields) - set(known)
    if unknown:
        raise ValueError(f"{path} has no field(s) {sorted(unknown)}")
    bits = 0
    for name, value in fields.items():
        _, offset, width, is_signed, nested, members = known[name]
        if nested is not None:
            bits |= _pack(value, nested, f"{path}.{name}") << offset
            continue
        if isinstance(value, PyEnum):
            value = value.value
        low = -(1 << (width - 1)) if is_signed else 0
        if not low <= value < low + (1 << width):
            raise ValueError(f"{path}.{name} = {value} does not fit "
                             f"{'signed ' if is_signed else ''}{width} bits")
        if members is not None and value not in members:
            raise ValueError(f"{path}.{name} = {value} is no member of its enumeration")
        bits |= (value & ((1 << width) - 1)) << offset
    return bits


def decode(word: int) -> tuple[Opcode, dict]:
    """The opcode and fields of an instruction word; ``ValueError`` for an illegal opcode
    or a field holding no member of its enumeration."""
    if not 0 <= word < (1 << INSTRUCTION_BITS):
        raise ValueError(f"instruction word {word:#x} is wider than {INSTRUCTION_BITS} bits")
    try:
        opcode = Opcode(word & ((1 << OPCODE_BITS) - 1))
    except ValueError:
        raise ValueError(f"illegal opcode {word & 0xF} in instruction word {word:#x}") from None
    plan = _DECODE_PLANS.get(opcode)
    return opcode, {} if plan is None else _extract(word >> INSTRUCTION["args"].offset, plan)


def _plan(layout: data.StructLayout) -> tuple:
    """Per field of ``layout``: its name, offset, width, signedness, and the plan of a
    nested layout or the enumeration a value must belong to (read once, used per word:
    building a ``data.Const`` per word costs far more)."""
    plan = []
    for name, field in layout:
        shape = field.shape
        nested = _plan(shape) if isinstance(shape, data.StructLayout) else None
        members = ({m.value for m in shape} if isinstance(shape, type)
                   and issubclass(shape, PyEnum) else None)
        cast = Shape.cast(shape)
        plan.append((name, field.offset, cast.width, cast.signed, nested, members))
    return tuple(plan)


def _extract(bits: int, plan: tuple) -> dict:
    out = {}
    for name, offset, width, is_signed, nested, members in plan:
        if nested is not None:
            out[name] = _extract(bits >> offset, nested)
            continue
        value = bits >> offset & ((1 << width) - 1)
        if is_signed and value >> (width - 1):
            value -= 1 << width
        if members is not None and value not in members:
            raise ValueError(f"field {name} = {value} is no member of its enumeration")
        out[name] = value
    return out


#: Opcode -> decoding plan of its union member (see :func:`decode`).
OPCODE_BITS = Shape.cast(Opcode).width
_DECODE_PLANS = {opcode: _plan(INSTRUCTION["args"].shape[member].shape)
                 for opcode, member in ARGS_OF.items()}
