"""Check that a program synchronises its engines as the ISA requires.

The sequencer dispatches GEMM, VEC and DMA to their engines in program order without
waiting; each engine runs its own operations in order, one after the other, but the
engines run concurrently. So whenever two operations of different engines touch the same
scratchpad word or accumulator entry and one of them writes it, the earlier one must be
known to have finished before the later one is dispatched: a WAIT between them must
consume a signal of the earlier one (or of a later operation of its engine, or of
something that itself waited for it). The functional model runs instructions one at a
time and cannot see a missing WAIT; :func:`check_synchronisation` can.

Rules checked (ValueError naming both instructions otherwise): every cross-engine
read-after-write, write-after-read and write-after-write pair is ordered as above; every
semaphore is signalled by one engine (so its k-th WAIT unit means that engine's k-th
signalling operation finished); no WAIT needs a signal that is never dispatched before
it (a deadlock); at HALT every signal has been waited for (the next program starts from
zero).

The check reads a straight-line program. A program with registers (SET, ADD, LOOP, SKIP,
WITH) is checked on what it runs: the instructions the tile model executed, with their
fields as WITH made them (``golden.tile_model.TileModel.executed``, :func:`executed_ops`).
An IDMA is refused: its rows depend on the index table's contents.
"""

from __future__ import annotations

from collections.abc import Sequence

from compiler.program import Op
from golden.tile_model import operands_used
from golden.vector_model import VectorOpcode as VOP
from spec.config import ceil_div
from spec.isa import MASK_COLUMNS, DmaTarget, Opcode, VecDst, decode

__all__ = ["accesses", "check_synchronisation", "executed_ops", "load_ops",
           "round_writes"]

_ENGINES = (Opcode.GEMM, Opcode.VEC, Opcode.DMA)
_REGISTER_OPCODES = (Opcode.SET, Opcode.ADD, Opcode.LOOP, Opcode.SKIP, Opcode.WITH)
#: Accumulator entries are keyed apart from scratchpad words.
_ACC = 1 << 20


#: Vector opcodes by value (an Amaranth enum's call costs microseconds; this runs per VEC).
_VOPS = {int(code): code for code in VOP}


def accesses(op: Opcode, f: dict, n: int) -> tuple[set[int], set[int]]:
    """(reads, writes) of one engine operation: scratchpad word addresses, and
    accumulator entries offset by 2**20."""
    reads: set[int] = set()
    writes: set[int] = set()
    if op == Opcode.GEMM:
        m, k, p = f["m"], f["k"], f["p"]
        a_words = ceil_div(k, n) * m if f.get("a_rows") else ceil_div(m, n) * k
        b_words = (ceil_div(k, n) * p if f.get("b_rows")
                   else (k - 1) * f["b_stride"] + ceil_div(p, n) if f.get("b_stride")
                   else ceil_div(p, n) * k)
        reads |= set(range(f["a"], f["a"] + a_words)) | set(range(f["b"], f["b"] + b_words))
        if f.get("a_limbs"):
            reads |= set(range(f["a_lo"], f["a_lo"] + a_words))
        c = range(_ACC + f["c"], _ACC + f["c"] + ceil_div(m, n) * ceil_div(p, n) * n)
        writes |= set(c)
        if f.get("accumulate"):
            reads |= set(c)
    elif op == Opcode.VEC:
        code = _VOPS.get(f["op"])
        if code is None:
            raise ValueError(f"VEC op {f['op']} is not a vector opcode")
        rows, beats = f["rows"], f["beats"]
        tile, scalar = ceil_div(rows, n) * beats * n, ceil_div(rows, n)

        def region(base: int, is_scalar: int) -> set[int]:
            return set(range(_ACC + base, _ACC + base + (scalar if is_scalar else tile)))

        uses = operands_used(f)
        if uses["a"]:
            reads |= region(f["a"], f.get("a_scalar", 0))
        if uses["b"]:
            reads |= region(f["b"], f.get("b_scalar", 0))
        if uses["c"]:
            reads |= region(f["c"], 1)
        kind = VecDst(f.get("dst_kind", 0))  # an int (encoded fields) or the enum
        if kind == VecDst.TILE:
            writes |= region(f["dst"], 0)
        elif kind == VecDst.SCALAR:
            writes |= region(f["dst"], 1)
        elif kind == VecDst.SPAD:
            stride = f.get("dst_stride", 0)
            writes |= ({f["dst"] + r * stride + j for r in range(rows) for j in range(beats)}
                       if stride else set(range(f["dst"], f["dst"] + rows * beats)))
        if f.get("total_write"):
            writes |= region(f["total"], 1)
    elif op == Opcode.DMA:  # a memory STORE only reads here, a LOAD only writes here
        target = dma_target(f)
        if target != DmaTarget.LOAD.value:
            reads |= set(range(f["src"], f["src"] + f["length"]))
        if target != DmaTarget.STORE.value:
            writes |= set(range(f["dst"], f["dst"] + f["length"]))
    return reads, writes


def dma_target(f: dict) -> int:
    """A DMA's ``target`` as a number (decoded fields hold it as one, the functional
    model's as a ``DmaTarget``; TILES when absent)."""
    target = f.get("target", DmaTarget.TILES)
    return target.value if isinstance(target, DmaTarget) else int(target)


def load_ops(load) -> list[tuple[Opcode, dict, bool]]:
    """A tile's operations in a round (``load``: a ``compiler.chip.TileLoad``): those it
    dispatched at run time when known (``load.dispatched``), else its instructions
    decoded; each with whether its fields come from registers (it follows a WITH)."""
    ops = load.dispatched
    if ops is None:
        ops = [decode(word) for word in load.instructions]
    out, after_with = [], False
    for op, fields in ops:
        out.append((op, fields, after_with))
        after_with = op == Opcode.WITH
    return out


def round_writes(loads: dict, k: int, n: int) -> dict[int, set[int]]:
    """Per tile of a k x k chip, the scratchpad words a round's programs write (``loads``:
    tile -> ``compiler.chip.TileLoad``): its VEC and memory-LOAD destinations and every
    tile DMA's destination on each tile of its mask (the sender's included when its own
    bit is set), from the operations each program dispatched at run time
    (``TileLoad.dispatched``: registers added, an IDMA's rows as DMAs) or, without
    them, from its instructions. A GEMM with fields from registers (an attention loop's
    page, read at run time) writes accumulator entries only; any other operation whose
    fields come from registers, and an IDMA, need the dispatched operations
    (ValueError)."""
    writes: dict[int, set[int]] = {t: set() for t in loads}
    for tile, load in loads.items():
        for op, fields, dynamic in load_ops(load):
            if op == Opcode.IDMA:
                raise ValueError(f"tile {tile}: an IDMA's rows come from its index table; "
                                 "its writes need the operations it dispatched")
            if op not in _ENGINES or op == Opcode.GEMM:  # a GEMM writes the accumulator
                continue
            if dynamic:
                raise ValueError(f"tile {tile}: a {op.name} with fields from registers "
                                 "needs the operations it dispatched")
            put = {a for a in accesses(op, fields, n)[1] if a < _ACC}
            if op == Opcode.DMA and dma_target(fields) == DmaTarget.TILES.value:
                mask = fields["tiles"]
                for bit in range(mask.bit_length()):
                    x, y = bit % MASK_COLUMNS, bit // MASK_COLUMNS
                    if mask >> bit & 1 and x < k and y < k:  # (the chip refuses others)
                        writes.setdefault(y * k + x, set()).update(put)
            else:
                writes[tile] |= put
    return writes


def check_synchronisation(ops: Sequence[Op], n: int) -> None:
    """Raise ValueError unless ``ops`` ((Opcode, fields), e.g. ``TileProgram.ops`` or
    decoded words) synchronise as the module docstring says."""
    engines = {e: i for i, e in enumerate(_ENGINES)}
    # known[e]: the highest index of an engine-e operation known finished at this point.
    known = [-1] * len(_ENGINES)
    dispatched_with: dict[int, list[int]] = {}  # op index -> `known` when it was dispatched
    signallers: dict[int, list[int]] = {}  # semaphore -> op indices that signal it, in order
    signal_engine: dict[int, int] = {}
    consumed: dict[int, int] = {}
    last_write: dict[int, int] = {}  # address -> op index
    readers: dict[int, dict[int, int]] = {}  # address -> engine -> latest reader since write
    engine_of: dict[int, int] = {}

    def finished(j: int, i: int) -> bool:
        """Is op i known finished when op j (another engine) is dispatched?"""
        return known[engine_of[i]] >= i

    def need(j: int, i: int, what: str, address: int) -> None:
        if engine_of[i] != engine_of[j] and not finished(j, i):
            where = (f"accumulator entry {address - _ACC}" if address >= _ACC
                     else f"scratchpad word {address}")
            raise ValueError(f"{what} on {where}: instruction {j} ({ops[j][0].name}) may run "
                             f"while instruction {i} ({ops[i][0].name}) has not finished; "
                             f"no WAIT orders them")

    for j, (op, f) in enumerate(ops):
        if op in engines:
            e = engines[op]
            engine_of[j] = e
            reads, writes = accesses(op, f, n)
            for address in reads:
                if address in last_write:
                    need(j, last_write[address], "read after write", address)
            for address in writes:
                if address in last_write:
                    need(j, last_write[address], "write after write", address)
                for reader in readers.get(address, {}).values():
                    need(j, reader, "write after read", address)
            for address in reads:
                readers.setdefault(address, {})[e] = j
            for address in writes:
                last_write[address] = j
                readers.pop(address, None)
            dispatched_with[j] = list(known)
            signal = f.get("signal") or {}
            if signal.get("enable"):
                sem = signal["semaphore"]
                if signal_engine.setdefault(sem, e) != e:
                    raise ValueError(f"semaphore {sem} is signalled by two engines "
                                     f"(instruction {j}); its WAITs would be ambiguous")
                signallers.setdefault(sem, []).append(j)
        elif op == Opcode.WAIT:
            sem, count = f["semaphore"], f["count"]
            done = consumed.get(sem, 0) + count
            available = signallers.get(sem, [])
            if done > len(available):
                raise ValueError(f"instruction {j}: WAIT semaphore {sem} needs signal "
                                 f"{done} but only {len(available)} are dispatched before "
                                 f"it: the program deadlocks")
            consumed[sem] = done
            if count:
                s = available[done - 1]
                known = [max(a, b) for a, b in zip(known, dispatched_with[s], strict=True)]
                known[engine_of[s]] = max(known[engine_of[s]], s)
        elif op == Opcode.SIGNAL:
            raise ValueError(f"instruction {j}: SIGNAL is not modelled by this checker")
        elif op == Opcode.LOAD:  # the sequencer reads the word or entry as it executes
            engine_of[j] = -1
            address = f["addr"] + (_ACC if f.get("acc") else 0)
            if address in last_write:
                need(j, last_write[address], "LOAD after write", address)
        elif op == Opcode.IDMA:
            raise ValueError(f"instruction {j}: IDMA's rows come from its index table, "
                             f"which this checker does not read")
        elif op in _REGISTER_OPCODES:
            raise ValueError(f"instruction {j}: {op.name} makes the program's path depend "
                             f"on its registers; check the instructions it executed "
                             f"(executed_ops)")
        elif op == Opcode.HALT:
            break
    for sem, sigs in signallers.items():
        if consumed.get(sem, 0) != len(sigs):
            raise ValueError(f"semaphore {sem}: {len(sigs)} signals but "
                             f"{consumed.get(sem, 0)} waited for at HALT")


def executed_ops(executed: Sequence[tuple[str, dict]]) -> list[Op]:
    """The engine operations, WAITs and SIGNALs of a tile model's ``executed`` list, as
    the straight-line program :func:`check_synchronisation` reads (the register
    instructions dropped: their effect is in the fields)."""
    return [(Opcode[name], f) for name, f in executed
            if Opcode[name] not in _REGISTER_OPCODES]
