"""Bit flips in the chip's scratchpads during a layer run (``serrano sim --inject-faults``).

Each tile's scratchpad stores every word with its SECDED check bits (:mod:`golden.ecc`):
a single flipped bit is corrected on every read, two are detected. A fault-injection
build of the chip (:func:`sim.chip_run.chip_from_config` with ``fault_injection``) lets
the host write a word with chosen codeword bits flipped; :class:`FaultInjector` uses that
to put faults into stored words and to count what the chip made of them.

Where and when. Before each round starts (after the host has loaded it, before ``go``)
every tile's *targets* are listed: the scratchpad words the round's program reads and no
instruction of the round writes (:func:`round_targets`: the tile's own GEMM, VEC and DMA
reads minus its own writes and the words other tiles' DMAs send it). Static programs
say that in their instructions; a program whose work follows the data (the sparse MoE
layer) by the operations it dispatched when the chip's functional model ran the round
(``compiler.chip.TileLoad.dispatched``). Either way every target is read after the fault
lands and holds it until then: each injected fault is one the chip reads back. Those are
the weights, queries and constants the host wrote for the round and the KV pages
appended in this and earlier rounds. Each target independently gets a single-bit fault
with probability ``single`` and otherwise a double-bit fault with probability ``double``
(:class:`FaultPlan`); a word is chosen at most once a round, so it never holds two
faults unless a double was meant.

How. The host reads the chosen words (their stored data; a word that reads back
corrected or uncorrectable already would be refused) and writes each back with its flip
mask: the stored codeword is then the good one with one or two bits inverted, a word at
rest in the SRAM hit by a particle. The log keeps (round, tile, address, bits, cycle).
After the round, each tile's ECC counters (``rtl.chip.EccCounters``) must show at least
one corrected read per single fault in its words and one uncorrectable read per double
(the counters count reads, not words: that each fault is read rests on the programs'
static reads, and the read-back below finds each still in place). An uncorrectable read
stops the run with a named error, never a wrong output passed on, and the tile's
doubles count as *detected*. A finished round's faulty words are read once more (they
must still hold their fault: nothing wrote them) and written back clean, a scrubber's
work, so the next round starts from good words; its single faults count as *corrected*
(the caller has checked its outputs bit-exact first). Whatever does not add up stops the
run with its reason (:meth:`FaultInjector.check_round`), the faults of that round
counted as neither.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import numpy as np

from compiler.hazards import accesses, load_ops, round_writes
from golden.ecc import Secded
from spec.isa import Opcode

__all__ = ["FaultInjector", "FaultPlan", "round_targets"]


@dataclass(frozen=True)
class FaultPlan:
    """Per round and per target word: the probability of a single-bit fault (``single``)
    and of a double-bit one (``double``); ``seed`` seeds the choice of words and bits."""

    single: float
    double: float = 0.0
    seed: int = 1

    def __post_init__(self) -> None:
        for name in ("single", "double"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not 0.0 <= value <= 1.0:
                raise ValueError(f"the {name}-bit fault rate must be a number in 0..1, "
                                 f"not {value!r}")
        if self.single + self.double > 1.0:
            raise ValueError(f"the single- and double-bit fault rates add up to more than 1 "
                             f"({self.single} + {self.double})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"the fault seed must be a non-negative integer, not {self.seed!r}")

    @classmethod
    def parse(cls, text: str, seed: int = 1) -> FaultPlan:
        """``RATE`` or ``RATE,double=RATE`` (each a number in 0..1)."""
        match = re.fullmatch(r"\s*([^,=\s]+)\s*(?:,\s*double\s*=\s*([^,=\s]+)\s*)?", text)
        if not match:
            raise ValueError(f"expected RATE or RATE,double=RATE, not {text!r}")
        try:
            single, double = float(match[1]), float(match[2] or 0.0)
        except ValueError:
            raise ValueError(f"fault rates must be numbers, not {text!r}") from None
        return cls(single, double, seed)

    def to_json(self) -> dict:
        return asdict(self)


def round_targets(loads: dict, k: int, n: int) -> dict[int, list[int]]:
    """Per tile of a round (``loads``: tile -> ``compiler.chip.TileLoad``): the scratchpad
    words its program reads and nothing in the round writes
    (``compiler.hazards.round_writes``), ascending."""
    reads: dict[int, set[int]] = {t: set() for t in loads}
    for tile, load in loads.items():
        for op, fields, dynamic in load_ops(load):
            if op not in (Opcode.GEMM, Opcode.VEC, Opcode.DMA):
                continue
            if dynamic:  # an attention loop's GEMM (a page from the page table, read
                continue  # at run time): its reads are not targets (round_writes checks)
            reads[tile] |= {a for a in accesses(op, fields, n)[0] if a < 1 << 20}
    writes = round_writes(loads, k, n)
    return {t: sorted(reads[t] - writes[t]) for t in loads}


@dataclass
class _Fault:
    round: int
    tile: int
    address: int
    bits: tuple[int, ...]
    cycle: int
    data: int  # the word's stored data, for the check after the round


class FaultInjector:
    """Injects the faults of a :class:`FaultPlan` into a chip run and keeps the account
    (see the module docstring). ``n``: the tiles' array size (words of ``8 n`` bits)."""

    def __init__(self, plan: FaultPlan, k: int, n: int):
        self.plan, self.k, self.n = plan, k, n
        self.code = Secded(8 * n)
        self.rng = np.random.default_rng(plan.seed)
        self.log: list[_Fault] = []
        self.pending: list[_Fault] = []  # this round's faults
        self.tiles: dict[int, dict[str, int]] = {}
        self.survived = 0
        self.stopped: str | None = None
        self._before: dict[int, tuple[int, int]] = {}

    def choose(self, loads: dict) -> list[tuple[int, int, tuple[int, ...]]]:
        """The round's faults: (tile, address, flipped codeword bits)."""
        chosen = []
        for tile, words in sorted(round_targets(loads, self.k, self.n).items()):
            draw = self.rng.random(len(words))
            for address, u in zip(words, draw, strict=True):
                if u < self.plan.single:
                    count = 1
                elif u < self.plan.single + self.plan.double:
                    count = 2
                else:
                    continue
                bits = self.rng.choice(self.code.code_bits, count, replace=False)
                chosen.append((tile, address, tuple(sorted(int(b) for b in bits))))
        return chosen

    async def inject(self, driver, index: int, loads: dict) -> None:
        """Before round ``index`` starts: read the chosen words, write them back flipped,
        and note each tile's ECC counters."""
        chosen = self.choose(loads)
        if chosen:
            stored = await driver.host([{"tile": t, "addr": a, "write": 0, "data": 0}
                                        for t, a, _ in chosen])
            for (tile, address, _), response in zip(chosen, stored, strict=True):
                if response.status.corrected or response.status.uncorrectable \
                        or response.status.bad_address:
                    raise AssertionError(f"round {index}: tile {tile} word {address} is not "
                                         "a good stored word before its fault")
            await driver.host_clean([
                {"tile": t, "addr": a, "write": 1, "data": int(r.data),
                 "flip": sum(1 << b for b in bits)}
                for (t, a, bits), r in zip(chosen, stored, strict=True)])
            cycle = driver.cycle()
            self.pending = [_Fault(index, t, a, bits, cycle, int(r.data))
                            for (t, a, bits), r in zip(chosen, stored, strict=True)]
            self.log += self.pending
        else:
            self.pending = []
        self._before = driver.ecc_counters()

    def check_round(self, driver, index: int) -> str | None:
        """After round ``index`` halted: the ECC counters against the faults. Returns
        why the run stops here, if it does: a tile read a double-bit fault (the named
        uncorrectable-ECC error; its doubles count as detected), or the counters do not
        account for the round's faults (its faults count as neither corrected nor
        detected)."""
        after = driver.ecc_counters()
        detected, problems = [], []
        for tile, (corrected, uncorrectable) in after.items():
            was = self._before[tile]
            reads = corrected - was[0], uncorrectable - was[1]
            faults = [f for f in self.pending if f.tile == tile]
            single = sum(len(f.bits) == 1 for f in faults)
            double = len(faults) - single
            entry = self.tiles.setdefault(tile, {"single": 0, "double": 0, "corrected": 0,
                                                 "detected": 0, "corrected_reads": 0,
                                                 "uncorrectable_reads": 0})
            entry["single"] += single
            entry["double"] += double
            entry["corrected_reads"] += reads[0]
            entry["uncorrectable_reads"] += reads[1]
            where = f"tile {tile}"
            if max(after[tile]) == (1 << 16) - 1:
                problems.append(f"{where}'s ECC counters saturated (use a lower fault rate)")
            if reads[0] < single:
                problems.append(f"{where} holds {single} single-bit faults in words its "
                                f"program reads, but its scratchpad corrected {reads[0]} reads")
            if reads[1] < double:
                problems.append(f"{where} holds {double} double-bit faults in words its "
                                f"program reads, but its scratchpad flagged {reads[1]} reads")
            elif double:
                entry["detected"] += double
                detected.append(f"{where} ({double} double-bit fault{'s' * (double > 1)}, "
                                f"{reads[1]} uncorrectable reads)")
            if reads[1] and not double:
                problems.append(f"{where} flagged {reads[1]} uncorrectable reads with no "
                                "double-bit fault injected")
        if problems:
            return self.stop(f"round {index}: the ECC counters do not account for the "
                             f"faults: {'; '.join(problems)}")
        if detected:
            return self.stop(f"uncorrectable ECC error in round {index}: "
                             + ", ".join(detected) + "; the run stops before using the "
                             "round's outputs")
        return None

    def stop(self, reason: str) -> str:
        """The run stops here for ``reason`` (the report's ``stopped``)."""
        self.stopped = reason
        return reason

    async def scrub(self, driver, index: int) -> str | None:
        """After round ``index``'s outputs matched golden: every faulty word must still
        hold its fault (read back corrected, its data intact; else the run stops, the
        reason returned); then it is written clean and its fault counts as corrected."""
        if not self.pending:
            return None
        got = await driver.host([{"tile": f.tile, "addr": f.address, "write": 0, "data": 0}
                                 for f in self.pending])
        for fault, response in zip(self.pending, got, strict=True):
            if not response.status.corrected or int(response.data) != fault.data:
                return self.stop(f"round {index}: tile {fault.tile} word {fault.address} "
                                 f"lost its fault (bits {fault.bits}) during the round")
        await driver.host_clean([{"tile": f.tile, "addr": f.address, "write": 1,
                                  "data": f.data} for f in self.pending])
        for fault in self.pending:
            self.tiles[fault.tile]["corrected"] += 1
        self.survived += len(self.pending)
        self.pending = []
        return None

    def summary(self) -> dict:
        """The JSON record: plan, totals, per-tile counts and the log."""
        single = sum(len(f.bits) == 1 for f in self.log)
        return {
            "plan": self.plan.to_json(),
            "single_injected": single,
            "single_survived": self.survived,
            "double_injected": len(self.log) - single,
            "double_detected": sum(t["detected"] for t in self.tiles.values()),
            "stopped": self.stopped,
            "tiles": {str(t): v for t, v in sorted(self.tiles.items())},
            "log": [{"round": f.round, "tile": f.tile, "address": f.address,
                     "bits": list(f.bits), "cycle": f.cycle} for f in self.log],
        }
