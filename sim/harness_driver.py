"""cocotb side of :class:`sim.harness.StreamHarness`: load, run, read back, at VPI speed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, First, RisingEdge, Timer

from sim.runner import select_mutant

CLOCK_NS = 10


@dataclass
class RunStats:
    """What one harness run measured (cycles count from ``start``)."""

    cycles: int  # until `done`
    wall_s: float  # simulator wall time from start to done
    finished: bool  # False when the timeout came first

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.wall_s if self.wall_s > 0 else 0.0


class HarnessDriver:
    """Drives a StreamHarness top: clock, reset, memories, idle/backpressure and a run."""

    def __init__(self, dut):
        self.dut = dut
        select_mutant(dut)
        # The GPI clock toggles in C, without a Python call per edge.
        cocotb.start_soon(Clock(dut.clk, CLOCK_NS, unit="ns", impl="gpi").start())
        dut.start.value = 0
        dut.seed.value = 1
        self._counts: dict[str, int] = {}

    async def reset(self, cycles: int = 2) -> None:
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, cycles)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    def load(self, stream: str, words: list[int]) -> None:
        """Write the payload words of an input stream into its memory; send them all."""
        memory = getattr(self.dut, f"{stream}_mem")
        depth = len(memory)
        if len(words) > depth:
            raise ValueError(f"{len(words)} beats do not fit the {depth}-beat {stream} memory")
        for address, word in enumerate(words):
            memory[address].value = word
        getattr(self.dut, f"{stream}_count").value = len(words)

    def expect(self, stream: str, beats: int) -> None:
        """An output stream is done after ``beats`` beats."""
        getattr(self.dut, f"{stream}_expect").value = beats
        self._counts[stream] = beats

    def flag(self, stream: str, mask: int) -> None:
        """Output ``stream`` counts the beats with any bit of ``mask`` set (:meth:`flagged`)."""
        getattr(self.dut, f"{stream}_flag_mask").value = mask

    def flagged(self, stream: str) -> int:
        """Beats of output ``stream`` in the last run with a bit of its :meth:`flag` mask."""
        return int(getattr(self.dut, f"{stream}_flagged").value)

    def set_idle(self, stream: str, probability: float) -> None:
        """Input ``stream`` withholds a beat with this probability each cycle."""
        getattr(self.dut, f"{stream}_idle").value = _per256(probability)

    def set_backpressure(self, stream: str, probability: float) -> None:
        """Output ``stream`` is not ready with this probability each cycle."""
        getattr(self.dut, f"{stream}_stall").value = _per256(probability)

    async def run(self, *, seed: int, timeout_cycles: int) -> RunStats:
        """Start, wait for ``done`` (or the timeout): one Python wake-up for the whole run.

        ``start`` is held over two rising edges: a write made at a rising edge may reach
        an event-driven simulator (Icarus) before or after the register sampling it, so a
        pulse written high just after one edge and low just before the next could be
        missed; over two edges it is seen once or twice, and a second sample only holds
        the harness at its start a cycle longer (``cycle`` counts from the last)."""
        self.dut.seed.value = seed & 0xFFFF
        self.dut.start.value = 1
        await ClockCycles(self.dut.clk, 2)
        self.dut.start.value = 0
        began = time.perf_counter()
        timeout = Timer(timeout_cycles * CLOCK_NS, unit="ns")
        fired = await First(RisingEdge(self.dut.done), timeout)
        wall = time.perf_counter() - began
        return RunStats(int(self.dut.cycle.value), wall, fired is not timeout)

    async def settle(self, cycles: int) -> None:
        """Let ``cycles`` more cycles pass, so a duplicated or extra beat would be counted."""
        await Timer(cycles * CLOCK_NS, unit="ns")

    def read(self, stream: str, beats: int) -> list[int]:
        memory = getattr(self.dut, f"{stream}_mem")
        return [memory[address].value.to_unsigned() for address in range(beats)]

    def counter(self, name: str) -> int:
        return int(getattr(self.dut, name).value)


#: The largest probability the harness draws (in steps of 1/256, from an 8-bit threshold).
MAX_PROBABILITY = 255 / 256


def _per256(probability: float) -> int:
    if not 0.0 <= probability <= MAX_PROBABILITY:
        raise ValueError(f"probability must be in [0, {MAX_PROBABILITY:.4f}] (steps of "
                         f"1/256), not {probability}")
    return round(probability * 256)
