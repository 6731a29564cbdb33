"""What every program builder shares: the emitter that synchronises the engines from the
hazards of the operations it is given, and the allocator of memory regions.

:class:`Emitter` takes GEMM, VEC and DMA operations in program order. Before each it finds
the earlier operations of other engines that touch the same scratchpad words or
accumulator entries (``compiler.hazards.accesses``: read after write, write after read,
write after write) and are not yet known to have finished, turns on their completion
signal and WAITs for them — the protocol ``compiler.hazards.check_synchronisation``
checks. One semaphore per engine (:data:`ENGINE_SEMAPHORES`): the engine runs its
operations in order, so the k-th signal on it means its k-th signalling operation has
finished, and a WAIT for several at once costs one instruction. What finished is tracked
transitively (an operation dispatched after a WAIT finishes after what the WAIT covered),
so no WAIT is emitted that an earlier one made unnecessary. A builder only orders the
operations well (independent work between a producer and its consumer) and places its
buffers; the WAITs follow.

:class:`Regions` hands out regions of one memory (scratchpad words outside the KV
region, accumulator entries): first fit over free ranges, a region optionally starting
in a given bank, and a :class:`MemoryFull` naming what did not fit and the largest uses.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

from compiler.hazards import accesses
from compiler.program import Op
from golden.vector_model import VectorOpcode
from spec.isa import WITH_FIELDS, WITH_SLOTS, Opcode, VecDst, VecPack

__all__ = ["ENGINE_SEMAPHORES", "Emitter", "MemoryFull", "Regions"]

#: The completion semaphore of each engine. Semaphores above these are free for
#: arrivals (words another tile sent).
ENGINE_SEMAPHORES = {Opcode.GEMM: 0, Opcode.VEC: 1, Opcode.DMA: 2}


def _value(kind, member) -> int:
    """The value of a member of enumeration ``kind`` given as a member or its value (an
    Amaranth enum's call costs microseconds: members skip it)."""
    return member.value if isinstance(member, kind) else kind(member).value


class Emitter:
    """(Opcode, fields) instructions with the WAITs their hazards need (see the module
    docstring). ``n``: the tile's array size (operand widths). Engines are tracked by
    their completion semaphore (0 GEMM, 1 VEC, 2 DMA)."""

    def __init__(self, n: int):
        self.n = n
        self.ops: list[Op] = []
        engines = len(ENGINE_SEMAPHORES)
        self.known = [-1] * engines  # per engine, the last op index known finished
        self.snapshot: dict[int, list[int]] = {}  # op index -> `known` when dispatched
        self.signalled: list[list[int]] = [[] for _ in range(engines)]  # not waited
        self.engine_of: dict[int, int] = {}  # op index -> its engine
        self.last_write: dict[int, int] = {}  # address -> the op that last wrote it
        self.last_of: dict[int, int] = {}  # engine -> its latest operation
        self.readers: dict[int, list[int]] = {}  # address -> per engine its last reader

    def _wait_for(self, index: int) -> None:
        engine = self.engine_of[index]
        pending = self.signalled[engine]
        if index not in pending:
            self.ops[index][1]["signal"] = {"enable": 1, "semaphore": engine}
            pending.append(index)
            pending.sort()
        count = sum(1 for i in pending if i <= index)
        self.signalled[engine] = [i for i in pending if i > index]
        self.ops.append((Opcode.WAIT, {"semaphore": engine, "count": count}))
        known = self.known
        for e, i in enumerate(self.snapshot[index]):
            known[e] = max(known[e], i)
        known[engine] = max(known[engine], index)

    def engine(self, op: Opcode, fields: dict, *, assume: dict | None = None,
               prefix: Op | None = None) -> int:
        """Emit one engine operation after the WAITs it needs (and ``prefix``, a WITH,
        right before it), its accesses those of ``fields | assume``; its index."""
        reads, writes = accesses(op, {**fields, **(assume or {})}, self.n)
        engine = ENGINE_SEMAPHORES[op]
        known, engine_of = self.known, self.engine_of
        last_write, readers = self.last_write, self.readers
        need = [-1] * len(known)  # per other engine, the latest op this one must follow
        for address in chain(reads, writes):  # after the last write (RAW, WAW)
            i = last_write.get(address)
            if i is not None:
                e = engine_of[i]
                if e != engine and i > known[e] and i > need[e]:
                    need[e] = i
        for address in writes:  # after the last readers (WAR)
            last = readers.get(address)
            if last is not None:
                for e, i in enumerate(last):
                    if e != engine and i > known[e] and i > need[e]:
                        need[e] = i
        for e, i in enumerate(need):
            if i > known[e]:
                self._wait_for(i)
        if prefix is not None:
            self.ops.append(prefix)
        j = len(self.ops)
        self.ops.append((op, fields))
        engine_of[j] = engine
        self.last_of[engine] = j
        self.snapshot[j] = list(known)
        for address in reads:
            last = readers.get(address)
            if last is None:
                readers[address] = last = [-1] * len(known)
            last[engine] = j
        for address in writes:
            last_write[address] = j
            readers.pop(address, None)
        return j

    def dynamic(self, op: Opcode, fields: dict, registers: list[tuple[str, int]],
                assume: dict) -> int:
        """An engine operation with registers added to its fields at run time (a WITH
        of ``registers``, (field name, register) pairs, right before it): its hazards
        are found as if the fields were ``fields | assume`` (the largest region the
        registers may make, within a stretch the builder fences with :meth:`drain`).
        Its index."""
        if not 1 <= len(registers) <= WITH_SLOTS:
            raise ValueError(f"a WITH takes 1..{WITH_SLOTS} registers, not {len(registers)}")
        slots = {}
        for i, (name, reg) in enumerate(registers):
            slots |= {f"field{i}": WITH_FIELDS[op].index(name) + 1, f"reg{i}": reg}
        return self.engine(op, fields, assume=assume, prefix=(Opcode.WITH, slots))

    def drain(self) -> None:
        """WAIT until every engine operation emitted so far has finished (a fence: code
        after it, a loop body run again say, starts with every engine idle)."""
        for engine in self.last_of:
            self._finish(engine)

    def wait_engine(self, op: Opcode) -> None:
        """WAIT until every operation emitted so far on the engine of ``op`` has
        finished (what raw operations after it may read, say)."""
        self._finish(ENGINE_SEMAPHORES[op])

    def _finish(self, engine: int) -> None:
        last = self.last_of.get(engine)
        if last is not None and last > self.known[engine]:
            self._wait_for(last)

    def gemm(self, **fields) -> int:
        """A GEMM; its index."""
        return self.engine(Opcode.GEMM, fields)

    def vec(self, op: VectorOpcode, rows: int, beats: int, a: int, *, a_scalar: int = 0,
            b: int | None = None, b_scalar: int | None = None, c: int | None = None,
            imm: int | None = None, dst_kind: VecDst = VecDst.NONE,
            pack: VecPack = VecPack.BYTE, registers: list[tuple[str, int]] | None = None,
            assume: dict | None = None, **fields) -> None:
        """A VEC: ``b`` defaults to ``a`` and ``b_scalar`` to ``a_scalar``; ``imm`` (an
        immediate C) or ``c`` (an accumulator entry); with ``registers``, a
        :meth:`dynamic` one."""
        fields.update(op=int(op), rows=rows, beats=beats, a=a, a_scalar=a_scalar,
                      b=a if b is None else b,
                      b_scalar=a_scalar if b_scalar is None else b_scalar,
                      dst_kind=_value(VecDst, dst_kind), pack=_value(VecPack, pack))
        if imm is not None:
            fields.update(c_imm=1, imm=imm)
        elif c is not None:
            fields["c"] = c
        if registers:
            self.dynamic(Opcode.VEC, fields, registers, assume or {})
        else:
            self.engine(Opcode.VEC, fields)

    def dma(self, **fields) -> None:
        self.engine(Opcode.DMA, fields)

    def wait_arrivals(self, semaphore: int, count: int) -> None:
        """WAIT for ``count`` remote signals (words another tile sent have landed)."""
        if semaphore in ENGINE_SEMAPHORES.values():
            raise ValueError(f"semaphore {semaphore} is an engine's completion semaphore")
        if count:
            self.ops.append((Opcode.WAIT, {"semaphore": semaphore, "count": count}))

    def halt(self) -> list[Op]:
        """WAIT for every signal still outstanding (the next program starts from zero),
        HALT; the program."""
        for pending in self.signalled:
            if pending:
                self._wait_for(pending[-1])
        self.ops.append((Opcode.HALT, {}))
        return self.ops


class MemoryFull(ValueError):
    """A region does not fit its memory: ``memory`` ("scratchpad" or "accumulator
    memory") and ``per_tile`` (False when what overflows are regions every tile holds,
    so more tiles would not help)."""

    def __init__(self, message: str, memory: str, per_tile: bool):
        super().__init__(message)
        self.memory, self.per_tile = memory, per_tile


class Regions:
    """Regions of one memory, first fit over ``free`` ranges ``[lo, hi)``.

    A region may be made to start in a given ``bank`` of ``banks`` (word ``w`` in bank
    ``w % banks``): a GEMM's two operand streams, each asking for the next word every
    cycle, then ask different banks in the same cycle instead of taking turns at one.
    ``owner`` names whose memory it is in a :class:`MemoryFull` message (``per_tile``
    says whether it is one tile's).
    """

    def __init__(self, free: list[tuple[int, int]], memory: str, owner: str, *,
                 banks: int = 1, per_tile: bool = True):
        self.free = [(lo, hi) for lo, hi in free if hi > lo]
        self.capacity = sum(hi - lo for lo, hi in self.free)
        self.memory, self.owner, self.banks, self.per_tile = memory, owner, banks, per_tile
        self.uses: list[tuple[str, int]] = []
        self.used = 0  # words or entries taken, bank padding included
        # Past the highest region taken: the first range's start while none is (an empty
        # range included: a region then fits nowhere, but the end is still its start).
        self.end = min((lo for lo, _ in free), default=0)

    def take(self, size: int, what: str, bank: int | None = None) -> int:
        """The base of a new region of ``size`` for ``what``."""
        self.uses.append((what, size))
        for i, (lo, hi) in enumerate(self.free):
            pad = 0 if bank is None else (bank - lo) % self.banks
            if hi - lo >= size + pad:
                self.free[i] = (lo + pad + size, hi)
                self.used += size + pad
                self.end = max(self.end, lo + pad + size)
                return lo + pad
        largest = Counter()
        for name, words in self.uses:
            largest[name] += words
        detail = ", ".join(f"{k} {v}" for k, v in largest.most_common(3))
        raise MemoryFull(f"{self.owner}: {self.memory} full: {what} needs {size} more; "
                         f"{self.used} of {self.capacity} taken (largest uses: {detail})",
                         self.memory, self.per_tile)
