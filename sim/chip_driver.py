"""cocotb side of a chip in a StreamHarness: every host action names its tile; the
harness memories carry the beats of all tiles in one run (see sim/tile_driver.py)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from amaranth.lib import data
from cocotb.triggers import ReadOnly, RisingEdge, Timer
from cocotb.utils import get_sim_time

from rtl.chip import MemoryCounters, NetCounters
from rtl.tile import Counters
from sim.harness_driver import CLOCK_NS, HarnessDriver
from sim.tile_driver import POLL, RESPONSES, Execution, Packer, Responses, TileDriver, error_mask

__all__ = ["ChipDriver", "ChipRun"]

#: Cycles after ``go`` by which every started tile shows it has left its halted state.
START_CYCLES = 8


@dataclass
class ChipRun:
    """One run of the chip's programs: per tile what happened, and the wall time;
    ``pcs``, when the run was sampled, per tile the samples that found it at each pc."""

    tiles: dict[int, Execution]
    wall_s: float
    pcs: dict[int, Counter] = field(default_factory=dict)

    @property
    def cycles(self) -> int:
        """Cycles from ``go`` to the last tile's halt (all tiles start together)."""
        return max(e.cycles for e in self.tiles.values())


class ChipDriver(TileDriver):
    """Drives a :class:`sim.harness.StreamHarness` around a :class:`rtl.chip.Chip`."""

    STREAMS_IN = ("program", "host_req", "kv_req", "memory_write")
    STREAMS_OUT = ("host_resp", "kv_resp")

    def __init__(self, dut, chip, depths: dict[str, int]):  # noqa: D107
        # Not TileDriver.__init__: the chip's status is an array of tile statuses.
        self.dut, self.tile, self.chip, self.depths = dut, chip, chip, depths
        self.harness = HarnessDriver(dut)
        sig = chip.signature.members
        self.layouts = {name: sig[name].signature.members["payload"].shape
                        for name in self.STREAMS_IN + self.STREAMS_OUT}
        self.packers = {name: Packer(self.layouts[name]) for name in self.STREAMS_IN}
        self.error_masks = {name: error_mask(self.layouts[name]) for name in RESPONSES}
        self.status_layout = sig["status"].shape
        self.dut.go.value = 0
        self.idle, self.stall, self.seed = 0.0, 0.0, 1
        self.host_cycles = 0  # cycles the harness spent in host transfers (TileDriver's)
        self.program_depth = chip.tile_design.program_depth

    async def load_tiles(self, loads: dict[int, tuple[dict[int, int], dict[int, int],
                                                      list[dict]]]) -> None:
        """Per tile: instruction words {pc: word}, scratchpad words, KV requests; every
        response must be clean (none are read back unless one has an error status). One
        harness run (or more when the beats exceed its memories)."""
        beats: dict[str, list[dict]] = {"program": [], "host_req": [], "kv_req": []}
        for tile, (program, writes, kv_requests) in sorted(loads.items()):
            outside = [pc for pc in program if not 0 <= pc < self.program_depth]
            if outside:
                raise ValueError(f"tile {tile}: instruction address {outside[0]} is outside "
                                 f"the {self.program_depth}-word program memory")
            beats["program"] += [{"tile": tile, "address": pc, "word": w}
                                 for pc, w in sorted(program.items())]
            beats["host_req"] += [{"tile": tile, "addr": a, "write": 1, "data": w}
                                  for a, w in sorted(writes.items())]
            beats["kv_req"] += [{"tile": tile, **r} for r in kv_requests]
        await self._load_clean(beats)

    async def write_memory(self, image: dict[int, dict[int, int]]) -> None:
        """Per memory channel, {address: word} into its store through the chip's
        ``memory_write`` port (the memory image, outside any measured run). ValueError
        for a channel the chip lacks; AssertionError if a channel dropped a word (past
        its store)."""
        missing = sorted(set(image) - set(range(len(self.chip.channels))))
        if missing:
            raise ValueError(f"memory image for channels {missing}: the chip has "
                             f"{len(self.chip.channels)}")
        before = [c["dropped"] for c in self.memory_counters()]
        await self.memory_beats([{"channel": c, "addr": a, "data": w}
                                 for c, words in sorted(image.items())
                                 for a, w in sorted(words.items())])
        await RisingEdge(self.dut.clk)  # the channels count a cycle after the event
        dropped = [c["dropped"] - b for c, b in zip(self.memory_counters(), before,
                                                    strict=True)]
        assert not any(dropped), f"memory image: the channels dropped {dropped} words"

    async def memory_beats(self, beats: list[dict]) -> None:
        """Raw ``memory_write`` beats ({channel, addr, data}), unchecked: a beat for a
        channel the chip lacks reaches the chip (which raises its ``error``)."""
        await self._transfer({"memory_write": beats}, self._budget({"memory_write": beats}),
                             errors_only=True)

    async def host(self, beats: list[dict]) -> Responses:
        """Raw host requests (each names its ``tile``); returns their responses."""
        out = await self._transfer({"host_req": beats}, 64 + 8 * len(beats))
        return out["host_resp"]

    async def host_clean(self, beats: list[dict]) -> Responses:
        """:meth:`host`, every response clean."""
        return (await self._transfer_clean({"host_req": beats}))["host_resp"]

    async def read_tiles(self, addresses: dict[int, list[int]]) -> dict[int, list[int]]:
        """Scratchpad words of several tiles through the host port."""
        order = [(t, a) for t, addrs in sorted(addresses.items()) for a in addrs]
        responses = await self.host([{"tile": t, "addr": a, "write": 0, "data": 0}
                                     for t, a in order])
        bad = responses.errors()
        assert not bad, f"host reads reported errors: {bad[:8]}"
        words: dict[int, list[int]] = {t: [] for t in addresses}
        for (t, _), r in zip(order, responses, strict=True):
            words[t].append(int(r.data))
        return words

    async def run_tiles(self, tiles: list[int], timeout_cycles: int,
                        sample: int = 0) -> ChipRun:
        """Start ``tiles`` together; wait until each has halted. ``sample``: every so
        many cycles, note the pc of each tile still running (``ChipRun.pcs``; the
        status is polled that often instead of every :data:`POLL` cycles)."""
        self.dut.go.value = sum(1 << t for t in tiles)
        await RisingEdge(self.dut.clk)
        self.dut.go.value = 0
        began = time.perf_counter()
        # The halted bits of ``tiles`` in the status vector: one integer test per poll.
        entry = self.status_layout.elem_shape
        halted = sum(1 << (t * entry.size + entry["halted"].offset) for t in tiles)
        step = sample or POLL
        pcs = {t: Counter() for t in tiles} if sample else {}
        pc_mask = (1 << entry["pc"].width) - 1
        fields = [(t, t * entry.size + entry["halted"].offset, t * entry.size + entry["pc"].offset)
                  for t in tiles]
        # Until the tiles show the go (a cycle or two), their halted bits are the last
        # round's: look every cycle until none is set (a program takes longer than that
        # to halt), so that a poll sooner than that does not end the round.
        waited = 0
        while self.dut.status.value.to_unsigned() & halted:
            if waited == START_CYCLES:
                raise AssertionError(f"tiles {tiles} did not start in {START_CYCLES} cycles")
            await RisingEdge(self.dut.clk)
            await ReadOnly()
            waited += 1
        while True:
            # A Timer, not ClockCycles: that would wake Python on every clock edge.
            await Timer(step * CLOCK_NS, unit="ns")
            waited += step
            raw = self.dut.status.value.to_unsigned()
            if sample:
                for t, halt_bit, pc_at in fields:
                    if not raw >> halt_bit & 1:
                        pcs[t][raw >> pc_at & pc_mask] += 1
            if raw & halted == halted:
                break
            if waited >= timeout_cycles:
                status = data.Const(self.status_layout, raw)
                raise AssertionError(
                    f"tiles {[t for t in tiles if not status[t].halted]} did not halt in "
                    f"{timeout_cycles} cycles (pcs {[int(status[t].pc) for t in tiles]})")
        wall = time.perf_counter() - began
        status = data.Const(self.status_layout, raw)
        counters = data.Const(self.dut_layout("counters"), self.dut.counters.value.to_unsigned())
        errors = data.Const(self.dut_layout("engine_error"),
                            self.dut.engine_error.value.to_unsigned())
        runs = {}
        for t in tiles:
            values = {name: int(counters[t][name]) for name, _ in Counters()}
            runs[t] = Execution(values["cycles"], status[t].error, int(status[t].pc), values,
                                wall, int(errors[t]))
        return ChipRun(runs, wall, pcs)

    def dut_layout(self, name: str):
        return self.chip.signature.members[name].shape

    def ecc_counters(self) -> dict[int, tuple[int, int]]:
        """Each tile's ECC counters since reset: (corrected reads, uncorrectable reads)."""
        value = data.Const(self.dut_layout("ecc"), self.dut.ecc.value.to_unsigned())
        return {t: (int(value[t].corrected), int(value[t].uncorrectable))
                for t in range(len(self.chip.tiles))}

    def cycle(self) -> int:
        """The clock cycle now, counted from the start of the simulation."""
        return int(get_sim_time("ns")) // CLOCK_NS

    def memory_counters(self) -> list[dict[str, int]]:
        """Each memory channel's counters (reads, writes, requests, dropped)."""
        value = data.Const(self.dut_layout("memory"), self.dut.memory.value.to_unsigned())
        return [{name: int(value[c][name]) for name, _ in MemoryCounters()}
                for c in range(len(self.chip.channels))]

    def net_counters(self) -> list[dict[str, int]]:
        """Each node's network counters (:class:`rtl.chip.NetCounters`)."""
        value = data.Const(self.dut_layout("net"), self.dut.net.value.to_unsigned())
        return [{name: int(value[t][name]) for name, _ in NetCounters()}
                for t in range(len(self.chip.tiles))]
