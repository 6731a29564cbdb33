"""cocotb side of a tile in a StreamHarness: load a program and memory, run, read back.

Every host action is a harness run (memories feed ``program``, ``host_req`` and
``kv_req`` at full simulator speed, with optional random idle cycles and backpressure),
so a 1024-token KV cache loads in a few thousand cycles with one Python wake-up. The
program then runs on ``go``; the driver polls ``status`` every ``POLL`` cycles (with a
Timer, not ``ClockCycles``, which wakes Python on every clock edge: that costs more than
simulating the tile).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass

import cocotb
from amaranth.hdl import Shape
from amaranth.lib import data
from cocotb.triggers import RisingEdge, Timer

from rtl.scratchpad import KvOp
from rtl.sequencer import ErrorCode
from rtl.tile import Counters
from sim.harness_driver import CLOCK_NS, HarnessDriver

#: Cycles between two looks at ``status`` while a program runs.
POLL = 64
#: Response status bits that are errors (``corrected`` is not).
ERROR_STATUS = ("uncorrectable", "bad_address", "bad_request", "kv_full", "unmapped", "bad_page")
#: The output streams that answer host requests, one response per request.
RESPONSES = ("host_resp", "kv_resp")


@dataclass
class Execution:
    """What one program run did: cycles from ``go`` to halted, the status, the counters."""

    cycles: int
    error: ErrorCode
    pc: int
    counters: dict[str, int]
    wall_s: float
    engine_error: int


class Packer:
    """Packs a beat (a dict of field values, nested for a struct field) into the bits of
    a ``data.StructLayout``: what ``layout.const(value)`` gives, without building an
    Amaranth constant per beat (a chip round loads some 10^5 beats: that costs more than
    simulating it). A value that does not fit its field is refused, never truncated."""

    def __init__(self, layout: data.StructLayout):
        self.layout = layout
        self.fields = {}
        for name, field in layout:
            shape = field.shape
            nested = Packer(shape) if isinstance(shape, data.StructLayout) else None
            cast = Shape.cast(shape)
            self.fields[name] = (field.offset, cast.width, cast.signed, nested)

    def __call__(self, value: dict) -> int:
        word = 0
        for name, v in value.items():
            if name not in self.fields:
                raise ValueError(f"{name!r} is not a field of {self.layout!r}")
            offset, width, signed, nested = self.fields[name]
            if isinstance(v, dict):
                if nested is None:
                    raise ValueError(f"field {name!r} is not a struct, got {v!r}")
                v = nested(v)
            elif isinstance(v, enum.Enum):
                v = v.value
            v = int(v)
            low, high = (-(1 << width - 1), 1 << width - 1) if signed else (0, 1 << width)
            if not low <= v < high:
                raise ValueError(f"{v} does not fit field {name!r} ({width} bits"
                                 f"{', signed' if signed else ''})")
            word |= (v & ((1 << width) - 1)) << offset
        return word


def error_mask(layout: data.StructLayout) -> int:
    """The bits of a response word that say an error (:data:`ERROR_STATUS`)."""
    status = layout["status"]
    return sum(1 << status.offset + status.shape[flag].offset for flag in ERROR_STATUS)


class Responses(Sequence):
    """The response words of an output stream, each read as a ``data.Const`` of the
    stream's layout when it is looked at (most are only checked for errors, on the bits)."""

    def __init__(self, layout: data.StructLayout, words: list[int]):
        self.layout, self.words = layout, words
        self._error_mask = error_mask(layout)

    def __len__(self) -> int:
        return len(self.words)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [data.Const(self.layout, word) for word in self.words[index]]
        return data.Const(self.layout, self.words[index])

    def errors(self) -> list[str]:
        """Every error flag set, as ``#index: flag``."""
        return [f"#{index}: {flag}" for index, word in enumerate(self.words)
                if word & self._error_mask for flag in ERROR_STATUS if self[index].status[flag]]


class TileDriver:
    """Drives a :class:`sim.harness.StreamHarness` around a :class:`rtl.tile.Tile`."""

    STREAMS_IN = ("program", "host_req", "kv_req", "net_in")
    STREAMS_OUT = ("host_resp", "kv_resp", "net_out")

    def __init__(self, dut, tile, depths: dict[str, int]):
        self.dut, self.tile, self.depths = dut, tile, depths
        self.harness = HarnessDriver(dut)
        sig = tile.signature.members
        self.layouts = {name: sig[name].signature.members["payload"].shape
                        for name in self.STREAMS_IN + self.STREAMS_OUT}
        self.packers = {name: Packer(self.layouts[name]) for name in self.STREAMS_IN}
        self.error_masks = {name: error_mask(self.layouts[name]) for name in RESPONSES}
        self.status_layout = sig["status"].shape
        self.dut.go.value = 0
        self.idle, self.stall = 0.0, 0.0
        self.seed = 1
        self.host_cycles = 0  # cycles the harness spent in host transfers, since reset
        self._began = time.perf_counter()

    async def reset(self) -> None:
        await self.harness.reset()

    def set_traffic(self, idle: float, stall: float, seed: int) -> None:
        """Random idle cycles on the host's input streams, backpressure on its outputs."""
        self.idle, self.stall, self.seed = idle, stall, seed

    async def _transfer(self, beats: dict[str, list[dict]], timeout_cycles: int, *,
                        errors_only: bool = False) -> dict:
        """Send ``beats`` per input stream and collect every response, in as many harness
        runs as the memories need (each holds ``depth`` beats per stream).
        ``errors_only``: a run's responses are read only if the harness counted one with
        an error status (else none are: the caller only checks for errors)."""
        words: dict[str, list[int]] = {name: [] for name in RESPONSES}
        rounds = max([-(-len(b) // self.depths[name]) for name, b in beats.items()] + [1])
        for r in range(rounds):
            part = {name: b[r * self.depths[name]:(r + 1) * self.depths[name]]
                    for name, b in beats.items()}
            got = await self._transfer_once(part, timeout_cycles, errors_only)
            for name in words:
                words[name] += got[name]
        return {name: Responses(self.layouts[name], w) for name, w in words.items()}

    async def _transfer_once(self, beats: dict[str, list[dict]], timeout_cycles: int,
                             errors_only: bool = False) -> dict:
        """One harness run: the raw response words of each output stream (with
        ``errors_only``, none unless one has an error status)."""
        expect = {"host_resp": len(beats.get("host_req", [])),
                  "kv_resp": len(beats.get("kv_req", [])), "net_out": 0}
        for name in self.STREAMS_IN:
            words = [self.packers[name](b) for b in beats.get(name, [])]
            self.harness.load(name, words)
            self.harness.set_idle(name, self.idle)
        for name in self.STREAMS_OUT:
            self.harness.expect(name, expect[name])
            self.harness.set_backpressure(name, self.stall)
            if name in RESPONSES:
                self.harness.flag(name, self.error_masks[name])
        self.seed += 1
        stats = await self.harness.run(seed=self.seed, timeout_cycles=timeout_cycles)
        assert stats.finished, f"host transfer did not finish in {timeout_cycles} cycles"
        self.host_cycles += stats.cycles
        if errors_only and not any(self.harness.flagged(name) for name in RESPONSES):
            return {name: [] for name in RESPONSES}
        return {name: self.harness.read(name, expect[name]) for name in RESPONSES}

    async def load(self, program: list[int], spad_writes: dict[int, int],
                   kv_requests: list[dict], *, flips: dict[int, int] | None = None) -> None:
        """Program words at pc 0, scratchpad words (``flips``: codeword bits to XOR into
        some of them, a fault-injection test hook), KV requests; every response must be
        clean (the harness counts those with an error status: none are read back unless
        one has)."""
        if len(program) > min(self.tile.program_depth, self.depths["program"]):
            raise ValueError(f"{len(program)} instructions do not fit the "
                             f"{self.tile.program_depth}-word program memory")
        flips = flips or {}
        host = [{"addr": a, "write": 1, "data": w, **({"flip": flips[a]} if a in flips else {})}
                for a, w in sorted(spad_writes.items())]
        beats = {"program": [{"address": i, "word": w} for i, w in enumerate(program)],
                 "host_req": host, "kv_req": kv_requests}
        await self._load_clean(beats)

    async def _load_clean(self, beats: dict[str, list[dict]]) -> None:
        """Send ``beats``; every response must be clean (they are read back only if the
        harness counted one with an error status)."""
        self._assert_clean(await self._transfer(beats, self._budget(beats), errors_only=True))

    async def _transfer_clean(self, beats: dict[str, list[dict]]) -> dict:
        """:meth:`_transfer` with a budget from the beat count; every response clean."""
        out = await self._transfer(beats, self._budget(beats))
        self._assert_clean(out)
        return out

    @staticmethod
    def _budget(beats: dict[str, list[dict]]) -> int:
        return 64 + 8 * sum(len(b) for b in beats.values())

    @staticmethod
    def _assert_clean(responses: dict) -> None:
        for name in RESPONSES:
            bad = responses[name].errors()
            assert not bad, f"{name} reported errors: {bad[:8]}"

    async def kv(self, requests: list[dict]) -> Responses:
        """KV requests alone; returns their responses (errors included, for tests)."""
        out = await self._transfer({"kv_req": requests}, 64 + 8 * len(requests))
        return out["kv_resp"]

    async def execute(self, timeout_cycles: int) -> Execution:
        """Pulse ``go``; wait until the sequencer halts; return what happened."""
        await self.go()
        return await self.wait_halt(timeout_cycles)

    async def go(self) -> None:
        """Pulse ``go`` (the program starts; host transfers may follow while it runs)."""
        self.dut.go.value = 1
        await RisingEdge(self.dut.clk)
        self.dut.go.value = 0
        self._began = time.perf_counter()

    def halted(self) -> bool:
        """Whether the sequencer has halted (``status``, now)."""
        return bool(self._status().halted)

    def _status(self):
        return data.Const(self.status_layout, self.dut.status.value.to_unsigned())

    async def wait_halt(self, timeout_cycles: int) -> Execution:
        """Wait until the sequencer halts (polling every ``POLL`` cycles)."""
        waited = 0
        while True:
            await Timer(POLL * CLOCK_NS, unit="ns")
            waited += POLL
            status = self._status()
            if status.halted:
                break
            assert waited < timeout_cycles, (
                f"the program did not halt in {timeout_cycles} cycles (pc {int(status.pc)})")
        wall = time.perf_counter() - self._began
        counters = data.Const(Counters(), self.dut.counters.value.to_unsigned())
        values = {name: int(counters[name]) for name, _ in Counters()}
        return Execution(values["cycles"], status.error, int(status.pc), values, wall,
                         int(self.dut.engine_error.value))

    async def send(self, words: list[dict]) -> None:
        """Network words into ``net_in`` (as another tile's DMA would send them)."""
        await self._transfer({"net_in": words}, 64 + 8 * len(words))

    async def go_and_receive(self, count: int, timeout_cycles: int = 10_000) -> list:
        """Pulse ``go`` with a harness run already taking ``net_out``, and return the
        first ``count`` words the program sends (a sink takes beats whenever a run has
        started, also past its count, so the run must begin before the words flow)."""
        assert count <= self.depths["net_out"], f"{count} words exceed the net_out memory"
        for name in self.STREAMS_IN:
            self.harness.load(name, [])
        for name in self.STREAMS_OUT:
            self.harness.expect(name, count if name == "net_out" else 0)
            self.harness.set_backpressure(name, self.stall)
        self.seed += 1
        receiving = cocotb.start_soon(self.harness.run(seed=self.seed,
                                                       timeout_cycles=timeout_cycles))
        await RisingEdge(self.dut.clk)  # the run's start is up
        await self.go()
        stats = await receiving
        assert stats.finished, f"{count} network words did not leave in {timeout_cycles} cycles"
        return [data.Const(self.layouts["net_out"], word)
                for word in self.harness.read("net_out", count)]

    def words_sent(self) -> int:
        """Words taken from ``net_out`` since the last :meth:`go_and_receive` started
        (extra ones past its count included)."""
        return self.harness.counter("net_out_received")

    async def read(self, addresses: list[int]) -> tuple[list[int], list]:
        """Scratchpad words at ``addresses`` through the host port (and their responses)."""
        out = await self._transfer(
            {"host_req": [{"addr": a, "write": 0, "data": 0} for a in addresses]},
            64 + 8 * len(addresses))
        responses = out["host_resp"]
        return [int(r.data) for r in responses], responses


def kv_requests(program) -> list[dict]:
    """The MAP and APPEND requests of a compiled program's KV pages."""
    maps = [{"op": KvOp.MAP, "seq": s, "index": i, "phys": p} for s, i, p in program.kv_map]
    appends = [{"op": KvOp.APPEND, "seq": s, "word": w, "data": d, "last": int(last)}
               for s, w, d, last in program.kv_appends]
    return maps + appends
