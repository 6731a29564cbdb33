"""The accumulator memory: wide entries (N signed 48-bit lanes) where GEMM results land
and vector instructions read and write their operands (see docs/isa.md)."""

from __future__ import annotations

from amaranth import Cat, Module, Signal, signed
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from spec.numerics import NUMERICS
from spec.params import check_array_size

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
    """``depth`` entries of N lanes in ``banks`` banks, several read ports, several
    prioritised writers.

    Entry ``e`` lives in bank ``e % banks``. Per read port ``r``: ``r_addr`` and
    ``r_en`` (in, 1 unless driven) and ``r_data`` (out), the entry addressed in the
    last cycle ``r_en`` was high (a synchronous read that does not see a write of the
    same cycle; with ``r_en`` low the port reads nothing and keeps its data). Per
    writer ``w``: ``w`` (stream in of :class:`AccWrite`). Each bank takes one write per
    cycle, the writer named first winning it, so a later writer of the same bank waits
    (``ready`` low) and nothing is dropped; writers of different banks write in the
    same cycle (the tile's GEMM engine and vector engine both write rows of consecutive
    entries, so with two banks they mostly pass each other instead of taking turns).
    Each read port is one copy of every bank (block RAM on an FPGA).
    """

    def __init__(self, n: int = 8, depth: int = 256, read_ports=("r",), writers=("w",),
                 banks: int = 1):
        check_array_size("accumulator lane count", n, power_of_two=False)
        if not isinstance(depth, int) or depth < 2 or depth & (depth - 1) or depth > 1024:
            raise ValueError(f"accumulator depth must be a power of two, 2..1024, not {depth!r}")
        if not isinstance(banks, int) or banks < 1 or banks & (banks - 1) or banks > depth // 2:
            raise ValueError(f"accumulator banks must be a power of two, 1..{depth // 2} "
                             f"(depth {depth}), not {banks!r}")
        for kind, names in (("read port", read_ports), ("writer", writers)):
            if isinstance(names, str) or not names or len(set(names)) != len(names) \
                    or not all(isinstance(name, str) and name.isidentifier() for name in names):
                raise ValueError(f"accumulator {kind} names must be a sequence of unique "
                                 f"identifiers, not {names!r}")
        port_members = [f"{name}_{end}" for name in read_ports for end in ("addr", "en", "data")]
        if clash := sorted(set(port_members) & set(writers)):
            raise ValueError(f"accumulator writer names {clash} clash with the read ports' "
                             f"members {port_members}")
        self.n, self.depth, self.banks = n, depth, banks
        self.read_ports, self.writers = tuple(read_ports), tuple(writers)
        members = {}
        for name in self.read_ports:
            members[f"{name}_addr"] = In(range(depth))
            members[f"{name}_en"] = In(1, init=1)
            members[f"{name}_data"] = Out(Entry(n))
        for name in self.writers:
            members[name] = In(stream.Signature(AccWrite(n, depth)))
        super().__init__(members)

    @property
    def addr_bits(self) -> int:
        return ceil_log2(self.depth)

    def elaborate(self, platform):
        m = Module()
        n, banks = self.n, self.banks
        bank_bits = ceil_log2(banks)
        writers = [getattr(self, name) for name in self.writers]

        def same_bank(a, b):
            return a.payload.addr[:bank_bits] == b.payload.addr[:bank_bits] if banks > 1 else 1

        # A writer is ready unless a writer named before it writes the same bank.
        for i, port in enumerate(writers):
            blocked = [other.valid & same_bank(other, port) for other in writers[:i]]
            m.d.comb += port.ready.eq(~Cat(*blocked).any() if blocked else 1)

        # Each bank's write of this cycle: its first writer.
        writes = []
        for b in range(banks):
            addr = Signal(range(self.depth // banks), name=f"b{b}_addr")
            value = Signal(Entry(n), name=f"b{b}_value")
            lanes = Signal(n, name=f"b{b}_lanes")
            for port in reversed(writers):  # the last assignment wins: the first writer
                in_bank = port.payload.addr[:bank_bits] == b if banks > 1 else 1
                with m.If(port.valid & in_bank):
                    m.d.comb += [addr.eq(port.payload.addr[bank_bits:]),
                                 value.eq(port.payload.data), lanes.eq(port.payload.lanes)]
            writes.append((addr, value, lanes))

        for name in self.read_ports:
            r_addr, r_data = getattr(self, f"{name}_addr"), getattr(self, f"{name}_data")
            r_en = getattr(self, f"{name}_en")
            datas = []
            for b, (addr, value, lanes) in enumerate(writes):
                mem = memory.Memory(shape=Entry(n), depth=self.depth // banks, init=[])
                m.submodules[f"{name}_mem{b}" if banks > 1 else f"{name}_mem"] = mem
                write = mem.write_port(granularity=1)  # one enable per lane
                m.d.comb += [write.addr.eq(addr), write.data.eq(value), write.en.eq(lanes)]
                read = mem.read_port()
                m.d.comb += [read.addr.eq(r_addr[bank_bits:]), read.en.eq(r_en)]
                datas.append(read.data)
            if banks == 1:
                m.d.comb += r_data.eq(datas[0])
            else:  # the bank of the entry addressed last cycle
                bank = Signal(bank_bits, name=f"{name}_bank")
                with m.If(r_en):
                    m.d.sync += bank.eq(r_addr[:bank_bits])
                with m.Switch(bank):
                    for b, data in enumerate(datas):
                        with m.Case(b):
                            m.d.comb += r_data.eq(data)
        return m
