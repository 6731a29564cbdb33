"""The accumulator memory: wide entries (N signed 48-bit lanes) where GEMM results land
and vector instructions read and write their operands (see docs/isa.md)."""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from golden.numerics import NUMERICS

__all__ = ["LANE_BITS", "AccWrite", "AccumulatorMemory", "Entry"]

#: Width of an accumulator lane: the vector unit's lane width.
LANE_BITS = NUMERICS.attn_acc_bits


def Entry(n: int) -> data.ArrayLayout:  # noqa: N802 - a layout constructor
    """One accumulator entry: N signed lanes."""
    return data.ArrayLayout(signed(LANE_BITS), n)


class AccWrite(data.StructLayout):
    """Write the enabled ``lanes`` (bit i = lane i) of entry ``addr``."""

    def __init__(self, n: int, depth: int):
        super().__init__({"addr": range(depth), "data": Entry(n), "lanes": n})


class AccumulatorMemory(wiring.Component):
    """``depth`` entries of N lanes, several read ports, several prioritised writers.

    Per read port ``r``: ``r_addr`` (in) and ``r_data`` (out), the entry addressed in the
    previous cycle (a synchronous read that does not see a write of the same cycle).
    Per writer ``w``: ``w`` (stream in of :class:`AccWrite`); one write per cycle is
    taken, the writer named first winning, so a later writer waits (``ready`` low) and
    nothing is dropped. Each read port is one copy of the memory (block RAM on an FPGA).
    """

    def __init__(self, n: int = 8, depth: int = 256, read_ports=("r",), writers=("w",)):
        if not isinstance(n, int) or not 2 <= n <= 32:
            raise ValueError(f"accumulator lane count must be 2..32, not {n!r}")
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1) or depth > 1024:
            raise ValueError(f"accumulator depth must be a power of two, 2..1024, not {depth!r}")
        for kind, names in (("read port", read_ports), ("writer", writers)):
            if not names or len(set(names)) != len(names) or not all(
                    isinstance(name, str) and name.isidentifier() for name in names):
                raise ValueError(f"accumulator {kind} names must be unique identifiers, "
                                 f"not {names!r}")
        self.n, self.depth = n, depth
        self.read_ports, self.writers = tuple(read_ports), tuple(writers)
        members = {}
        for name in self.read_ports:
            members[f"{name}_addr"] = In(range(depth))
            members[f"{name}_data"] = Out(Entry(n))
        for name in self.writers:
            members[name] = In(stream.Signature(AccWrite(n, depth)))
        super().__init__(members)

    @property
    def addr_bits(self) -> int:
        return ceil_log2(self.depth)

    def elaborate(self, platform):
        m = Module()
        n = self.n
        # The winning write of this cycle, chosen by priority.
        addr = Signal(range(self.depth))
        value = Signal(Entry(n))
        lanes = Signal(n)
        taken = None
        for name in self.writers:
            port = getattr(self, name)
            free = ~taken if taken is not None else 1
            m.d.comb += port.ready.eq(free)
            with m.If(port.valid & free):
                m.d.comb += [addr.eq(port.payload.addr), value.eq(port.payload.data),
                             lanes.eq(port.payload.lanes)]
            taken = port.valid if taken is None else (taken | port.valid)
        for name in self.read_ports:
            mem = memory.Memory(shape=Entry(n), depth=self.depth, init=[])
            m.submodules[f"{name}_mem"] = mem
            write = mem.write_port(granularity=1)  # one enable per lane
            m.d.comb += [write.addr.eq(addr), write.data.eq(value),
                         write.en.eq(lanes & taken.replicate(n))]
            read = mem.read_port()
            m.d.comb += [read.addr.eq(getattr(self, f"{name}_addr")),
                         getattr(self, f"{name}_data").eq(read.data)]
        return m
