"""A synthesizable stream harness: memories feed a DUT's streams at full simulator speed.

cocotb costs microseconds per signal access, so driving a stream beat by beat from Python
caps a Verilator run at a few tens of thousands of cycles per second. The harness moves
the stimulus into the design instead: every input stream of the DUT is fed from a memory
preloaded through VPI, every output stream is captured into a memory, and LFSRs insert
random idle cycles and backpressure. Python then waits for one ``done`` edge.

Ports, for each DUT stream ``s`` (names are flattened, e.g. ``a_count``):

- input stream (harness is the source): ``s_count`` beats to send, ``s_idle`` idle
  probability x 256 (0 = never idle), ``s_sent`` beats sent, ``s_first`` cycle of the
  first transfer;
- output stream (harness is the sink): ``s_expect`` beats expected, ``s_stall``
  not-ready probability x 256, ``s_received`` beats received (it keeps counting past
  ``s_expect``, so extra beats are visible), ``s_last`` cycle of the last transfer,
  ``s_flag_mask`` payload bits to watch and ``s_flagged`` beats with any of them set
  (so a host that only needs to know whether any response carries an error status
  reads one counter instead of every response);
- ``start`` (pulse) clears the counters and starts; ``seed`` seeds the LFSRs; ``done``
  rises when every source has sent ``s_count`` and every sink has received ``s_expect``;
  ``cycle`` counts cycles since ``start``;
- every non-stream port of the DUT is passed through under its own name.

The memory of stream ``s`` is the Verilog array ``s_mem`` in the top module, one payload
per word, beat 0 at address 0.

Every input port, ``rst`` included, is registered once on entry, and the harness and the
DUT run in the domain ``core`` (the clock ``clk``, the registered reset): the whole
design sees the testbench one cycle late, and no logic depends combinationally on a
top-level input. Verilator evaluates logic fed by top-level inputs on every ``eval``
(both clock edges), which for a large DUT costs more than the clocked evaluation itself.
"""

from __future__ import annotations

from amaranth import (
    ClockDomain,
    ClockSignal,
    DomainRenamer,
    Module,
    Mux,
    ResetSignal,
    Shape,
    Signal,
    Value,
)
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["StreamHarness", "stream_members"]

COUNTER_BITS = 32


def stream_members(signature: wiring.Signature) -> dict[str, bool]:
    """The DUT's stream ports: name -> True when the DUT consumes it (harness drives)."""
    found = {}
    for name, member in signature.members.items():
        if member.is_signature and isinstance(member.signature, stream.Signature):
            found[name] = member.flow == In
    return found


class _Lfsr:
    """A 16-bit Galois LFSR advanced every cycle; ``chance(p)`` is true ~p/256 of the time."""

    TAPS = 0xB400

    def __init__(self, m: Module, seed, salt: int, name: str):
        self.state = Signal(16, init=1, name=f"{name}_lfsr")
        self.seed, self.salt = seed, salt
        step = Mux(self.state[0], (self.state >> 1) ^ self.TAPS, self.state >> 1)
        m.d.core += self.state.eq(step)

    def reseed(self):
        # Never zero: an all-zero Galois LFSR stays zero.
        seeded = self.seed ^ self.salt
        return self.state.eq(Mux(seeded == 0, self.salt | 1, seeded))

    def below(self, threshold):
        return self.state[:8] < threshold


class StreamHarness(wiring.Component):
    """Wraps ``dut``; ``depths`` gives the memory depth (beats) of each of its streams."""

    def __init__(self, dut: wiring.Component, depths: dict[str, int]):
        self.dut = dut
        self.streams = stream_members(dut.signature)
        if not self.streams:
            raise ValueError(f"{type(dut).__name__} has no stream ports to drive")
        unknown = set(depths) - set(self.streams)
        missing = set(self.streams) - set(depths)
        if unknown or missing:
            raise ValueError(
                f"depths must name exactly the streams {sorted(self.streams)}; "
                f"unknown {sorted(unknown)}, missing {sorted(missing)}"
            )
        for name, depth in depths.items():
            if not isinstance(depth, int) or depth < 1:
                raise ValueError(f"depth of stream {name!r} must be a positive integer")
        self.depths = depths

        members = {
            "start": In(1),
            "seed": In(16),
            "done": Out(1),
            "cycle": Out(COUNTER_BITS),
        }
        for name, driven in self.streams.items():
            if driven:
                members |= {
                    f"{name}_count": In(COUNTER_BITS),
                    f"{name}_idle": In(8),
                    f"{name}_sent": Out(COUNTER_BITS),
                    f"{name}_first": Out(COUNTER_BITS),
                }
            else:
                width = Shape.cast(dut.signature.members[name].signature
                                   .members["payload"].shape).width
                members |= {
                    f"{name}_expect": In(COUNTER_BITS),
                    f"{name}_stall": In(8),
                    f"{name}_flag_mask": In(width),
                    f"{name}_received": Out(COUNTER_BITS),
                    f"{name}_last": Out(COUNTER_BITS),
                    f"{name}_flagged": Out(COUNTER_BITS),
                }
        for name, member in dut.signature.members.items():
            if name not in self.streams:
                if name in members:
                    raise ValueError(f"DUT port {name!r} clashes with a harness port")
                members[name] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        # The input register stage (see the module docstring): `sync` holds only it.
        rst = Signal(init=1, reset_less=True, name="rst_q")
        m.d.sync += rst.eq(ResetSignal())
        m.domains.core = ClockDomain("core")
        m.d.comb += [ClockSignal("core").eq(ClockSignal()), ResetSignal("core").eq(rst)]
        inputs = {}
        for name, member in self.signature.members.items():
            if member.flow == In:
                port = getattr(self, name)
                inputs[name] = Signal.like(port, name=f"{name}_q", reset_less=True)
                m.d.sync += inputs[name].eq(port)

        m.submodules.dut = dut = DomainRenamer("core")(self.dut)

        running = Signal()
        start = inputs["start"]
        with m.If(start):
            m.d.core += [running.eq(1), self.done.eq(0), self.cycle.eq(0)]
        with m.Elif(running & ~self.done):
            m.d.core += self.cycle.eq(self.cycle + 1)

        finished = []
        for salt, (name, driven) in enumerate(self.streams.items(), start=1):
            port = getattr(dut, name)
            width = port.payload.shape().size
            storage = memory.Memory(shape=width, depth=self.depths[name], init=[])
            m.submodules[f"{name}_mem"] = storage
            lfsr = _Lfsr(m, inputs["seed"], salt * 0x9E37 & 0xFFFF, name)
            with m.If(start):
                m.d.core += lfsr.reseed()
            transfer = port.valid & port.ready
            if driven:
                finished.append(self._source(m, name, port, storage, lfsr, running, transfer,
                                             inputs))
            else:
                finished.append(self._sink(m, name, port, storage, lfsr, running, transfer,
                                           inputs))

        done_now = running & ~start
        for flag in finished:
            done_now = done_now & flag
        with m.If(done_now):
            m.d.core += self.done.eq(1)

        for name in self.dut.signature.members:
            if name not in self.streams:
                member = self.signature.members[name]
                theirs = getattr(dut, name)
                if member.flow == Out:
                    m.d.comb += getattr(self, name).eq(theirs)
                else:
                    m.d.comb += theirs.eq(inputs[name])
        return m

    def _source(self, m, name, port, storage, lfsr, running, transfer, inputs):
        count = inputs[f"{name}_count"]
        sent = getattr(self, f"{name}_sent")
        first = getattr(self, f"{name}_first")
        idle, start = inputs[f"{name}_idle"], inputs["start"]
        read = storage.read_port(domain="core")
        # `primed`: the read port already shows the beat at `sent` (one cycle after start).
        primed = Signal(name=f"{name}_primed")
        holding = Signal(name=f"{name}_holding")
        m.d.comb += [
            read.addr.eq(Mux(transfer, sent + 1, sent)),
            port.payload.eq(read.data),
            # Not during `start`: `sent` and `count` may still describe the previous run.
            port.valid.eq(primed & ~start & (sent < count) & (holding | ~lfsr.below(idle))),
        ]
        m.d.core += holding.eq(port.valid & ~port.ready)
        with m.If(start):
            m.d.core += [sent.eq(0), primed.eq(0), holding.eq(0)]
            m.d.comb += read.addr.eq(0)
        with m.Else():
            m.d.core += primed.eq(running)
            with m.If(transfer):
                m.d.core += sent.eq(sent + 1)
                with m.If(sent == 0):
                    m.d.core += first.eq(self.cycle)
        return sent >= count

    def _sink(self, m, name, port, storage, lfsr, running, transfer, inputs):
        expect = inputs[f"{name}_expect"]
        received = getattr(self, f"{name}_received")
        last = getattr(self, f"{name}_last")
        flagged = getattr(self, f"{name}_flagged")
        watched = (Value.cast(port.payload) & inputs[f"{name}_flag_mask"]).any()
        stall, start = inputs[f"{name}_stall"], inputs["start"]
        write = storage.write_port(domain="core")
        m.d.comb += [
            port.ready.eq(running & ~start & ~lfsr.below(stall)),
            write.addr.eq(received),
            write.data.eq(port.payload),
            write.en.eq(transfer & (received < self.depths[name])),
        ]
        with m.If(start):
            m.d.core += [received.eq(0), flagged.eq(0)]
        with m.Elif(transfer):
            m.d.core += [received.eq(received + 1), last.eq(self.cycle),
                         flagged.eq(flagged + watched)]
        return received >= expect
