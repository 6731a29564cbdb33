"""Programs that probe the sequencer's checks, sized for any tile: each bad instruction
and the error it must stop with, programs whose regions just fit, a semaphore overflow,
a program that runs off its end, and random instructions at the edges of their memories
with the error the ISA says they get. The sequencer's unit tests run them in the
Amaranth simulator with modelled engines; ``tb.tile_tb.tile_programs`` runs them on the
RTL tile (so ``make mutate`` checks the sequencer with them on Verilator)."""

from __future__ import annotations

from dataclasses import dataclass

from golden.tile_model import ProgramError, TileModel
from spec.isa import (
    EMPTY_ENTRY,
    ENTRY_BITS,
    ENTRY_ROW_BITS,
    INSTRUCTION,
    REG_BITS,
    WITH_FIELDS,
    WITH_SLOTS,
    DmaTarget,
    Opcode,
    VecDst,
    decode,
    encode,
    entries_per_word,
    field_width,
    index_entry,
    mesh_mask,
    tile_bit,
    tile_index,
)
from spec.isa import SEMAPHORES as SEMAPHORE_COUNT

__all__ = ["CHECKS", "HALT", "Sizes", "acc_load_programs", "bad_instructions",
           "boundary_instructions", "dma", "expected_error", "fitting_program", "gemm",
           "high_bit_instructions", "idma_edges", "loaded_words", "model_outcome", "op", "outcome",
           "random_register_program", "register_errors", "register_programs",
           "semaphore_overflow", "semaphore_programs", "vec", "with_"]

HALT = encode(Opcode.HALT)


@dataclass(frozen=True)
class Sizes:
    """What the checks compare against: scratchpad words, accumulator entries, vector
    slots, the mesh (columns, rows), the memory channels and the words of each."""

    words: int
    entries: int
    slots: int
    mesh: tuple[int, int]
    channels: int = 0
    channel_words: int = 0


def gemm(**fields) -> int:
    base = {"a": 0, "b": 512, "c": 64, "m": 8, "k": 16, "p": 8}
    return encode(Opcode.GEMM, **(base | fields))


def vec(**fields) -> int:
    base = {"op": 1, "a": 0, "b": 64, "c": 128, "dst": 192, "rows": 8, "beats": 2}
    return encode(Opcode.VEC, **(base | fields))


def dma(**fields) -> int:
    return encode(Opcode.DMA, **({"src": 0, "dst": 0, "length": 4, "tiles": 1} | fields))


#: The bits of a DMA's ``target`` field holding 3, which names no target (the encoder
#: refuses it).
_DMA_TARGET_3 = 3 << (INSTRUCTION["args"].offset
                      + INSTRUCTION["args"].shape["dma"].shape["target"].offset)


def bad_instructions(s: Sizes) -> list[tuple[str, int, str]]:
    """(what, instruction, the ErrorCode name it stops with). In a program
    ``[gemm(), bad, vec(), HALT]`` the GEMM runs, the sequencer stops at pc 1 and
    nothing after it is dispatched."""
    words, entries = s.words, s.entries
    # Scalar operands take one entry per 8 rows: 9 rows take two where the slots allow.
    rows = 9 if s.slots >= 9 else 8
    scalars = -(-rows // 8)
    return [
        ("a word of zeros", 0, "ILLEGAL_OPCODE"),
        ("opcode 15", 0xF, "ILLEGAL_OPCODE"),
        ("GEMM m = 0", gemm(m=0), "BAD_SHAPE"),
        ("GEMM A past the end", gemm(a=words - 8, k=16), "BAD_ADDRESS"),
        ("GEMM A rows: 2 chunks x 5 rows", gemm(a=words - 8, k=16, m=5, a_rows=1),
         "BAD_ADDRESS"),
        ("GEMM B rows: 2 x 16 words", gemm(b=words - 31, k=16, p=16, b_rows=1),
         "BAD_ADDRESS"),
        ("GEMM A low limbs", gemm(a_lo=words - 8, k=16, a_limbs=1), "BAD_ADDRESS"),
        ("GEMM B: 1 025 rows a word apart, one past", gemm(b=words - 1024, k=1025, b_stride=1),
         "BAD_ADDRESS"),
        ("GEMM C: two row tiles", gemm(c=entries - 8, m=9), "BAD_ADDRESS"),
        ("VEC rows = 0", vec(rows=0), "BAD_SHAPE"),
        ("VEC beats = 0", vec(beats=0), "BAD_SHAPE"),
        ("VEC slots past the last", vec(slot=s.slots - 4, rows=5), "BAD_SHAPE"),
        ("VEC a: 8 rows x 2 beats", vec(a=entries - 15), "BAD_ADDRESS"),
        ("VEC a: 8 rows x 8 beats", vec(a=entries - 63, beats=8), "BAD_ADDRESS"),
        ("VEC b: scalar entries", vec(b=entries - scalars + 1, rows=rows, b_scalar=1),
         "BAD_ADDRESS"),
        ("VEC c", vec(c=entries), "BAD_ADDRESS"),
        ("VEC total", vec(total=entries - scalars + 1, rows=rows, total_write=1),
         "BAD_ADDRESS"),
        ("VEC dst entries", vec(dst=entries - 15), "BAD_ADDRESS"),
        ("VEC dst words", vec(dst=words - 15, dst_kind=VecDst.SPAD), "BAD_ADDRESS"),
        ("DMA to no tile", dma(tiles=0), "BAD_TILE"),
        ("DMA past the mesh's columns", dma(tiles=tile_bit(s.mesh[0], 0)), "BAD_TILE"),
        ("DMA past the mesh's rows", dma(tiles=tile_bit(0, s.mesh[1])), "BAD_TILE"),
        ("DMA source past the end", dma(src=words - 1, length=2), "BAD_ADDRESS"),
        ("DMA destination past the end", dma(dst=words - 1, length=2), "BAD_ADDRESS"),
    ] + _memory_dmas(s)


def _memory_dmas(s: Sizes) -> list[tuple[str, int, str]]:
    """Memory DMAs each of which fails a check, with the error ``expected_error`` gives
    on a chip of ``s``'s channels (without channels, BAD_ADDRESS for all: their words
    run past a channel of no words)."""
    store, load = DmaTarget.STORE.value, DmaTarget.LOAD.value
    past = max(s.channel_words - 3, 0)
    cases = [("STORE to a channel the chip lacks", {"target": store, "channel": s.channels}),
             ("LOAD from a channel the chip lacks", {"target": load, "channel": s.channels}),
             ("a DMA of target 3", {"target": 3}),
             ("STORE past its channel", {"target": store, "mem_addr": past}),
             ("LOAD past its channel", {"target": load, "mem_addr": past}),
             ("LOAD into words past the scratchpad", {"target": load, "dst": s.words - 3})]
    out = []
    for what, fields in cases:
        f = {"src": 0, "dst": 0, "length": 4, "tiles": 0, "channel": 0, "mem_addr": 0} | fields
        word = (dma(**(f | {"target": 0})) | _DMA_TARGET_3 if f["target"] == 3
                else dma(**f))
        out.append((what, word, expected_error(Opcode.DMA, f, s, 8)))
    return out


def fitting_program(s: Sizes) -> list[int]:
    """Regions that end exactly at the end of their memory: accepted."""
    words, entries = s.words, s.entries
    return [
        gemm(c=entries - 8, a=words - 16, a_rows=1, m=8, k=16),
        gemm(b=words - 16, b_rows=1, p=8, k=16),
        gemm(b=words - 1025, k=1025, b_stride=1),
        vec(a=entries - 64, dst=entries - 64, beats=8, hi=64),
        vec(a=entries - 16, b=entries - 1, b_scalar=1, c=0, c_imm=1, total=entries - 1,
            total_write=1, dst=words - 16, dst_kind=VecDst.SPAD),
        vec(dst=5000, dst_kind=VecDst.NONE),
        dma(src=words - 4, dst=words - 4, length=4),
        HALT,
    ]


def semaphore_overflow(semaphore: int = 3) -> list[int]:
    """A semaphore counted past its width: SEMAPHORE_OVERFLOW (the count kept)."""
    return [encode(Opcode.SIGNAL, semaphore=semaphore, count=0xFFFF),
            encode(Opcode.SIGNAL, semaphore=semaphore, count=1), HALT]


def coincident_overflow(semaphore: int) -> list[int]:
    """A full semaphore (65 535) to which, in one cycle, a GEMM's and a VEC's completions
    add one each and a SIGNAL adds 65 535: a sum of 2^17, its bit 16 clear, is an
    overflow too (SEMAPHORE_OVERFLOW). On the tiny tile (N = 8, nothing held back) a
    GEMM of k = 8 and a VEC of 19 beats writing nothing finish in the cycle the second
    SIGNAL's addition applies: found by moving each one a cycle at a time against a
    WAIT's subtraction in that place (with the other one running), which overflows
    exactly when the completion comes first, and checked with a WAIT of 2 there (no
    overflow; k = 7 or 18 beats, one cycle early, overflow)."""
    signal = {"signal": {"enable": 1, "semaphore": semaphore}}
    return [encode(Opcode.SIGNAL, semaphore=semaphore, count=0xFFFF), gemm(k=8, **signal),
            vec(rows=1, beats=19, a=0, b=0, c=0, dst=0, dst_kind=VecDst.NONE.value,
                **signal),
            *[encode(Opcode.NOP)] * 6,
            encode(Opcode.SIGNAL, semaphore=semaphore, count=0xFFFF), HALT]


def _blocks(size: int, n: int) -> int:
    return -(-size // n)


def _b_words(f: dict, n: int) -> int:
    """The scratchpad words a GEMM's B operand spans."""
    k, p, stride = f["k"], f["p"], f.get("b_stride", 0)
    if f["b_rows"]:
        return _blocks(k, n) * p
    return (k - 1) * stride + _blocks(p, n) if stride and k else _blocks(p, n) * k


def _spad_words(f: dict) -> int:
    """The scratchpad words a VEC's SPAD destination spans (chunk-major, or rows
    ``dst_stride`` apart)."""
    rows, beats, stride = f["rows"], f["beats"], f.get("dst_stride", 0)
    return (rows - 1) * stride + beats if stride and rows else rows * beats


def expected_error(opcode: Opcode, f: dict, s: Sizes, n: int) -> str:
    """The ErrorCode name the sequencer must give one GEMM, VEC or DMA with fields ``f``
    (docs/isa.md): the shape first, then every region against its memory, then the tile
    mask. Written from the ISA's definitions, not from the RTL."""
    def fits(base: int, length: int, limit: int) -> bool:
        return base + length <= limit

    words, entries = s.words, s.entries
    if opcode == Opcode.GEMM:
        m, k, p = f["m"], f["k"], f["p"]
        if min(m, k, p) == 0:
            return "BAD_SHAPE"
        a = _blocks(k, n) * m if f["a_rows"] else _blocks(m, n) * k
        b = _b_words(f, n)
        c = _blocks(m, n) * _blocks(p, n) * n
        ok = (fits(f["a"], a, words) and fits(f["b"], b, words) and fits(f["c"], c, entries)
              and (not f["a_limbs"] or fits(f["a_lo"], a, words)))
        return "NONE" if ok else "BAD_ADDRESS"
    if opcode == Opcode.VEC:
        rows, beats = f["rows"], f["beats"]
        if rows == 0 or beats == 0 or f["slot"] + rows > s.slots:
            return "BAD_SHAPE"
        tile, scalar = _blocks(rows, n) * beats * n, _blocks(rows, n)
        dst = {VecDst.TILE: (tile, entries), VecDst.SCALAR: (scalar, entries),
               VecDst.SPAD: (_spad_words(f), words), VecDst.NONE: (0, 1 << 16)}
        length, limit = dst[f["dst_kind"]]
        ok = (fits(f["a"], scalar if f["a_scalar"] else tile, entries)
              and fits(f["b"], scalar if f["b_scalar"] else tile, entries)
              and (f["c_imm"] or fits(f["c"], scalar, entries))
              and (not f["total_write"] or fits(f["total"], scalar, entries))
              and fits(f["dst"], length, limit))
        return "NONE" if ok else "BAD_ADDRESS"
    target = int(getattr(f.get("target", 0), "value", f.get("target", 0)))
    memory = target != DmaTarget.TILES.value
    if not (fits(f["src"], f["length"], words) and fits(f["dst"], f["length"], words)
            and (not memory or fits(f.get("mem_addr", 0), f["length"], s.channel_words))):
        return "BAD_ADDRESS"
    if memory:
        known = target in (DmaTarget.STORE.value, DmaTarget.LOAD.value)
        return "NONE" if known and f.get("channel", 0) < s.channels else "BAD_TILE"
    inside = mesh_mask(s.mesh)
    return "NONE" if f["tiles"] and not f["tiles"] & ~inside else "BAD_TILE"


def boundary_instructions(s: Sizes, n: int, own: int, rng, count: int) -> list[tuple]:
    """``count`` random GEMM, VEC and DMA instructions with one region ending just
    before, at or just past the end of its memory (or a shape at its limit), as
    (opcode, fields, word, expected ErrorCode name). Accepted DMAs go to ``own`` tile
    only, so a test needs no network."""
    out = []
    for _ in range(count):
        kind = rng.choice(["gemm", "vec", "dma"])
        if kind == "gemm":
            opcode = Opcode.GEMM
            f = {"m": int(rng.integers(0, 25)), "k": int(rng.integers(0, 40)),
                 "p": int(rng.integers(0, 25)), "a_rows": int(rng.integers(2)),
                 "b_rows": int(rng.integers(2)), "a_limbs": int(rng.integers(2)),
                 "a_row_major": int(rng.integers(2)),
                 "b_stride": int(rng.choice([0, 0, 1, 2, 127])),
                 "a": 0, "b": 1024, "a_lo": 2048, "c": 0}
            m, k, p = f["m"], f["k"], f["p"]
            a = _blocks(k, n) * m if f["a_rows"] else _blocks(m, n) * k
            edge = rng.choice(["a", "b", "a_lo", "c"])
            size = {"a": a, "a_lo": a,
                    "b": _b_words(f, n),
                    "c": _blocks(m, n) * _blocks(p, n) * n}[edge]
            limit = s.entries if edge == "c" else s.words
            f[edge] = max(0, limit - size + int(rng.integers(-2, 3)))
        elif kind == "vec":
            opcode = Opcode.VEC
            rows = int(rng.integers(0, s.slots + 2))
            f = {"op": 8, "rows": rows, "beats": int(rng.integers(0, 4)),
                 "slot": int(rng.integers(0, 3)), "a": 0, "b": 32, "c": 64,
                 "a_scalar": int(rng.integers(2)), "b_scalar": int(rng.integers(2)),
                 "c_imm": int(rng.integers(2)), "total": 96,
                 "total_write": int(rng.integers(2)), "dst": 128,
                 "dst_kind": VecDst(int(rng.integers(4))),
                 "dst_stride": int(rng.choice([0, 0, 1, 3, 127]))}
            tile, scalar = _blocks(rows, n) * f["beats"] * n, _blocks(rows, n)
            edge = rng.choice(["a", "b", "c", "total", "dst"])
            size = {"a": scalar if f["a_scalar"] else tile,
                    "b": scalar if f["b_scalar"] else tile, "c": scalar, "total": scalar,
                    "dst": {VecDst.TILE: tile, VecDst.SCALAR: scalar,
                            VecDst.SPAD: _spad_words(f), VecDst.NONE: 0}[f["dst_kind"]]}
            limit = s.words if edge == "dst" and f["dst_kind"] == VecDst.SPAD else s.entries
            f[edge] = min(max(0, limit - size[edge] + int(rng.integers(-2, 3))), limit)
        else:
            opcode = Opcode.DMA
            length = int(rng.integers(0, 3 * n))
            f = {"length": length, "src": 0, "dst": 64, "tiles": own}
            edge = rng.choice(["src", "dst", "tiles"])
            if edge == "tiles":
                f["tiles"] = int(rng.choice([0, own | tile_bit(s.mesh[0], 0),
                                             tile_bit(0, s.mesh[1]), 1 << 63]))
            else:
                f[edge] = max(0, s.words - length + int(rng.integers(-2, 3)))
        out.append((opcode, f, encode(opcode, **f), expected_error(opcode, f, s, n)))
    return out


def semaphore_programs(own: int) -> list[tuple[int, list[int], bool]]:
    """For every semaphore s: a SIGNAL, a GEMM, a VEC and a DMA each counting on s (the
    DMA to tile ``own`` also raising its arrival on s), then a WAIT for the exact total
    (the program halts) or for one more (it never does): (s, program, halts). The
    halting one's total is the largest count, and SIGNALs and WAITs of 0x5555 and 0xAAAA
    follow on s, so each bit of s's additions and subtraction is seen both set and
    clear. Then every semaphore, s too, is SIGNALled up to its largest count: one stray
    increment of another, or anything a WAIT left on s, would overflow
    (SEMAPHORE_OVERFLOW). Together they check every semaphore's counter against each
    source of increments, WAIT's subtraction, and that no increment lands on another
    semaphore."""
    out = []
    top = (1 << 16) - 1

    def body(s: int, count: int) -> list[int]:
        signal = {"signal": {"enable": 1, "semaphore": s}}
        return [encode(Opcode.SIGNAL, semaphore=s, count=count), gemm(**signal),
                vec(**signal), dma(tiles=own, remote_signal=1, remote_semaphore=s, **signal)]

    for s in range(SEMAPHORE_COUNT):
        patterns = [encode(opcode, semaphore=s, count=count) for count in (0x5555, 0xAAAA)
                    for opcode in (Opcode.SIGNAL, Opcode.WAIT)]
        fill = [encode(Opcode.SIGNAL, semaphore=t, count=top) for t in range(SEMAPHORE_COUNT)]
        out.append((s, body(s, top - 4) + [encode(Opcode.WAIT, semaphore=s, count=top),
                                           *patterns, *fill, HALT], True))
        # A count with high and low bits set, different for every semaphore.
        count = (0x9253 * (s + 1)) & 0x7FFF | 1
        out.append((s, body(s, count) + [encode(Opcode.WAIT, semaphore=s, count=count + 5),
                                         HALT], False))
    return out


def high_bit_instructions(s: Sizes, n: int, own: int) -> list[tuple]:
    """GEMM shapes and DMA lengths with one high bit set (256 .. 2048: the upper bits
    of the sequencer's size arithmetic), a VEC of 16, 32 and 64 beats, and a DMA to
    each tile-mask bit outside the mesh alone, as (opcode, fields, word, expected
    ErrorCode name) like :func:`boundary_instructions`."""
    out = []
    base = {"m": 8, "k": 8, "p": 8, "a_rows": 0, "b_rows": 0, "a_limbs": 0, "a": 0,
            "b": 0, "a_lo": 0, "c": 0}
    for dim in ("m", "k", "p"):
        for bit in (8, 9, 10, 11):
            f = base | {dim: 1 << bit}
            out.append((Opcode.GEMM, f, encode(Opcode.GEMM, **f),
                        expected_error(Opcode.GEMM, f, s, n)))
    for bit in (4, 5, 6):  # one row of 16, 32 and 64 beats
        f = {"op": 1, "a": 0, "b": 0, "c": 0, "dst": 0, "rows": 1, "beats": 1 << bit,
             "slot": 0, "a_scalar": 0, "b_scalar": 0, "c_imm": 1, "total": 0,
             "total_write": 0, "dst_kind": VecDst.NONE}
        out.append((Opcode.VEC, f, encode(Opcode.VEC, **f),
                    expected_error(Opcode.VEC, f, s, n)))
    for bit in (8, 9, 10, 11):
        f = {"length": 1 << bit, "src": 0, "dst": 0, "tiles": own}
        out.append((Opcode.DMA, f, encode(Opcode.DMA, **f), expected_error(Opcode.DMA, f, s, n)))
    columns, rows = s.mesh
    inside = {tile_index(x, y) for y in range(rows) for x in range(columns)}
    for bit in range(64):
        if bit not in inside:
            f = {"length": 1, "src": 0, "dst": 0, "tiles": 1 << bit}
            out.append((Opcode.DMA, f, encode(Opcode.DMA, **f), "BAD_TILE"))
    return out


# --- register programs ----------------------------------------------------------------


def op(opcode: Opcode, **fields) -> int:
    return encode(opcode, **fields)


def with_(*pairs: tuple[int, int]) -> int:
    """WITH adding register ``reg`` to field number ``field`` for each (field, reg)."""
    fields = {}
    for i, (field, reg) in enumerate(pairs):
        fields |= {f"field{i}": field, f"reg{i}": reg}
    return encode(Opcode.WITH, **fields)


def _field(opcode: Opcode, name: str) -> int:
    return WITH_FIELDS[opcode].index(name) + 1


#: The sequencer's errors the tile model reports as a plain ValueError (failed checks).
CHECKS = ("BAD_ADDRESS", "BAD_SHAPE", "BAD_TILE")


def model_outcome(model: TileModel, program: list[int]) -> str:
    """Run the words of ``program`` on the tile model: "NONE", the ErrorCode name of a
    :class:`ProgramError`, or "CHECK" for a failed region, shape or tile check (compare
    with :func:`outcome`)."""
    try:
        model.run([(opcode.name, fields) for opcode, fields in map(decode, program)])
    except ProgramError as stopped:
        return stopped.code
    except ValueError:
        return "CHECK"
    return "NONE"


def outcome(error_name: str) -> str:
    """The sequencer's error as :func:`model_outcome` says it."""
    return "CHECK" if error_name in CHECKS else error_name


#: The word the loop's LOADs read (at :data:`COUNTS_AT`): lane pairs 0, 2 and 4 hold 3,
#: 2 and 1.
COUNTS_WORD = 3 | 2 << 16 | 1 << 32
COUNTS_AT = 90
#: A word of distinct bytes, each lane of which is LOADed (at :data:`LANES_AT`), and
#: then the word of its complement (at ``LANES_AT + 1``): every bit read as 0 and as 1.
LANES_WORD = 0x8E2DF1A73C59B46B
LANES_AT = 88


#: A word of bytes 1, 2, … (at :data:`ACC_B_AT`): the B operand of the accumulator LOADs'
#: GEMM, so that lane j of its row r is byte r of :data:`COUNTS_WORD` times j + 1.
ACC_B_WORD = 0x0807060504030201
ACC_B_AT = 91


#: Where the IDMA programs' index tables start.
TABLES_AT = 92
#: The IDMA programs' tables: (row, tile) entries, the tile ``None`` for this tile
#: (``"base"``: tile 0, an IDMA's ``tile_base`` names this tile), ``EMPTY`` an empty
#: entry.
EMPTY = None
_TABLES = {"gather": [(3, None), (0, None), (5, None), (3, None), (1, None)],
           "scatter": [(2, None), (0, None), (1, None)],
           "sparse": [EMPTY, (2, "base"), EMPTY, EMPTY, (4, "base"), (0, "base"), EMPTY]}


def _table_words(entries: list[tuple[int, int] | None], n: int) -> list[int]:
    """The words of an IDMA index table of (row, tile index) ``entries`` (or EMPTY)."""
    per_word = entries_per_word(n)
    words = [0] * -(-len(entries) // per_word)
    for i, entry in enumerate(entries):
        value = EMPTY_ENTRY if entry is EMPTY else index_entry(*entry)
        words[i // per_word] |= value << ENTRY_BITS * (i % per_word)
    return words


def _tables(n: int, own_index: int) -> dict[str, tuple[int, list[int]]]:
    """Per IDMA table name: its address and words, for ``n`` lanes on tile ``own_index``."""
    tiles = {None: own_index, "base": 0}
    out, at = {}, TABLES_AT
    for name, entries in _TABLES.items():
        words = _table_words([entry if entry is EMPTY else (entry[0], tiles[entry[1]])
                              for entry in entries], n)
        out[name] = (at, words)
        at += len(words)
    return out


def loaded_words(n: int, own_index: int) -> dict[int, int]:
    """The scratchpad words the register programs LOAD or take as IDMA tables, by
    address, for ``n`` lanes on the tile of index ``own_index`` (the caller writes
    them)."""
    lanes = (1 << 8 * n) - 1
    out = {COUNTS_AT: COUNTS_WORD, LANES_AT: LANES_WORD & lanes,
           LANES_AT + 1: ~LANES_WORD & lanes, ACC_B_AT: ACC_B_WORD & lanes}
    for at, words in _tables(n, own_index).values():
        out |= {at + i: word for i, word in enumerate(words)}
    return out


def _idma_programs(n: int, own_index: int) -> list[tuple[str, list[int]]]:
    """IDMAs of rows of this tile: a gather over two table words (each row's DMA asking
    for an arrival on semaphore 4, the last one's signalling semaphore 2), a scatter
    into rows, one of no rows then one of two, their counts from a register, a gather
    whose source, destination and table come from registers, and a gather and a
    scatter over a table of empty entries (the last one too) whose tiles are relative
    to ``tile_base``."""
    tables = _tables(n, own_index)
    gather, scatter, sparse = (tables[name][0] for name in ("gather", "scatter", "sparse"))
    entries = len(_TABLES["sparse"])
    count = _field(Opcode.IDMA, "count")
    signal = {"signal": {"enable": 1, "semaphore": 2}}
    return [
        ("an IDMA gathering rows", [
            op(Opcode.IDMA, src=0, dst=256, table=gather, count=5, row=2, remote_signal=1,
               remote_semaphore=4, **signal),
            op(Opcode.WAIT, semaphore=2, count=1), HALT]),
        ("an IDMA scattering into rows", [
            op(Opcode.IDMA, src=8, dst=300, table=scatter, count=3, row=3, scatter=1,
               **signal),
            op(Opcode.WAIT, semaphore=2, count=1), HALT]),
        ("IDMAs of a register's count of rows, 0 then 2", [
            op(Opcode.SET, rd=1, value=0), with_((count, 1)),
            op(Opcode.IDMA, src=0, dst=280, table=gather, row=4, **signal),
            op(Opcode.WAIT, semaphore=2, count=1),
            op(Opcode.SET, rd=1, value=2), with_((count, 1)),
            op(Opcode.IDMA, src=0, dst=280, table=gather, row=4, **signal),
            op(Opcode.WAIT, semaphore=2, count=1), HALT]),
        ("an IDMA's source, destination and table from registers", [
            op(Opcode.SET, rd=1, value=2), op(Opcode.SET, rd=2, value=56),
            op(Opcode.SET, rd=3, value=5),
            with_((_field(Opcode.IDMA, "src"), 1), (_field(Opcode.IDMA, "dst"), 2),
                  (_field(Opcode.IDMA, "table"), 3)),
            op(Opcode.IDMA, src=0, dst=200, table=gather - 5, count=5, row=2, **signal),
            op(Opcode.WAIT, semaphore=2, count=1), HALT]),
        ("IDMAs passing over empty entries, tiles relative to a base", [
            op(Opcode.IDMA, src=0, dst=256, table=sparse, count=entries, row=3,
               remote_signal=1, remote_semaphore=4, tile_base=own_index, **signal),
            op(Opcode.WAIT, semaphore=2, count=1),
            op(Opcode.IDMA, src=8, dst=300, table=sparse, count=entries - 1, row=2,
               scatter=1, tile_base=own_index, **signal),
            op(Opcode.WAIT, semaphore=2, count=1), HALT]),
    ]


def idma_edges(s: Sizes, n: int) -> list[tuple[str, list[int], dict[int, int], str, int]]:
    """(what, program, the scratchpad words it reads, the ErrorCode name it stops with or
    NONE, the pc it stops at) for each way an IDMA goes wrong, and for the regions that
    just fit: a table, consecutive rows and an entry's row ending on the scratchpad's
    last word, entries of alternating row bits from an odd base. Each bad table's
    first entry is good, so one row moves before the bad entry stops the program."""
    outside = next(i for i in range(64) if not mesh_mask(s.mesh) >> i & 1)
    idma = {"src": 0, "dst": 256, "table": TABLES_AT, "count": 2, "row": 4}
    def table(entry):
        return dict(enumerate(_table_words([(0, 0), entry], n), TABLES_AT))
    per_word = entries_per_word(n)
    fit = s.words // (1 << ENTRY_ROW_BITS)  # rows of this many words: the last row ends last
    last_table = {s.words - 3 + i: 0 for i in range(3)}
    half = s.words // 2  # 2 x 200 words from 192 below it fit, not from as far past it
    return [
        ("an IDMA entry's row past the scratchpad",
         [op(Opcode.IDMA, **idma | {"row": 64}), HALT], table((1023, 0)), "BAD_INDEX", 0),
        ("an IDMA entry's tile outside the mesh",
         [op(Opcode.IDMA, **idma), HALT], table((0, outside)), "BAD_INDEX", 0),
        ("an IDMA entry's row on the scratchpad's last words",
         [op(Opcode.IDMA, **idma | {"row": 64, "scatter": 1, "src": 256, "dst": 0}), HALT],
         table((s.words // 64 - 1, 0)), "NONE", 1),
        ("an IDMA of rows of no words", [op(Opcode.IDMA, **idma | {"row": 0}), HALT], {},
         "BAD_SHAPE", 0),
        ("an IDMA table past the scratchpad",
         [op(Opcode.IDMA, **idma | {"table": s.words - 1, "count": per_word + 1}), HALT],
         {}, "BAD_ADDRESS", 0),
        ("an IDMA's consecutive rows past the scratchpad",
         [op(Opcode.IDMA, **idma | {"dst": s.words - 7}), HALT], {}, "BAD_ADDRESS", 0),
        ("an IDMA table ending on the scratchpad's last word",
         [op(Opcode.IDMA, **idma | {"table": s.words - 3, "count": 2 * per_word + 1,
                                    "row": 1}), HALT], last_table, "NONE", 1),
        ("an IDMA's row of four words one past the scratchpad",
         [op(Opcode.IDMA, **idma | {"dst": s.words - 3, "count": 1}), HALT], {},
         "BAD_ADDRESS", 0),
        ("an IDMA's consecutive rows ending on the scratchpad's last word",
         [op(Opcode.IDMA, **idma | {"dst": s.words - 15, "count": 3, "row": 5}), HALT],
         table((1, 0)), "NONE", 1),
        ("IDMA entries of alternating row bits from an odd base",
         [op(Opcode.IDMA, **idma | {"src": 1, "row": 3}), HALT], table((0x155, 0)) | dict(
             enumerate(_table_words([(0x2AA, 0), (0x155, 0)], n), TABLES_AT)), "NONE", 1),
        ("an IDMA entry's row ending on the scratchpad's last word",
         [op(Opcode.IDMA, **idma | {"row": fit}), HALT], table((1023, 0)), "NONE", 1),
        ("an IDMA entry's row one word past the scratchpad, from an odd base",
         [op(Opcode.IDMA, **idma | {"row": fit, "src": 1}), HALT], table((1023, 0)),
         "BAD_INDEX", 0),
        ("an IDMA entry's tile plus its base outside the mesh",
         [op(Opcode.IDMA, **idma | {"tile_base": outside}), HALT], table((0, 0)),
         "BAD_INDEX", 0),
        ("an IDMA entry's tile plus its base past tile 63 (not tile 0 again)",
         [op(Opcode.IDMA, **idma | {"tile_base": 1, "count": 1}), HALT],
         dict(enumerate(_table_words([(0, 63)], n), TABLES_AT)), "BAD_INDEX", 0),
        ("an empty IDMA entry, whose row and tile would be past everything",
         [op(Opcode.IDMA, **idma | {"row": 64, "tile_base": 63}), HALT],
         dict(enumerate(_table_words([EMPTY, EMPTY], n), TABLES_AT)), "NONE", 1),
        ("empty IDMA entries with a tile base past the mesh, consecutive rows just below "
         "half the scratchpad",
         [op(Opcode.IDMA, **idma | {"dst": half - 192, "row": 200, "tile_base": 4}), HALT],
         dict(enumerate(_table_words([EMPTY, EMPTY], n), TABLES_AT)), "NONE", 1),
        ("an IDMA of 2**17 words", [op(Opcode.IDMA, **idma | {"count": 2048, "row": 64}),
                                    HALT], {}, "BAD_ADDRESS", 0),
        ("an IDMA scatter from rows at alternating address bits",
         [op(Opcode.IDMA, **idma | {"src": 0x555, "scatter": 1}), HALT],
         table((1, 0)) | {0x555 + i: 0x1111 * (i + 1) for i in range(8)}
         | {0x155 + i: 0 for i in range(8)}, "NONE", 1),
    ]


def _loads_compared(program: list[int], loads: list[tuple[int, int]]) -> list[int]:
    """``program`` followed by, per (LOAD word, expected value), the LOAD into r1 and a
    comparison with the value: SKIPs over a HALT either way when equal, so a wrong
    register halts early; then HALT."""
    program = list(program)
    for load, value in loads:
        pc = len(program)
        program += [load, op(Opcode.SET, rd=2, value=value),
                    op(Opcode.SKIP, ra=1, rb=2, target=pc + 4), HALT,  # r1 >= r2
                    op(Opcode.SKIP, ra=2, rb=1, target=pc + 6), HALT]  # r2 >= r1
    return program + [HALT]


def _every_lane(n: int, at: int) -> list[int]:
    """LOAD each of the ``n`` lanes of word ``at`` of :func:`loaded_words` and compare
    it with its value (:func:`_loads_compared`)."""
    word = loaded_words(n, 0)[at]
    return _loads_compared([], [(op(Opcode.LOAD, rd=1, addr=at, lane=lane),
                                 word >> 8 * lane & 0xFFFF) for lane in range(n)])


def register_programs(own_index: int, n: int) -> list[tuple[str, list[int]]]:
    """(what, program) of programs that follow registers: a loop whose GEMMs, VECs and
    DMAs step their addresses by a register, nested loops, a loop SKIPped when its trip
    count is 0, WAIT and SIGNAL counts and a DMA's tile from registers, a loop whose
    trip count and DMA length are LOADed, every lane of a word LOADed (the words of
    :func:`loaded_words`, which the caller writes; ``n`` lanes). DMAs go to the tile of
    index ``own_index`` (``spec.isa.tile_index``) only."""
    g, v, d = Opcode.GEMM, Opcode.VEC, Opcode.DMA
    loop = [
        op(Opcode.SET, rd=1, value=3),  # limit
        op(Opcode.SET, rd=4, value=own_index),
        # body (pc 2): three operations at addresses r3 words on, then r3 += 16
        with_((_field(g, "a"), 3), (_field(g, "c"), 2), (_field(g, "m"), 2)),
        gemm(signal={"enable": 1, "semaphore": 0}),
        with_((_field(v, "dst"), 3), (_field(v, "rows"), 2), (_field(v, "a"), 2)),
        vec(rows=4, signal={"enable": 1, "semaphore": 0}),
        with_((_field(d, "src"), 3), (_field(d, "dst"), 3), (_field(d, "tiles"), 4)),
        dma(tiles=0, dst=256, signal={"enable": 1, "semaphore": 0}),
        op(Opcode.ADD, rd=3, ra=3, imm=16),
        op(Opcode.LOOP, counter=2, limit=1, target=2, bound=4),
        op(Opcode.SET, rd=5, value=9),
        with_((_field(Opcode.WAIT, "count"), 5)),
        op(Opcode.WAIT, semaphore=0, count=0),
        with_((_field(Opcode.SIGNAL, "count"), 3)),
        op(Opcode.SIGNAL, semaphore=6, count=1),
        op(Opcode.WAIT, semaphore=6, count=49), HALT,
    ]
    nested = [
        op(Opcode.SET, rd=1, value=2), op(Opcode.SET, rd=2, value=3),
        op(Opcode.SET, rd=3, value=0),  # the outer counter
        op(Opcode.SET, rd=4, value=0),  # pc 3: the inner counter
        with_((_field(g, "c"), 5), (_field(g, "b"), 6)),  # pc 4
        gemm(),
        op(Opcode.ADD, rd=5, ra=5, imm=8),
        op(Opcode.LOOP, counter=4, limit=2, target=4, bound=3),
        op(Opcode.ADD, rd=6, ra=6, imm=64),
        op(Opcode.LOOP, counter=3, limit=1, target=3, bound=2), HALT,
    ]
    zero_trip = [
        op(Opcode.SET, rd=1, value=0),
        op(Opcode.SKIP, ra=2, rb=1, target=5),  # r2 = 0 >= r1 = 0: skip the loop
        gemm(), op(Opcode.LOOP, counter=2, limit=1, target=2, bound=1), vec(),
        op(Opcode.SET, rd=1, value=1),
        op(Opcode.SKIP, ra=2, rb=1, target=9),  # 0 >= 1: no skip
        gemm(m=1), op(Opcode.LOOP, counter=2, limit=1, target=7, bound=1), HALT,
    ]
    loaded = [
        op(Opcode.LOAD, rd=1, addr=COUNTS_AT, lane=0),  # 3 trips
        op(Opcode.SET, rd=3, value=2),
        with_((_field(Opcode.LOAD, "addr"), 3)),
        op(Opcode.LOAD, rd=5, addr=COUNTS_AT - 2, lane=2),  # 2 words a DMA
        with_((_field(d, "length"), 5), (_field(d, "src"), 6), (_field(d, "dst"), 6)),  # pc 4
        dma(length=0, dst=256, tiles=1 << own_index),
        op(Opcode.ADD, rd=6, ra=6, imm=4),
        op(Opcode.LOOP, counter=2, limit=1, target=4, bound=3), HALT,
    ]
    counts = [
        op(Opcode.SET, rd=1, value=0x5A5A), op(Opcode.SET, rd=2, value=0x2FFF),
        with_((_field(Opcode.SIGNAL, "count"), 1), (_field(Opcode.SIGNAL, "count"), 2)),
        op(Opcode.SIGNAL, semaphore=6, count=1),  # 0x8A5A
        with_((_field(Opcode.WAIT, "count"), 2), (_field(Opcode.WAIT, "count"), 1)),
        op(Opcode.WAIT, semaphore=6, count=1),  # all of it: a residue would overflow
        op(Opcode.SIGNAL, semaphore=6, count=(1 << 16) - 1),
        op(Opcode.WAIT, semaphore=6, count=(1 << 16) - 1), HALT,
    ]
    tile = _field(d, "tiles")
    own = 1 << own_index
    slots = [op(Opcode.SET, rd=4, value=own_index),
             with_((tile, 4)), dma(src=0, dst=300, length=2, tiles=own),
             with_((0, 0), (tile, 4)), dma(src=2, dst=302, length=2, tiles=0),
             with_((0, 0), (0, 0), (tile, 4)), dma(src=4, dst=304, length=2, tiles=own), HALT]
    # Every register holding bit 9 (with bits 0-8 all set, or alternating), then 0x5555
    # and 0xAAAA (each of its bits set once), brought back to a small offset by an ADD,
    # moves a DMA's addresses: a register bit that reads wrong makes the ADD's result
    # negative or past 16 bits (BAD_REGISTER) or the copy land elsewhere.
    bits = []
    for reg in range(8):
        for value in ((0x3FF, 0x2AA)[reg % 2], 0x5555, 0xAAAA):
            bits += [op(Opcode.SET, rd=reg, value=value),
                     op(Opcode.ADD, rd=reg, ra=reg, imm=reg - value),
                     with_((_field(d, "src"), reg), (_field(d, "dst"), reg)),
                     dma(src=0, dst=256, length=1, tiles=own)]
    bits.append(HALT)
    return [("SIGNAL and WAIT counts of high bits from two registers", counts),
            ("every register's bits in a DMA's addresses", bits),
            ("a DMA's tile from each of WITH's slots", slots),
            ("a loop stepping every engine's addresses", loop),
            ("nested loops", nested),
            ("a loop skipped when it runs zero times", zero_trip),
            ("a loop whose trip count and DMA length are LOADed", loaded),
            ("every lane of a word LOADed", _every_lane(n, LANES_AT)),
            ("every lane of its complement LOADed", _every_lane(n, LANES_AT + 1)),
            *_idma_programs(n, own_index)]


def acc_load_programs(n: int) -> list[tuple[str, list[int], str, int]]:
    """(what, program, the ErrorCode name it stops with, the pc) of LOADs from the
    accumulator on a tile with its accumulator (the words of :func:`loaded_words`
    written): a GEMM of :data:`COUNTS_WORD`'s bytes by :data:`ACC_B_WORD`'s, then each
    lane of its row 0 LOADed and compared with 3·(j + 1) (a wrong register halts
    early), and the same with :data:`LANES_WORD`, whose lane 1 is negative:
    BAD_REGISTER at its LOAD."""
    def product(b_at: int) -> list[int]:
        return [gemm(a=COUNTS_AT, b=b_at, c=16, m=n, k=1, p=n,
                     signal={"enable": 1, "semaphore": 0}),
                op(Opcode.WAIT, semaphore=0, count=1)]
    every = _loads_compared(product(ACC_B_AT), [
        (op(Opcode.LOAD, rd=1, addr=16, lane=lane, acc=1), 3 * (lane + 1))
        for lane in range(n)])
    negative = product(LANES_AT) + [op(Opcode.LOAD, rd=1, addr=16, lane=0, acc=1),
                                    op(Opcode.LOAD, rd=1, addr=16, lane=1, acc=1), HALT]
    return [("every lane of a GEMM's row LOADed from the accumulator", every,
             "NONE", len(every) - 1),
            ("a negative accumulator lane LOADed", negative, "BAD_REGISTER", 3)]


def register_errors(s: Sizes, n: int, depth: int) -> list[tuple[str, list[int], str, int]]:
    """(what, program, the ErrorCode name it stops with, the pc it stops at) for each
    way a register program goes wrong; ``n`` = the lanes of a word, ``depth`` = the
    program memory's words."""
    g, v, d = Opcode.GEMM, Opcode.VEC, Opcode.DMA
    top = (1 << 16) - 1
    outside = next(i for i in range(64) if not mesh_mask(s.mesh) >> i & 1)
    return [
        ("ADD below 0", [op(Opcode.ADD, rd=1, ra=1, imm=-1), HALT], "BAD_REGISTER", 0),
        ("ADD past 2**16 - 1", [op(Opcode.SET, rd=1, value=top),
                                op(Opcode.ADD, rd=2, ra=1, imm=1), HALT], "BAD_REGISTER", 1),
        ("a LOOP limit above its bound", [op(Opcode.SET, rd=1, value=5), gemm(),
                                          op(Opcode.LOOP, counter=2, limit=1, target=1,
                                             bound=4), HALT], "LOOP_BOUND", 2),
        ("a LOOP counter past 2**16 - 1", [op(Opcode.SET, rd=2, value=top),
                                           op(Opcode.LOOP, counter=2, limit=1, target=0,
                                              bound=top), HALT], "BAD_REGISTER", 1),
        ("a LOOP back past the program", [op(Opcode.SET, rd=1, value=2),
                                          op(Opcode.LOOP, counter=2, limit=1, target=depth,
                                             bound=2), HALT], "PC_OVERFLOW", 1),
        ("a SKIP past the program", [op(Opcode.SKIP, ra=0, rb=1, target=depth), HALT],
         "PC_OVERFLOW", 0),
        ("WITH a field GEMM lacks", [with_((len(WITH_FIELDS[g]) + 1, 0)), gemm(), HALT],
         "BAD_REGISTER", 1),
        ("WITH a field DMA lacks", [with_((0, 0), (len(WITH_FIELDS[d]) + 1, 0)), dma(), HALT],
         "BAD_REGISTER", 1),
        *[(f"WITH field {code} on {opcode.name}, which has {len(WITH_FIELDS[opcode])}",
           [with_((code, 0)), instruction, HALT], "BAD_REGISTER", 1)
          for opcode, instruction in _one_of_each().items()
          for code in range(len(WITH_FIELDS[opcode]) + 1, 16)],
        *[(f"WITH slot {slot} field {code} before HALT",
           [with_(*[(0, 0)] * slot, (code, 0)), HALT], "BAD_REGISTER", 1)
          for slot in range(WITH_SLOTS) for code in (1, 2, 4, 8)],
        ("WITH before SET", [with_((1, 0)), op(Opcode.SET, rd=1, value=1), HALT],
         "BAD_REGISTER", 1),
        ("WITH rows past 7 bits", [op(Opcode.SET, rd=1, value=121), with_(
            (_field(v, "rows"), 1)), vec(rows=7), HALT], "BAD_REGISTER", 2),
        ("WITH a GEMM address past 16 bits", [op(Opcode.SET, rd=1, value=top),
                                              with_((_field(g, "b"), 1)), gemm(b=1), HALT],
         "BAD_REGISTER", 2),
        ("WITH two registers past a 10-bit field", [
            op(Opcode.SET, rd=1, value=600),
            with_((_field(g, "c"), 1), (_field(g, "c"), 1)), gemm(c=0), HALT],
         "BAD_REGISTER", 2),
        ("WITH a WAIT count past 16 bits", [op(Opcode.SET, rd=1, value=top), with_(
            (_field(Opcode.WAIT, "count"), 1)), op(Opcode.WAIT, semaphore=0, count=1), HALT],
         "BAD_REGISTER", 2),
        ("WITH a tile index past the mask", [op(Opcode.SET, rd=1, value=64), with_(
            (_field(d, "tiles"), 1)), dma(tiles=0), HALT], "BAD_REGISTER", 2),
        ("WITH a tile outside the mesh", [op(Opcode.SET, rd=1, value=outside), with_(
            (_field(d, "tiles"), 1)), dma(tiles=0), HALT], "BAD_TILE", 2),
        ("WITH a region past the scratchpad", [op(Opcode.SET, rd=1, value=s.words - 4), with_(
            (_field(d, "src"), 1)), dma(length=5), HALT], "BAD_ADDRESS", 2),
        ("LOAD past the scratchpad", [op(Opcode.LOAD, rd=1, addr=s.words - 1, lane=0),
                                      op(Opcode.LOAD, rd=1, addr=s.words, lane=0), HALT],
         "BAD_ADDRESS", 1),
        ("LOAD past the word's lanes", [op(Opcode.LOAD, rd=1, addr=0, lane=n - 1),
                                        op(Opcode.LOAD, rd=1, addr=0, lane=n), HALT],
         "BAD_ADDRESS", 1),
        ("LOAD past the accumulator", [op(Opcode.LOAD, rd=1, addr=s.entries - 1, lane=0,
                                          acc=1),
                                       op(Opcode.LOAD, rd=1, addr=s.entries, lane=0, acc=1),
                                       HALT], "BAD_ADDRESS", 1),
        ("LOAD past an accumulator entry's lanes", [
            op(Opcode.LOAD, rd=1, addr=0, lane=n - 1, acc=1),
            op(Opcode.LOAD, rd=1, addr=0, lane=n, acc=1), HALT], "BAD_ADDRESS", 1),
        ("WITH a LOAD address past 16 bits", [op(Opcode.SET, rd=1, value=top), with_(
            (_field(Opcode.LOAD, "addr"), 1)), op(Opcode.LOAD, rd=2, addr=1), HALT],
         "BAD_REGISTER", 2),
        *_sums_just_too_wide(),
        *_sums_at_the_top(s, n),
        *_tile_indices_outside(s),
    ]


def _one_of_each() -> dict[Opcode, int]:
    """A valid instruction of each opcode WITH may precede."""
    return {Opcode.GEMM: gemm(), Opcode.VEC: vec(), Opcode.DMA: dma(),
            Opcode.WAIT: op(Opcode.WAIT, semaphore=0, count=0),
            Opcode.SIGNAL: op(Opcode.SIGNAL, semaphore=0, count=0),
            Opcode.LOAD: op(Opcode.LOAD, rd=1, addr=0, lane=0),
            Opcode.IDMA: op(Opcode.IDMA, src=0, dst=256, table=TABLES_AT, count=1, row=1)}


def _tile_indices_outside(s: Sizes) -> list[tuple[str, list[int], str, int]]:
    """A DMA whose tile WITH adds from a register, through each of its slots in turn:
    every index outside the mesh (on an empty mask), and tile 0's index on a mask naming
    tile 0 and one outside: BAD_TILE."""
    d, inside = Opcode.DMA, mesh_mask(s.mesh)
    outside = [i for i in range(64) if not inside >> i & 1]
    tiles = WITH_FIELDS[d].index("tiles") + 1
    def slot(i: int, reg: int) -> int:  # WITH's slot i % 3 (the ones before it unused)
        return with_(*[(0, 0)] * (i % WITH_SLOTS), (tiles, reg))

    out = [(f"WITH tile index {i}", [op(Opcode.SET, rd=1, value=i), slot(i, 1),
                                     dma(tiles=0), HALT], "BAD_TILE", 2)
           for i in range(64) if not inside >> i & 1]
    out += [(f"WITH slot {k}: tile index {i} on a mask naming tile 0",
             [op(Opcode.SET, rd=1, value=i), with_(*[(0, 0)] * k, (tiles, 1)),
              dma(tiles=1), HALT], "BAD_TILE", 2)
            for k in range(WITH_SLOTS) for i in (outside[0], outside[-1])]
    out += [(f"WITH tile index 0 on mask bits 0 and {i}", [slot(i, 2), dma(tiles=1 << i | 1),
                                                           HALT], "BAD_TILE", 1)
            for i in range(64) if not inside >> i & 1]
    return out


def _sums_just_too_wide() -> list[tuple[str, list[int], str, int]]:
    """For every field WITH adds to but a DMA's tiles, through each of WITH's slots: the
    field at 1 plus a register of all ones in the field's width, a sum one past it
    (for 16-bit fields a sum with no bit set but bit 16, which must still count as too
    wide); through the first slot, sums of each higher power of two up to 2**16, so
    every bit above the field counts: BAD_REGISTER. A bit of the register lost on the
    way makes the sum fit."""
    bases = {Opcode.GEMM: gemm, Opcode.VEC: vec, Opcode.DMA: dma,
             Opcode.WAIT: lambda **f: encode(Opcode.WAIT, **f),
             Opcode.SIGNAL: lambda **f: encode(Opcode.SIGNAL, **f),
             Opcode.LOAD: lambda **f: encode(Opcode.LOAD, **f),
             Opcode.IDMA: lambda **f: encode(Opcode.IDMA, **({"row": 1} | f))}
    out = []
    for opcode, names in WITH_FIELDS.items():
        for number, name in enumerate(names, 1):
            width = field_width(opcode, name)
            if name == "tiles":
                continue
            if width > REG_BITS:  # a register alone cannot overflow it: the field's top can
                out += [(f"WITH slot {slot}: {opcode.name} {name} + r = 2**{width}",
                         [op(Opcode.SET, rd=1, value=(1 << REG_BITS) - 1),
                          with_(*[(0, 0)] * slot, (number, 1)),
                          bases[opcode](**{name: (1 << width) - (1 << REG_BITS) + 1}), HALT],
                         "BAD_REGISTER", 2) for slot in range(WITH_SLOTS)]
                continue
            sums = [(slot, width) for slot in range(WITH_SLOTS)]
            sums += [(0, power) for power in range(width + 1, REG_BITS + 1)]
            out += [(f"WITH slot {slot}: {opcode.name} {name} + r = 2**{power}",
                     [op(Opcode.SET, rd=1, value=(1 << power) - 1),
                      with_(*[(0, 0)] * slot, (number, 1)), bases[opcode](**{name: 1}), HALT],
                     "BAD_REGISTER", 2) for slot, power in sums]
    return out


def _sums_at_the_top(s: Sizes, n: int) -> list[tuple[str, list[int], str, int]]:
    """For every field WITH adds to but a DMA's tiles and a WAIT's count, through each
    of WITH's slots: a register of alternating bits (0x5555 or 0xAAAA in the field's
    width) plus the field's rest up to its largest value, which fits: the error the
    instruction's own checks give, or none (only where nothing long runs). Any clear
    bit of the register set on the way makes the sum too wide (BAD_REGISTER)."""
    bases = {Opcode.GEMM: gemm, Opcode.VEC: vec, Opcode.DMA: dma,
             Opcode.SIGNAL: lambda **f: encode(Opcode.SIGNAL, **f),
             Opcode.LOAD: lambda **f: encode(Opcode.LOAD, **f)}
    out = []  # (an IDMA's checks depend on its table: idma_errors)
    for opcode, build in bases.items():
        for number, name in enumerate(WITH_FIELDS[opcode], 1):
            top = (1 << field_width(opcode, name)) - 1
            if name == "tiles":
                continue
            fields = decode(build(**{name: top}))[1]
            if opcode == Opcode.VEC:
                fields["dst_kind"] = VecDst(fields["dst_kind"])
            if opcode in (Opcode.GEMM, Opcode.VEC, Opcode.DMA):
                error = expected_error(opcode, fields, s, n)
            else:
                error = "BAD_ADDRESS" if opcode == Opcode.LOAD and top >= s.words else "NONE"
            if error == "NONE" and opcode != Opcode.SIGNAL:
                continue
            for slot in range(WITH_SLOTS):
                for pattern in (0x5555, 0xAAAA):
                    value = pattern & top
                    out.append((f"WITH slot {slot}: {opcode.name} {name} = {top - value:#x} "
                                f"+ r = {value:#x}",
                                [op(Opcode.SET, rd=1, value=value),
                                 with_(*[(0, 0)] * slot, (number, 1)),
                                 build(**{name: top - value}), HALT],
                                error, 2 if error != "NONE" else 3))
    return out


def random_register_program(rng, s: Sizes, own_index: int) -> list[int]:
    """A loop of 0..4 trips (SKIPped at 0) over GEMMs, VECs and DMAs, each after a WITH
    of up to three random (field, register) pairs — a field number one past the last
    now and then, register values from 0 up to past the memories — with ADDs between
    them and, now and then, a WITH before a SET; then HALT. Most programs run to the
    end; the others stop with the error the registers give (BAD_REGISTER, or a region
    or shape check). DMAs copy words from below 96 to 256 on, on the tile of index
    ``own_index``."""
    g, v, d = Opcode.GEMM, Opcode.VEC, Opcode.DMA
    values = [0, 1, 2, 3, 5, 8, 16, 96, 120, s.entries - 20, s.words - 300, (1 << 16) - 2]
    program = [op(Opcode.SET, rd=r, value=int(rng.choice(values[:6]) if rng.random() < 0.8
                                                   else rng.choice(values)))
               for r in range(1, 6)]
    program.append(op(Opcode.SET, rd=6, value=int(rng.integers(0, 5))))
    program.append(op(Opcode.SKIP, ra=7, rb=6, target=0))  # its target is set below
    skip_at, body = len(program) - 1, len(program)
    for _ in range(int(rng.integers(1, 5))):
        opcode = [g, v, d][int(rng.integers(3))]
        # (A DMA's tile stays this one: field 4 is left to register_programs.)
        last = 3 if opcode == d else len(WITH_FIELDS[opcode])
        pairs = [(last + 2 if rng.random() < 0.05 else int(rng.integers(1, last + 1)),
                  int(rng.integers(0, 6))) for _ in range(int(rng.integers(0, 4)))]
        slots = [(0, 0)] * int(rng.integers(0, 3 - len(pairs) + 1))  # unused slots first
        if pairs:
            program.append(with_(*(slots + pairs)))
        program.append({g: gemm(a_lo=1024, k=8), v: vec(rows=2),
                        d: dma(tiles=1 << own_index, dst=256)}[opcode])
        if rng.random() < 0.5:
            program.append(op(Opcode.ADD, rd=int(rng.integers(1, 6)),
                              ra=int(rng.integers(1, 6)), imm=int(rng.integers(-2, 4))))
        if rng.random() < 0.05:
            program += [with_((1, 1)), op(Opcode.SET, rd=1, value=0)]
    program.append(op(Opcode.LOOP, counter=7, limit=6, target=body, bound=4))
    program[skip_at] = op(Opcode.SKIP, ra=7, rb=6, target=len(program))
    return program + [HALT]
