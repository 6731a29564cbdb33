"""Clock gating for simulation speed (never for synthesis).

Verilator evaluates a clock domain's logic only on that domain's edges, so a block whose
clock stops while it is idle costs nothing in those cycles. :func:`add_gated` adds a
block on its own clock that ticks only in cycles the block can change in: ``wake`` (a
signal computed from the block's state and the inputs that start it) is sampled on the
falling edge, as a latch-based clock gate does, so the block's clock is the parent's
clock in every cycle that needs it and the block behaves cycle for cycle as without the
gate. ``linger`` keeps the clock running that many cycles after ``wake`` falls, for
registers that settle a little later than the block's own idle indication.

The caller guarantees that an idle block is a fixed point: with ``wake`` low (and
``linger`` cycles after), no register would change on an edge. Each use is checked by a
test that runs the gated and the ungated block side by side on random traffic.
"""

from __future__ import annotations

from amaranth import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.hdl import DomainRenamer, Elaboratable, Value

__all__ = ["add_gated"]


def add_gated(m: Module, name: str, block: Elaboratable, wake: Value, *,
              linger: int = 0) -> None:
    """Add ``block`` to ``m`` as submodule ``name``, its ``sync`` domain clocked by the
    parent's clock only in cycles where ``wake`` (or reset) was high at the falling edge
    before, or in the ``linger`` cycles after it was last high."""
    if not isinstance(linger, int) or linger < 0:
        raise ValueError(f"linger must be a non-negative integer, not {linger!r}")
    domain, gate = f"{name}_gated", f"{name}_gate"
    m.domains += [ClockDomain(domain, local=True),
                  ClockDomain(gate, clk_edge="neg", reset_less=True, local=True)]
    recent = Signal(linger + 1, init=1, name=f"{name}_wake_history")
    m.d[gate] += recent.eq((recent << 1) | wake | ResetSignal())
    enable = recent.any()
    m.d.comb += [ClockSignal(gate).eq(ClockSignal()),
                 ClockSignal(domain).eq(ClockSignal() & enable),
                 ResetSignal(domain).eq(ResetSignal())]
    m.submodules[name] = DomainRenamer(domain)(block)
