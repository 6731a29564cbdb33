"""Instruction-level functional model of one tile: the reference the RTL tile is checked with.

:class:`TileModel` executes decoded instructions from pc 0 (or the last HALT's
``next``) — GEMM, VEC, DMA, IDMA, WAIT/SIGNAL, NOP, HALT and the register instructions
SET, ADD, LOAD, LOOP, SKIP and WITH, with the semantics of the docstrings in
``spec/isa.py`` — on a scratchpad, an accumulator memory, the vector unit's slot state
(:class:`golden.vector_model.VectorUnitModel`), the semaphores and the registers. An
instruction is ``(opcode_name, fields)``, what ``spec.isa.decode`` returns with
``opcode.name`` for the enum (an enum with a ``name`` is accepted too); missing fields
are 0, as ``spec.isa.encode`` makes them.

Every engine operation finishes before the next instruction starts, so the model is the
order-of-program meaning; the hardware must give the same memories and semaphores
whenever the program synchronises as the ISA requires (WAIT before using a result).

Widths: scratchpad words hold ``n`` int8 lanes (lane i = bits 8i..8i+7); accumulator
lanes are signed ``LANE_BITS`` = 48 bits and wrap; GEMM sums wrap at int32
(``NUMERICS.acc_bits``, :func:`golden.gemm.wrap`) before they are sign-extended to 48.
Anything the hardware would refuse or that would deadlock raises ``ValueError``; what
the sequencer stops with an error code of its own raises :class:`ProgramError`, which
names the code.
"""

from __future__ import annotations

import numpy as np

from golden.gemm import wrap
from golden.vector_model import LANE_BITS, VectorOpcode, VectorUnitModel, opcode_of
from spec.config import ceil_div
from spec.isa import (
    EMPTY_ENTRY,
    ENTRY_BITS,
    ENTRY_ROW_BITS,
    MASK_COLUMNS,
    REG_BITS,
    REGISTERS,
    WITH_FIELDS,
    WITH_SLOTS,
    DmaTarget,
    entries_per_word,
    field_width,
    tile_bit,
)
from spec.numerics import NUMERICS
from spec.vector import USES_B, USES_C

__all__ = [
    "ACC_ADDR_BITS", "FIELDS", "SEMAPHORES", "ProgramError", "TileModel", "VecDst",
    "VecPack", "acc_accesses", "lanes_word", "word_lanes",
]

#: Width of an accumulator address field (``spec.isa.ACC_ADDR_BITS``; a test checks it).
ACC_ADDR_BITS = 10
#: Semaphores per tile and their width (``spec.isa.SEMAPHORES``, ``COUNT_BITS``).
SEMAPHORES, COUNT_BITS = 16, 16

#: The fields of each opcode (``spec.isa`` layouts; a test checks they are the same).
FIELDS = {
    "HALT": ("next",), "NOP": (),
    "GEMM": ("signal", "a", "b", "c", "m", "k", "p", "a_rows", "b_rows", "accumulate",
             "acc_shift", "a_limbs", "a_lo", "a_row_major", "b_stride"),
    "VEC": ("signal", "op", "a", "a_scalar", "b", "b_scalar", "c", "c_imm", "imm", "dst",
            "dst_kind", "pack", "total", "total_write", "rows", "beats", "slot", "mult",
            "shift", "sat", "lo", "hi", "causal", "dst_stride"),
    "DMA": ("signal", "src", "dst", "length", "tiles", "remote_signal", "remote_semaphore",
            "target", "channel", "mem_addr"),
    "IDMA": ("signal", "src", "dst", "table", "count", "row", "scatter", "remote_signal",
             "remote_semaphore", "tile_base"),
    "WAIT": ("semaphore", "count"), "SIGNAL": ("semaphore", "count"),
    "SET": ("rd", "value"), "ADD": ("rd", "ra", "imm"),
    "LOOP": ("counter", "limit", "target", "bound"), "SKIP": ("ra", "rb", "target"),
    "LOAD": ("rd", "addr", "lane", "acc"),
    "WITH": tuple(f"{kind}{i}" for i in range(WITH_SLOTS) for kind in ("field", "reg")),
}

#: Per opcode name, the fields WITH may add to (field number = position + 1) and
#: their widths.
_WITH = {op.name: {name: field_width(op, name) for name in names}
         for op, names in WITH_FIELDS.items()}


class ProgramError(ValueError):
    """A program the sequencer stops with an error code: ``code`` is the
    ``rtl.sequencer.ErrorCode`` name (``BAD_REGISTER``, ``LOOP_BOUND``)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class VecDst:
    """``spec.isa.VecDst`` values."""

    TILE, SCALAR, SPAD, NONE = 0, 1, 2, 3


class VecPack:
    """``spec.isa.VecPack`` values: which bits of a lane become a scratchpad byte."""

    BYTE, LIMB_LO, LIMB_HI = 0, 1, 2


def _value(field) -> int:
    """An enumeration field's number (fields come decoded as ints or given as members)."""
    return int(getattr(field, "value", field))


def operands_used(f: dict) -> dict[str, bool]:
    """Per operand (``a``, ``b``, ``c``), whether a VEC with fields ``f`` reads it: a
    unless RECIP, b for ``spec.vector.USES_B``, c for ``USES_C`` unless ``c_imm``."""
    code = VectorOpcode(_value(f["op"]))
    return {"a": code != VectorOpcode.RECIP, "b": code in USES_B,
            "c": code in USES_C and not f.get("c_imm")}


def acc_accesses(engine: str, f: dict, n: int) -> tuple[int, int]:
    """The accumulator entries an engine operation (``engine`` ``GEMM`` or ``VEC``, its
    fields ``f``) reads and writes on a tile of ``n`` lanes, as the tile's
    ``acc_reads`` and ``acc_writes`` counters count them: a GEMM writes the rows of
    its result tiles up to m (the padding rows of the last row tile keep their entries)
    and, when it accumulates, reads every row, padding included; a VEC
    reads an entry a beat per operand its op uses (:func:`operands_used`) and writes
    one a beat into a TILE or SCALAR destination and one a block of N rows' totals.
    Other operations: none."""
    if engine == "GEMM":
        rows = ceil_div(f["m"], n) * ceil_div(f["p"], n) * n
        return (rows if f.get("accumulate") else 0), f["m"] * ceil_div(f["p"], n)
    if engine == "VEC":
        rows, beats = f["rows"], f["beats"]
        to_acc = _value(f.get("dst_kind", 0)) in (VecDst.TILE, VecDst.SCALAR)
        reads = sum(operands_used(f).values()) * rows * beats
        return reads, (rows * beats if to_acc else 0) + (
            ceil_div(rows, n) if f.get("total_write") else 0)
    return 0, 0


def word_lanes(word: int, n: int) -> np.ndarray:
    """The n int8 lanes of a scratchpad word (lane i = bits 8i..8i+7), as int64."""
    raw = np.array([(word >> (8 * i)) & 0xFF for i in range(n)], np.int64)
    return wrap(raw, 8)


def lanes_word(values, n: int) -> int:
    """A scratchpad word from n lane values (each taken modulo 256)."""
    values = [int(v) for v in values]
    if len(values) != n:
        raise ValueError(f"a word has {n} lanes, got {len(values)} values")
    return sum((v & 0xFF) << (8 * i) for i, v in enumerate(values))


class TileModel:
    """One tile, instruction by instruction (see the module docstring).

    Parameters: ``n`` lanes (the tensor core size), ``spad_words`` scratchpad words,
    ``acc_depth`` accumulator entries, ``slots`` and ``max_top_k`` of the vector unit,
    ``position`` = (x, y) of the tile in the ``mesh`` of (columns, rows) (a DMA naming
    only this tile is a local copy; an IDMA entry naming a tile outside the mesh stops
    the program).

    State: ``spad`` (list of ints, one word each), ``acc`` (int64 array (acc_depth, n),
    48-bit signed values), ``vector`` (the vector unit model), ``semaphores`` and
    ``registers`` (lists of ints), ``pc``, ``halted``, ``resume`` (where the next start
    runs from: the last HALT's ``next``), ``executed`` (every instruction
    run, in order, with the fields it ran with: a WITH's registers added), ``fetches``
    (instructions read from the program: every step, one that stops it included, as
    the tile's ``fetches`` counter counts them), ``acc_reads`` and ``acc_writes`` (the
    accumulator entries read and written, as the tile's counters of those names count
    them: :func:`acc_accesses` of every GEMM and VEC, and a read for an accumulator
    LOAD), ``issued``
    (every engine operation, in order, as (engine, fields): an IDMA's rows are DMAs, and
    an IDMA of no rows is a DMA of no words to no tile that carries its signal), and
    ``done`` = the ``signal`` field of every finished engine operation, per engine
    (``{"GEMM": [...], "VEC": [...], "DMA": [...]}``, in order).
    """

    def __init__(self, n: int = 8, spad_words: int = 4096, acc_depth: int = 256,
                 slots: int = 4, max_top_k: int | None = None,
                 position: tuple[int, int] = (0, 0), mesh: tuple[int, int] = (8, 8),
                 memory_channels: int = 0, channel_words: int = 0):
        if not 2 <= n <= 32:
            raise ValueError(f"lane count n must be 2..32, not {n}")
        if not 1 <= spad_words <= 1 << 16:
            raise ValueError(f"spad_words must be 1..65536, not {spad_words}")
        if not 1 <= acc_depth <= 1 << ACC_ADDR_BITS:
            raise ValueError(f"acc_depth must be 1..{1 << ACC_ADDR_BITS}, not {acc_depth}")
        x, y = position
        columns, rows = mesh
        if not (1 <= columns <= 8 and 1 <= rows <= 8):
            raise ValueError(f"mesh {mesh} is not 1..8 x 1..8 tiles")
        if not (0 <= x < columns and 0 <= y < rows):
            raise ValueError(f"tile position {position} is outside the {columns} x {rows} "
                             f"mesh")
        self.n, self.spad_words, self.acc_depth, self.position = n, spad_words, acc_depth, position
        self.mesh = (columns, rows)
        self.memory_channels, self.channel_words = memory_channels, channel_words
        self.spad = [0] * spad_words
        self.acc = np.zeros((acc_depth, n), np.int64)
        self.vector = VectorUnitModel(n, slots, max_top_k)
        self.semaphores = [0] * SEMAPHORES
        self.registers = [0] * REGISTERS
        self.pc = 0
        #: Where the next :meth:`start` puts the pc: the last HALT's ``next``.
        self.resume = 0
        self._with: list[tuple[int, int]] = []  # a WITH's (field number, register) pairs
        self.halted = False
        self.done = {"GEMM": [], "VEC": [], "DMA": []}
        #: Every instruction run, as (opcode name, fields with WITH's registers added).
        self.executed: list[tuple[str, dict]] = []
        self.fetches = 0
        self.acc_reads = self.acc_writes = 0
        #: Every engine operation, in order, as (engine name, fields).
        self.issued: list[tuple[str, dict]] = []
        #: Delivers a DMA that names other tiles: ``network(tile, fields, words)`` with
        #: the DMA's fields and the source words (``golden.chip_model.ChipModel`` sets it).
        #: None: such a DMA raises NotImplementedError (one tile, no network).
        self.network = None
        #: Runs a STORE or LOAD DMA: ``memory(tile, fields, words)`` with the words a
        #: STORE sends (None for a LOAD; ``golden.chip_model.ChipModel`` sets it).
        self.memory = None

    # --- running ----------------------------------------------------------------------

    def start(self) -> None:
        """What the sequencer's ``start`` does to the model: pc at ``resume`` (the last
        HALT's ``next``, 0 at first), registers 0, no WITH pending (the memories and
        semaphores are kept)."""
        self.pc, self.registers, self._with = self.resume, [0] * REGISTERS, []

    def run(self, instructions, max_steps: int = 1_000_000) -> int:
        """Execute ``(opcode_name, fields)`` instructions (the program memory from pc 0)
        from where :meth:`start` puts the pc until HALT or the pc leaves the program;
        returns how many were executed (HALT included). ValueError after ``max_steps``
        instructions."""
        self.start()
        for count in range(1, max_steps + 1):
            if not 0 <= self.pc < len(instructions):
                return count - 1
            if not self.step(*instructions[self.pc]):
                return count
        raise ValueError(f"the program did not halt within {max_steps} instructions")

    def would_block(self, opcode, fields: dict | None = None) -> bool:
        """True if ``step`` of this instruction would have to wait: a WAIT whose semaphore
        holds less than its count (nothing changes; a chip model retries it later)."""
        if getattr(opcode, "name", opcode) != "WAIT":
            return False
        f = self._fields("WAIT", fields, consume=False)
        self._check_semaphore(f["semaphore"])
        return self.semaphores[f["semaphore"]] < f["count"]

    def step(self, opcode, fields: dict | None = None) -> bool:
        """Execute the instruction at ``pc`` and move ``pc`` on; False after HALT."""
        self.fetches += 1
        name = getattr(opcode, "name", opcode)
        if name not in FIELDS:
            raise ValueError(f"unknown opcode {opcode!r}")
        f = self._fields(name, fields)
        if name == "HALT":
            self.halted, self.resume = True, f["next"]
            return False
        next_pc = self._scalar(name, f)
        if name in self.done:
            {"GEMM": self._gemm, "VEC": self._vec, "DMA": self._dma}[name](f)
            self._finished(name, f)
        elif name == "IDMA":
            self._idma(f)
        elif name == "SIGNAL":
            self._add(f["semaphore"], f["count"], "SIGNAL")
        elif name == "WAIT":
            sem, count = f["semaphore"], f["count"]
            self._check_semaphore(sem)
            if self.semaphores[sem] < count:
                raise ValueError(f"WAIT semaphore {sem} count {count} would block forever: "
                                 f"it holds {self.semaphores[sem]} and nothing else runs")
            self.semaphores[sem] -= count
        self.executed.append((name, f))
        self.pc = next_pc
        return True

    def _finished(self, engine: str, f: dict) -> None:
        """Engine operation ``f`` has run: it is issued and done, its signal raised."""
        self.issued.append((engine, f))
        self.done[engine].append(f["signal"])
        if f["signal"]["enable"]:
            self._add(f["signal"]["semaphore"], 1, f"{engine} signal")

    def _fields(self, name: str, fields: dict | None, consume: bool = True) -> dict:
        """Every field of the instruction (missing ones 0), with a pending WITH's
        registers added (``consume``: the WITH is used up)."""
        fields = dict(fields or {})
        unknown = set(fields) - set(FIELDS[name])
        if unknown:
            raise ValueError(f"{name} has no field(s) {sorted(unknown)}")
        f = {key: fields.get(key, 0) for key in FIELDS[name]}
        if "signal" in f:
            f["signal"] = {"enable": 0, "semaphore": 0, **(f["signal"] or {})}
        pending = self._with
        if consume:
            self._with = []
        if not pending:
            return f
        widths = _WITH.get(name)
        if widths is None:
            raise ProgramError("BAD_REGISTER", f"WITH before {name}, which takes none")
        names = list(widths)
        for number, reg in pending:
            if number > len(names):
                raise ProgramError("BAD_REGISTER", f"WITH field {number}: {name} has "
                                                   f"{len(names)}")
            field, value = names[number - 1], self.registers[reg]
            if field == "tiles":
                if value >= 64:
                    raise ProgramError("BAD_REGISTER", f"tile index r{reg} = {value}")
                f["tiles"] |= 1 << value
            else:
                f[field] += value
        for field, width in widths.items():
            if field != "tiles" and f[field] >= 1 << width:
                raise ProgramError("BAD_REGISTER", f"{name} {field} = {f[field]} does not "
                                                   f"fit {width} bits")
        return f

    def _scalar(self, name: str, f: dict) -> int:
        """The register instructions; the next pc of any instruction."""
        regs, top = self.registers, 1 << REG_BITS
        if name == "SET":
            regs[f["rd"]] = f["value"]
        elif name == "ADD":
            value = regs[f["ra"]] + f["imm"]
            if not 0 <= value < top:
                raise ProgramError("BAD_REGISTER", f"ADD gives {value}")
            regs[f["rd"]] = value
        elif name == "LOOP":
            limit, count = regs[f["limit"]], regs[f["counter"]] + 1
            if limit > f["bound"]:
                raise ProgramError("LOOP_BOUND", f"limit r{f['limit']} = {limit} is above "
                                                 f"the bound {f['bound']}")
            if count >= top:
                raise ProgramError("BAD_REGISTER", f"LOOP counter r{f['counter']} passes "
                                                   f"{top - 1}")
            regs[f["counter"]] = count
            if count < limit:
                return f["target"]
        elif name == "LOAD":
            if f["lane"] >= self.n:
                raise ValueError(f"LOAD lane {f['lane']} is past the word's {self.n} lanes")
            if f.get("acc"):
                self._acc_entry("LOAD", f["addr"])
                self.acc_reads += 1
                value = int(self.acc[f["addr"], f["lane"]])
                if not 0 <= value < top:
                    raise ProgramError("BAD_REGISTER", f"LOAD of accumulator entry "
                                                       f"{f['addr']} lane {f['lane']}: "
                                                       f"{value} is not a register value")
                regs[f["rd"]] = value
            else:
                self._spad_region("LOAD", f["addr"], 1)
                regs[f["rd"]] = (self.spad[f["addr"]] >> (8 * f["lane"])) & (top - 1)
        elif name == "SKIP" and regs[f["ra"]] >= regs[f["rb"]]:
            return f["target"]
        elif name == "WITH":
            self._with = [(f[f"field{i}"], f[f"reg{i}"]) for i in range(WITH_SLOTS)
                          if f[f"field{i}"]]
        return self.pc + 1

    def _check_semaphore(self, sem: int) -> None:
        if not 0 <= sem < SEMAPHORES:
            raise ValueError(f"semaphore {sem} out of range (0..{SEMAPHORES - 1})")

    def _add(self, sem: int, count: int, what: str) -> None:
        self._check_semaphore(sem)
        if self.semaphores[sem] + count >= 1 << COUNT_BITS:
            raise ValueError(f"{what}: semaphore {sem} would pass {(1 << COUNT_BITS) - 1}")
        self.semaphores[sem] += count

    # --- memories ---------------------------------------------------------------------

    def _spad_region(self, what: str, base: int, words: int) -> None:
        if base + words > self.spad_words:
            raise ValueError(f"{what}: scratchpad words {base}..{base + words - 1} run past "
                             f"the scratchpad ({self.spad_words} words)")

    def _acc_entry(self, what: str, addr: int) -> int:
        if not 0 <= addr < self.acc_depth:
            raise ValueError(f"{what}: accumulator entry {addr} out of range "
                             f"(depth {self.acc_depth})")
        return addr

    def _lanes(self, addr: int) -> np.ndarray:
        return word_lanes(self.spad[addr], self.n)

    def _block(self, base: int, count: int) -> np.ndarray:
        """Lanes of words base .. base + count - 1 as an int64 (count, n) array."""
        n, mask = self.n, (1 << (8 * self.n)) - 1
        raw = b"".join((w & mask).to_bytes(n, "little") for w in self.spad[base:base + count])
        return np.frombuffer(raw, np.int8).reshape(count, n).astype(np.int64)

    # --- GEMM -------------------------------------------------------------------------

    def _gemm_a(self, f: dict, base: int, what: str) -> np.ndarray:
        """The A operand (``ceil(m / N)·N`` rows x k) of a GEMM from the region at ``base``."""
        n, m, k = self.n, f["m"], f["k"]
        tm, tk = ceil_div(m, n), ceil_div(k, n)
        a = np.zeros((tm * n, k), np.int64)  # rows >= m: zero unless the words hold them
        if f["a_rows"] and f["a_row_major"]:  # word a + i*tk + c = A[i, c*N : c*N + N]
            self._spad_region(what, base, tk * m)
            rows = self._block(base, tk * m).reshape(m, tk * n)
            a[:m, :] = rows[:, :k]
        elif f["a_rows"]:  # word a + c*m + i = A[i, c*N : c*N + N]; lanes past k unused
            self._spad_region(what, base, tk * m)
            for c in range(tk):
                a[:m, c * n:(c + 1) * n] = self._block(base + c * m, m)[:, :k - c * n]
        else:  # word a + t*k + kk = A[t*N : t*N + N, kk]
            self._spad_region(what, base, tm * k)
            for t in range(tm):
                a[t * n:(t + 1) * n, :] = self._block(base + t * k, k).T
        return a

    def _gemm(self, f: dict) -> None:
        n, m, k, p = self.n, f["m"], f["k"], f["p"]
        if min(m, k, p) < 1:
            raise ValueError(f"GEMM shape m={m} k={k} p={p}: each must be >= 1")
        tm, tp, tk = ceil_div(m, n), ceil_div(p, n), ceil_div(k, n)
        a = self._gemm_a(f, f["a"], "GEMM A")
        if f["a_limbs"]:  # A = A_hi * 2**7 + A_lo, the low limbs at a_lo
            a = (a << NUMERICS.limb_bits) + self._gemm_a(f, f["a_lo"], "GEMM A low limb")
        b = np.zeros((k, tp * n), np.int64)
        if f["b_rows"]:  # word b + c*p + j = B[c*N : c*N + N, j]
            self._spad_region("GEMM B", f["b"], tk * p)
            for c in range(tk):
                b[c * n:(c + 1) * n, :p] = self._block(f["b"] + c * p, p)[:, :k - c * n].T
        elif f["b_stride"]:  # word b + kk*s + t = B[kk, t*N : t*N + N]
            s = f["b_stride"]
            self._spad_region("GEMM B", f["b"], (k - 1) * s + tp)
            rows = self._block(f["b"], (k - 1) * s + tp)
            for kk in range(k):
                b[kk, :] = rows[kk * s:kk * s + tp].ravel()
        else:  # word b + t*k + kk = B[kk, t*N : t*N + N]
            self._spad_region("GEMM B", f["b"], tp * k)
            for t in range(tp):
                b[:, t * n:(t + 1) * n] = self._block(f["b"] + t * k, k)
        result = wrap(a @ b, NUMERICS.acc_bits)
        self._acc_entry("GEMM C", f["c"] + tm * tp * n - 1)
        shift = f["acc_shift"]
        self._count_acc("GEMM", f)
        for ti in range(tm):
            for tj in range(tp):
                base = f["c"] + (ti * tp + tj) * n
                tile = result[ti * n:(ti + 1) * n, tj * n:(tj + 1) * n]
                live = min(n, m - ti * n)  # rows past m are not written
                if f["accumulate"]:
                    tile = (self.acc[base:base + n] << shift) + tile
                self.acc[base:base + live] = wrap(tile[:live], LANE_BITS)

    # --- VEC --------------------------------------------------------------------------

    def _check_vec(self, f: dict):
        """Refuse a VEC the hardware would (ValueError); its vector opcode.

        Every region the instruction names is checked before anything changes, used by
        its op or not, as the sequencer does:
        a tile region is ceil(rows / N) x beats x N entries, a scalar region
        ceil(rows / N) entries."""
        n, rows, beats = self.n, f["rows"], f["beats"]
        if rows < 1 or beats < 1:
            raise ValueError(f"VEC rows={rows} beats={beats}: each must be >= 1")
        if f["slot"] + rows > self.vector.slots:
            raise ValueError(f"VEC slots {f['slot']}..{f['slot'] + rows - 1} run past the "
                             f"vector unit's {self.vector.slots} slots")
        try:
            code = opcode_of(f["op"])
        except ValueError:
            raise ValueError(f"VEC op {f['op']} is not a vector opcode") from None
        kind, dst = f["dst_kind"], f["dst"]
        tile_last = ceil_div(rows, n) * beats * n - 1
        scalar_last = ceil_div(rows, n) - 1
        for what in ("a", "b"):
            last = scalar_last if f[f"{what}_scalar"] else tile_last
            self._acc_entry(f"VEC {what}", f[what] + last)
        if not f["c_imm"]:
            self._acc_entry("VEC c", f["c"] + scalar_last)
        if kind == VecDst.TILE:
            self._acc_entry("VEC dst", dst + tile_last)
        elif kind == VecDst.SCALAR:
            self._acc_entry("VEC dst", dst + scalar_last)
        elif kind == VecDst.SPAD:
            if f["pack"] not in (VecPack.BYTE, VecPack.LIMB_LO, VecPack.LIMB_HI):
                raise ValueError(f"VEC pack {f['pack']} is not a VecPack")
            stride = f["dst_stride"]
            self._spad_region("VEC dst", f["dst"],
                              (rows - 1) * stride + beats if stride else rows * beats)
        if f["total_write"]:
            self._acc_entry("VEC total", f["total"] + scalar_last)
            # The engine writes the totals of a block of N rows together after the
            # block's results, so a tile destination must keep clear of them.
            if kind == VecDst.TILE and dst <= f["total"] + scalar_last \
                    and f["total"] <= dst + tile_last:
                raise ValueError("VEC total entries overlap the TILE destination region")
        return code

    def _count_acc(self, engine: str, f: dict) -> None:
        reads, writes = acc_accesses(engine, f, self.n)
        self.acc_reads += reads
        self.acc_writes += writes

    def _vec(self, f: dict) -> None:
        code = self._check_vec(f)
        n, rows, beats = self.n, f["rows"], f["beats"]
        kind, dst = f["dst_kind"], f["dst"]
        uses = operands_used(f)
        written: set[tuple[int, int]] = set()  # (entry, lane) written by earlier beats
        self._count_acc("VEC", f)

        def read(what: str, addr: int, lanes) -> np.ndarray:
            if uses[what] and any((addr, i) in written for i in lanes):
                raise ValueError(f"VEC {what} reads accumulator entry {addr} after an "
                                 f"earlier beat of the same instruction wrote it")
            return self.acc[addr]

        def write(addr: int, lanes, values) -> None:
            for i in lanes:
                self.acc[addr, i] = values[i]
                written.add((addr, i))

        for r in range(rows):
            row_entry, row_lane = r // n, r % n
            for j in range(beats):
                tile = (r // n) * beats * n + j * n + r % n
                operands = {}
                for what in ("a", "b"):
                    if f[f"{what}_scalar"]:
                        value = np.zeros(n, np.int64)
                        value[0] = read(what, f[what] + row_entry, [row_lane])[row_lane]
                    else:
                        value = read(what, f[what] + tile, range(n)).copy()
                    operands[what] = value
                c = (f["imm"] if f["c_imm"]
                     else int(read("c", f["c"] + row_entry, [row_lane])[row_lane]))
                step = r * f["causal"]
                mask = sum(1 << i for i in range(n)
                           if f["lo"] + step <= j * n + i < f["hi"] + step
                           and (i == 0 or not f["a_scalar"]))
                data, total = self.vector.step({
                    "opcode": code, "a": operands["a"], "b": operands["b"], "c": c,
                    "mult": f["mult"], "shift": f["shift"], "sat": f["sat"], "mask": mask,
                    "slot": f["slot"] + r, "first": int(j == 0)})
                if kind == VecDst.TILE:
                    write(dst + tile, range(n), data)
                elif kind == VecDst.SCALAR:
                    write(dst + row_entry, [row_lane], {row_lane: data[0]})
                elif kind == VecDst.SPAD:
                    low = (0, 0, 7)[f["pack"]]
                    bits = (8, 7, 7)[f["pack"]]
                    word = [(int(x) >> low) & ((1 << bits) - 1) for x in data]
                    at = r * f["dst_stride"] + j if f["dst_stride"] else j * rows + r
                    self.spad[f["dst"] + at] = lanes_word(word, n)
                if f["total_write"] and j == beats - 1:
                    write(f["total"] + row_entry, [row_lane], {row_lane: total})

    # --- DMA --------------------------------------------------------------------------

    def _dma(self, f: dict) -> None:
        if _value(f.get("target", 0)) != DmaTarget.TILES.value:
            self._memory_dma(f)
            return
        x, y = self.position
        here = tile_bit(x, y)
        if f["tiles"] == 0:
            raise ValueError("DMA to no tile (tiles = 0)")
        if f["tiles"] != here and self.network is None:
            raise NotImplementedError(
                f"DMA to tiles {f['tiles']:#x}: only a copy to this tile ({here:#x}) is "
                f"modelled; transfers to other tiles need the network (NoC): run the tile "
                f"in golden.chip_model.ChipModel")
        length = f["length"]
        self._spad_region("DMA src", f["src"], length)
        words = self.spad[f["src"]:f["src"] + length]
        if f["tiles"] != here:
            self.network(self, f, words)
            return
        self.check_receive(f["dst"], length)
        self.receive(f["dst"], words, f["remote_signal"], f["remote_semaphore"])

    def _memory_dma(self, f: dict) -> None:
        """A STORE or LOAD (``spec.isa.DmaArgs``): the sequencer's checks (both regions,
        the channel's words, the channel), then the chip's ``memory`` hook."""
        length, target = f["length"], _value(f["target"])
        self._spad_region("DMA src", f["src"], length)
        self._spad_region("DMA dst", f["dst"], length)
        if f["mem_addr"] + length > self.channel_words:
            raise ValueError(f"memory DMA of {length} words from {f['mem_addr']} runs past "
                             f"the channel's {self.channel_words} words")
        if target not in (DmaTarget.STORE.value, DmaTarget.LOAD.value) \
                or not f["channel"] < self.memory_channels:
            raise ValueError(f"memory DMA to channel {f['channel']} (target {target}): the "
                             f"chip has {self.memory_channels} memory channels")
        if self.memory is None:
            raise NotImplementedError("memory DMAs need the chip's memory channels: run the "
                                      "tile in golden.chip_model.ChipModel")
        words = (self.spad[f["src"]:f["src"] + length] if target == DmaTarget.STORE.value
                 else None)
        self.memory(self, f, words)

    def _idma(self, f: dict) -> None:
        """IDMA (``spec.isa.IdmaArgs``): the checks of the whole instruction, then one
        DMA per table entry that is not empty, the signal after the last entry
        (ProgramError BAD_INDEX at an entry past the scratchpad or the mesh, the rows
        before it moved)."""
        count, row, per_word = f["count"], f["row"], entries_per_word(self.n)
        if row == 0:
            raise ValueError("IDMA of rows of 0 words")
        step, indexed = ("src", "dst") if f["scatter"] else ("dst", "src")
        self._spad_region("IDMA table", f["table"], ceil_div(count, per_word))
        self._spad_region(f"IDMA {step}", f[step], count * row)
        quiet = {"enable": 0, "semaphore": 0}
        nothing = {"src": 0, "dst": 0, "length": 0, "tiles": 0, "remote_signal": 0,
                   "remote_semaphore": 0, "target": 0, "channel": 0, "mem_addr": 0}
        columns, rows = self.mesh
        moved = 0
        for i in range(count):
            last = i == count - 1
            word = self.spad[f["table"] + i // per_word]
            entry = word >> ENTRY_BITS * (i % per_word) & ((1 << ENTRY_BITS) - 1)
            if entry == EMPTY_ENTRY:
                if last:  # the signal still comes after the last entry
                    self._finished("DMA", {"signal": f["signal"], **nothing})
                continue
            r = entry & ((1 << ENTRY_ROW_BITS) - 1)
            tile = (entry >> ENTRY_ROW_BITS) + f["tile_base"]
            base = f[indexed] + r * row
            x, y = tile % MASK_COLUMNS, tile // MASK_COLUMNS
            if base + row > self.spad_words or not (x < columns and y < rows):
                raise ProgramError("BAD_INDEX", f"IDMA entry {i} = row {r} of tile {tile}: "
                                                f"past the scratchpad or the mesh")
            d = {"signal": f["signal"] if last else quiet, indexed: base,
                 step: f[step] + moved * row, "length": row, "tiles": tile_bit(x, y),
                 "remote_signal": f["remote_signal"],
                 "remote_semaphore": f["remote_semaphore"], "target": 0, "channel": 0,
                 "mem_addr": 0}
            self._dma(d)
            self._finished("DMA", d)
            moved += 1
        if count == 0:
            self._finished("DMA", {"signal": f["signal"], **nothing})

    def check_receive(self, dst: int, length: int) -> None:
        """Refuse (ValueError) DMA words that would run past this tile's scratchpad."""
        self._spad_region("DMA dst", dst, length)

    def receive(self, dst: int, words, remote_signal: int = 0, semaphore: int = 0) -> None:
        """DMA words landing here at ``dst``; then the remote signal, if any."""
        words = list(words)
        self.check_receive(dst, len(words))
        self.spad[dst:dst + len(words)] = words
        if remote_signal:
            self._add(semaphore, 1, "DMA remote signal")
