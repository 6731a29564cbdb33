"""Clock gating for simulation speed only: a block whose clock does not tick is skipped by
Verilator, so a block idle most of the time costs little.

    gated(m, "unit", unit.active | unit.ops.valid)    # before adding the block
    m.submodules.unit = DomainRenamer("unit")(unit)

The gate follows the block's ``enable`` (the block holds state that can change, or an
input offers something), sampled on the falling edge as a latch-based clock gate does, so
the block sees exactly the rising edges of the cycles that can change it: cycle for cycle
the same as the ungated block, as long as an idle block's registers keep their values
(each user shows this with a test against the ungated block). Never for synthesis: a
gated clock in FPGA fabric is a hazard.
"""

from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Module, ResetSignal, Signal

__all__ = ["gated"]


def gated(m: Module, domain: str, enable) -> None:
    """Add clock domain ``domain`` to ``m``: ``sync``'s clock while ``enable`` (or reset)
    held at the previous falling edge, ``sync``'s reset (asynchronous)."""
    gate = f"{domain}_gate"
    # The block's reset is asynchronous: a synchronous one would be read by the next-state
    # logic of every register, and Verilator evaluates logic that reads a signal of the
    # main clock on every clock edge, gated or not. Reset lasts whole cycles and resets
    # every other block at the next edge, so the block leaves it on the same edge.
    m.domains += [ClockDomain(domain, local=True, async_reset=True),
                  ClockDomain(gate, clk_edge="neg", reset_less=True, local=True)]
    ticks = Signal(init=1, name=f"{domain}_ticks")
    m.d[gate] += ticks.eq(enable | ResetSignal())
    m.d.comb += [ClockSignal(gate).eq(ClockSignal()),
                 ClockSignal(domain).eq(ClockSignal() & ticks),
                 ResetSignal(domain).eq(ResetSignal())]
