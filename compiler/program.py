"""A compiled tile program and what the host does around it.

:class:`TileProgram`: the instruction words, the scratchpad words the host writes before
``start``, the KV pages (MAP requests and appends, or the words to place directly), a
reader that turns the scratchpad after HALT into the int8 result, and a static summary
(:class:`ProgramSummary`). :func:`run_on_model` runs one on the functional tile model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from compiler.kv import KvLayout
from golden.tile_model import acc_accesses
from golden.vector_model import VectorOpcode
from spec.config import TileConfig
from spec.isa import Opcode, encode

__all__ = ["ProgramSummary", "TileProgram", "encode_ops", "frozen", "relocated",
           "run_on_model", "summarise"]

#: An instruction before encoding: the opcode and its fields (``spec.isa.encode``'s
#: keyword arguments; ints for enum fields).
Op = tuple[Opcode, dict]


@dataclass(frozen=True)
class ProgramSummary:
    """Static, cycle-free figures of a program.

    ``instructions``: words by opcode (``GEMM``, ``VEC``, ``WAIT``, ``HALT``, ...) and
    ``vec_ops`` by vector opcode. ``macs``: sum of m·k·p over the GEMMs (the tensor
    core's multiply-accumulates; a GEMM with A joined from two limbs counts once).
    ``kv_bytes_read``: bytes the GEMMs fetch from the KV region; ``kv_bytes_unique``:
    distinct KV words touched x N. ``spad_words`` and
    ``acc_entries``: the non-KV scratchpad words and accumulator entries the program uses.
    ``acc_reads``, ``acc_writes``: the accumulator entry accesses of its GEMMs and VECs
    (``golden.tile_model.acc_accesses``: what the tile's counters of those names count).
    """

    instructions: dict[str, int]
    vec_ops: dict[str, int]
    macs: int
    kv_bytes_read: int
    kv_bytes_unique: int
    spad_words: int
    acc_entries: int
    notes: dict[str, int] = field(default_factory=dict)
    acc_reads: int = 0
    acc_writes: int = 0

    @property
    def length(self) -> int:
        return sum(self.instructions.values())

    def as_dict(self) -> dict:
        return {"length": self.length, "instructions": dict(self.instructions),
                "vec_ops": dict(self.vec_ops), "macs": self.macs,
                "kv_bytes_read": self.kv_bytes_read, "kv_bytes_unique": self.kv_bytes_unique,
                "spad_words": self.spad_words, "acc_entries": self.acc_entries, **self.notes}


def summarise(config: TileConfig, ops: Sequence[Op], spad_words: int, acc_entries: int,
              notes: dict[str, int] | None = None, *,
              executed: Sequence[Op] | None = None) -> ProgramSummary:
    """The :class:`ProgramSummary` of decoded-form instructions; ``executed``: the
    operations they run, when loops make them differ (``vec_ops``, MACs and KV bytes
    count those, ``instructions`` the words)."""
    n = config.n
    executed = ops if executed is None else executed
    kinds = Counter(op.name for op, _ in ops)
    vec = Counter(VectorOpcode(f["op"]).name for op, f in executed if op == Opcode.VEC)
    macs = kv_read = acc_reads = acc_writes = 0
    kv_touched: set[int] = set()
    for op, f in executed:
        reads, writes = acc_accesses(op.name, f, n)
        acc_reads, acc_writes = acc_reads + reads, acc_writes + writes
        if op != Opcode.GEMM:
            continue
        m, k, p = f["m"], f["k"], f["p"]
        macs += m * k * p
        chunks_k = -(-k // n)
        b_words = (chunks_k * p if f.get("b_rows")
                   else (k - 1) * f["b_stride"] + -(-p // n) if f.get("b_stride")
                   else -(-p // n) * k)
        for base, words in ((f["a"], chunks_k * m if f.get("a_rows") else -(-m // n) * k),
                            (f["b"], b_words)):
            if config.kv_start <= base < config.kv_end:
                kv_read += words * n
                kv_touched.update(range(base, base + words))
    return ProgramSummary(dict(kinds), dict(vec), macs, kv_read, len(kv_touched) * n,
                          spad_words, acc_entries, dict(notes or {}), acc_reads, acc_writes)


_ENCODED: dict[tuple, int] = {}


def frozen(value):
    """An instruction's fields (nested dicts) as a hashable, order-independent value."""
    if isinstance(value, dict):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    return value


def encode_ops(ops: Sequence[Op]) -> list[int]:
    """Instruction words of ``ops`` (``spec.isa.encode``, memoised: programs repeat
    instructions)."""
    words = []
    for op, fields in ops:
        key = (op, frozen(fields))
        word = _ENCODED.get(key)
        if word is None:
            word = _ENCODED[key] = encode(op, **fields)
        words.append(word)
    return words


def relocated(words: Sequence[int], offset: int) -> list[int]:
    """Instruction words moved ``offset`` words on in the program memory (instructions
    put before them): each LOOP's and SKIP's ``target`` moved with them."""
    from spec.isa import decode

    out = []
    for word in words:
        opcode, fields = decode(word)
        if opcode in (Opcode.LOOP, Opcode.SKIP):
            word = encode(opcode, **{**fields, "target": fields["target"] + offset})
        out.append(word)
    return out


@dataclass(frozen=True)
class OutputRows:
    """How an int8 output tensor is read back from scratchpad words: ``rows`` lists
    (index into the output, the words holding that row); a row is the int8 lanes of its
    words in order (N per word, lane i in bits 8i..8i+7), the first ``width`` kept.
    Plain data, so a compiled program can be handed to another process."""

    shape: tuple[int, ...]
    n: int
    width: int
    rows: list[tuple[tuple[int, ...], list[int]]]

    def __call__(self, read: Callable[[int], int]) -> np.ndarray:
        out = np.zeros(self.shape, np.int8)
        for index, words in self.rows:
            lanes = [(read(w) >> (8 * x)) & 0xFF for w in words for x in range(self.n)]
            out[index] = np.array(lanes[:self.width], np.uint8).view(np.int8)
        return out


@dataclass(frozen=True)
class TileProgram:
    """One program for one tile (see the module docstring).

    ``instructions``: 256-bit words to load at pc 0. ``ops``: the same as
    (``Opcode``, fields) before encoding. ``spad_writes``: {address: word} the host
    writes before ``start`` (queries, constants). ``kv``: the KV pages the program
    reads; ``kv_map`` / ``kv_appends`` are the host's KvOp.MAP and KvOp.APPEND requests
    ((seq, index, phys) and (seq, word, data, last)); ``kv_words`` the same contents as
    {address: word} for a functional model. ``output_words``: the addresses the reader
    needs; ``read_output(words)`` takes the scratchpad (a sequence indexable by address,
    or a function address -> word) and returns the int8 result.
    """

    config: TileConfig
    kind: str
    instructions: list[int]
    ops: list[Op]
    spad_writes: dict[int, int]
    kv: KvLayout
    kv_map: list[tuple[int, int, int]]
    kv_appends: list[tuple[int, int, int, bool]]
    kv_words: dict[int, int]
    output_words: list[int]
    output_shape: tuple[int, ...]
    summary: ProgramSummary
    _reader: OutputRows = field(repr=False)

    def read_output(self, words: Sequence[int] | Callable[[int], int]) -> np.ndarray:
        read = words if callable(words) else words.__getitem__
        return self._reader(read)


def run_on_model(program: TileProgram, model=None):
    """Run ``program`` on ``golden.tile_model.TileModel`` (a fresh one sized by the
    program's config unless given): host writes, KV placement, the decoded words, then
    the reader. Returns (output, model). Raises ValueError if the program does not halt
    with every semaphore back at zero."""
    from golden.tile_model import TileModel
    from spec.isa import decode

    cfg = program.config
    if model is None:
        model = TileModel(cfg.n, spad_words=cfg.spad_words, acc_depth=cfg.acc_depth,
                          slots=cfg.slots)
    for addr, word in {**program.kv_words, **program.spad_writes}.items():
        model.spad[addr] = word
    decoded = [(opcode.name, fields) for opcode, fields in map(decode, program.instructions)]
    model.run(decoded)
    if not model.halted:
        raise ValueError("the program ended without HALT")
    if any(model.semaphores):
        raise ValueError(f"semaphores not balanced at HALT: {model.semaphores}")
    return program.read_output(model.spad), model
