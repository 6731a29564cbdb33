"""The tile instruction set, defined once: the sequencer decodes these layouts and the
program builder encodes with them (see docs/isa.md).

An instruction is one 128-bit word: a 4-bit :class:`Opcode` in the low bits, then the
operation's fields (:data:`INSTRUCTION`, a struct of the opcode and a union of one
layout per operation). Engine operations (GEMM, VEC, DMA) carry a :data:`SIGNAL` field:
when the engine finishes the operation, the tile increments that local semaphore.
"""

from __future__ import annotations

from amaranth import Shape, unsigned
from amaranth.lib import data, enum

__all__ = [
    "ADDR_BITS", "DmaArgs", "GemmArgs", "INSTRUCTION", "INSTRUCTION_BITS", "Opcode",
    "SEMAPHORES", "SIGNAL", "VecArgs", "WaitArgs", "decode", "encode",
]

#: Width of an instruction word.
INSTRUCTION_BITS = 128
#: Scratchpad word address width (a tile addresses at most 2**16 words).
ADDR_BITS = 16
#: Semaphore counters per tile; a semaphore is named by a 4-bit index.
SEMAPHORES = 16
#: Width of a semaphore count (the counters themselves are this wide).
COUNT_BITS = 16
#: Mesh coordinates are 3 bits each (meshes up to 8 x 8); a tile set is a 64-bit mask,
#: bit ``y * 8 + x`` for tile (x, y).
TILE_MASK_BITS = 64


class Opcode(enum.Enum, shape=4):
    """Operation codes. 0 and 8-15 are illegal, so a word of zeros never executes."""

    HALT = 1  # stop; the sequencer reports `halted`
    NOP = 2
    GEMM = 3  # tensor-core GEMM between scratchpad regions
    VEC = 4  # vector-unit operation between scratchpad regions
    DMA = 5  # copy a scratchpad region to a set of tiles' scratchpads (this one included)
    WAIT = 6  # block until a semaphore reaches a count, then subtract the count
    SIGNAL = 7  # add a count to a local semaphore


#: Optional completion signal of an engine operation.
SIGNAL = data.StructLayout({"enable": 1, "semaphore": unsigned(4)})


class GemmArgs(data.StructLayout):
    """C[m x p] = A[m x k] · B[k x p], operands in the tensor-core beat layout.

    ``a``: ceil(m/N) blocks of k words (word = column of an N-row block of A); ``b``:
    ceil(p/N) blocks of k words (word = row of an N-column block of B); ``c``: output tiles
    in row-tile-major order, each N rows; a row is one word when ``requantise`` is set
    (int8, by ``multiplier`` and ``shift``, see docs/numerics.md) and 32/8 words (int32)
    otherwise.
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "a": unsigned(ADDR_BITS),
            "b": unsigned(ADDR_BITS),
            "c": unsigned(ADDR_BITS),
            "m": unsigned(12),
            "k": unsigned(12),
            "p": unsigned(12),
            "requantise": 1,
            "multiplier": unsigned(16),
            "shift": unsigned(6),
        })


class VecArgs(data.StructLayout):
    """A vector-unit operation ``op`` over ``length`` words: dst = op(src_a, src_b, imm)."""

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "op": unsigned(6),
            "src_a": unsigned(ADDR_BITS),
            "src_b": unsigned(ADDR_BITS),
            "dst": unsigned(ADDR_BITS),
            "length": unsigned(12),
            "slot": unsigned(6),
            "imm": unsigned(32),
        })


class DmaArgs(data.StructLayout):
    """Copy ``length`` words from local ``src`` to ``dst`` on every tile in ``tiles``.

    On arrival at each destination, that tile's semaphore ``remote_semaphore`` is
    incremented when ``remote_signal`` is set. ``length`` 0 sends only the signal.
    """

    def __init__(self):
        super().__init__({
            "signal": SIGNAL,
            "src": unsigned(ADDR_BITS),
            "dst": unsigned(ADDR_BITS),
            "length": unsigned(12),
            "tiles": unsigned(TILE_MASK_BITS),
            "remote_signal": 1,
            "remote_semaphore": unsigned(4),
        })


class WaitArgs(data.StructLayout):
    """WAIT: until semaphore >= count, then semaphore -= count. SIGNAL: semaphore += count."""

    def __init__(self):
        super().__init__({"semaphore": unsigned(4), "count": unsigned(COUNT_BITS)})


#: One instruction word.
INSTRUCTION = data.StructLayout({
    "opcode": Opcode,
    "args": data.UnionLayout({
        "gemm": GemmArgs(),
        "vec": VecArgs(),
        "dma": DmaArgs(),
        "wait": WaitArgs(),
    }),
})
assert INSTRUCTION.size <= INSTRUCTION_BITS

#: Which union member holds an opcode's fields (HALT and NOP have none).
ARGS_OF = {
    Opcode.GEMM: "gemm", Opcode.VEC: "vec", Opcode.DMA: "dma",
    Opcode.WAIT: "wait", Opcode.SIGNAL: "wait",
}


def encode(opcode: Opcode, **fields) -> int:
    """One instruction word, e.g. ``encode(Opcode.WAIT, semaphore=3, count=2)``.

    Unknown or out-of-range fields raise an error from the layout itself.
    """
    member = ARGS_OF.get(opcode)
    if member is None and fields:
        raise ValueError(f"{opcode.name} takes no fields, got {sorted(fields)}")
    value = {"opcode": opcode}
    if member is not None:
        _check_fields(INSTRUCTION["args"].shape[member].shape, fields, opcode.name)
        value["args"] = {member: fields}
    return INSTRUCTION.const(value).as_value().value


def _check_fields(layout: data.StructLayout, fields: dict, path: str) -> None:
    """Refuse unknown fields and values that do not fit (the layout would truncate them)."""
    known = dict(iter(layout))
    unknown = set(fields) - set(known)
    if unknown:
        raise ValueError(f"{path} has no field(s) {sorted(unknown)}")
    for name, value in fields.items():
        shape = known[name].shape
        if isinstance(shape, data.StructLayout):
            _check_fields(shape, value, f"{path}.{name}")
        elif not 0 <= value < (1 << Shape.cast(shape).width):
            raise ValueError(f"{path}.{name} = {value} does not fit {Shape.cast(shape).width} bits")


def decode(word: int) -> tuple[Opcode, dict]:
    """The opcode and fields of an instruction word; ``ValueError`` for an illegal opcode."""
    if not 0 <= word < (1 << INSTRUCTION_BITS):
        raise ValueError(f"instruction word {word:#x} is wider than {INSTRUCTION_BITS} bits")
    try:
        opcode = data.Const(INSTRUCTION, word & ((1 << INSTRUCTION.size) - 1)).opcode
    except ValueError:
        raise ValueError(f"illegal opcode {word & 0xF} in instruction word {word:#x}") from None
    member = ARGS_OF.get(opcode)
    if member is None:
        return opcode, {}
    args = data.Const(INSTRUCTION, word & ((1 << INSTRUCTION.size) - 1)).args[member]
    return opcode, _as_dict(args)


def _as_dict(const) -> dict:
    out = {}
    for name, _ in const.shape():
        value = const[name]
        out[name] = _as_dict(value) if isinstance(value, data.Const) else int(value)
    return out
