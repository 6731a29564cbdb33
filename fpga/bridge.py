"""A UART host bridge around any component with stream ports (the tile on the board).

The channels are derived from the component's signature (:func:`channels`), by the
hardware and by the host (:mod:`fpga.host`) alike, so the two cannot disagree: one
channel per stream port, in signature order (``in``: host to the component, ``out``: the
component to the host), then ``poke`` (every other input, e.g. ``go``, concatenated in
signature order) and ``peek`` (every other output, e.g. ``status``, concatenated, after
the bridge's own error count).

Protocol (8N1 bytes; values little-endian, ``ceil(bits / 8)`` bytes, CRC-8 with
polynomial 0x07 over the channel byte and the value bytes):

- host -> bridge: ``0x5A, channel, value, crc``. On an ``in`` channel the value becomes
  one stream beat, held in a one-beat register per stream until the component takes it;
  the bridge answers ``ACK`` (0x06) once the beat is in that register (so the host sends
  one frame at a time and the component's backpressure reaches the host; a component
  that takes beats of several streams together gets them frame after frame).
  ``poke`` sets the other inputs (held until the next poke) and answers ``ACK``;
  ``peek`` has no value bytes and is answered by a ``peek`` frame.
- bridge -> host: ``ACK``; ``NAK`` (0x15) and a code (:class:`Nak`); or a frame ``0xA5,
  channel, value, crc`` for each beat of an ``out`` stream (as it comes) and for peeks.
- A frame with a bad CRC, an unknown channel or one that is not the host's to send is
  refused with a NAK and changes nothing; a frame left unfinished for
  :data:`FRAME_TIMEOUT_BYTES` byte times is dropped (the parser waits for the next
  ``0x5A``). UART framing errors and overruns are dropped too. Each of these counts
  in ``errors`` (saturating at 255, first in the peek frame).
"""


import enum
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from fpga.uart import UartRx, UartTx, check_divisor

HOST_SYNC, BRIDGE_SYNC, ACK, NAK = 0x5A, 0xA5, 0x06, 0x15
#: Byte times a frame may pause before the bridge drops it.
FRAME_TIMEOUT_BYTES = 64


class Nak(enum.IntEnum):
    """Why the bridge refused a frame (the byte after ``NAK``)."""

    BAD_CRC = 1
    UNKNOWN_CHANNEL = 2
    NOT_AN_INPUT = 3  # a frame for an `out` channel


@dataclass(frozen=True)
class Channel:
    number: int
    name: str
    kind: str  # "in", "out", "poke" or "peek"
    bits: int
    members: tuple[tuple[str, int], ...] = ()  # poke/peek: (port, width) in value order

    @property
    def nbytes(self) -> int:
        """Value bytes of a frame from the bridge."""
        return (self.bits + 7) // 8

    @property
    def host_bytes(self) -> int:
        """Value bytes of a frame from the host (a peek request has none)."""
        return 0 if self.kind == "peek" else self.nbytes


def channels(signature) -> list[Channel]:
    """The bridge's channels for a component with this signature."""
    out, pokes, peeks = [], [], [("errors", 8)]
    for name, member in signature.members.items():
        if member.is_signature:
            members = member.signature.members
            if set(members) != {"valid", "ready", "payload"}:
                raise ValueError(f"port {name!r} is an interface but not a stream")
            width = Shape.cast(members["payload"].shape).width
            # A stream the component receives is flipped (In) in its signature.
            out.append(Channel(len(out), name, "in" if member.flow == In else "out", width))
        else:
            (pokes if member.flow == In else peeks).append((name, Shape.cast(member.shape).width))
    if not out:
        raise ValueError("the component has no stream port to bridge")
    out.append(Channel(len(out), "poke", "poke", sum(w for _, w in pokes), tuple(pokes)))
    out.append(Channel(len(out), "peek", "peek", sum(w for _, w in peeks), tuple(peeks)))
    if len(out) > 255:
        raise ValueError("too many ports for one-byte channel numbers")
    return out


def crc8(data: bytes) -> int:
    """CRC-8, polynomial x^8 + x^2 + x + 1 (0x07), initial value 0, MSB first."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc8_step(crc, byte):
    """One byte of :func:`crc8` as logic. The step is linear in ``crc ^ byte``: output bit
    i is the XOR of the input bits whose unit vectors set it (found by running
    :func:`crc8`'s inner loop on each)."""
    value = crc ^ byte

    def step(x: int) -> int:
        for _ in range(8):
            x = ((x << 1) ^ 0x07) & 0xFF if x & 0x80 else (x << 1) & 0xFF
        return x

    taps = [[j for j in range(8) if step(1 << j) >> i & 1] for i in range(8)]
    return Cat(*(Cat(*(value[j] for j in t)).xor() for t in taps))


class UartBridge(wiring.Component):
    """``dut`` behind a UART at ``divisor`` clock cycles per bit (see the module docstring).

    Ports: ``rx`` (from the host), ``tx`` (to the host). The component runs in the
    bridge's clock domain.
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)

    def __init__(self, dut, divisor: int):
        self.dut, self.divisor = dut, divisor
        self.channels = channels(dut.signature)
        check_divisor(divisor)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = dut = self.dut
        m.submodules.rx = rx = UartRx(self.divisor)
        m.submodules.tx = tx = UartTx(self.divisor)
        m.d.comb += [rx.rx.eq(self.rx), self.tx.eq(tx.tx)]
        chans = {c.name: c for c in self.channels}
        poke, peek = chans["poke"], chans["peek"]
        width = 8 * max(c.nbytes for c in self.channels)

        errors = Signal(8)
        error_events = Signal(3)  # a UART error, a refused frame, a dropped frame
        total = sum(error_events[i] for i in range(3))
        m.d.sync += errors.eq(Mux(errors + total > 255, 255, errors + total))
        st = SimpleNamespace()
        st.__dict__.update(dut=dut, error_events=error_events, errors=errors, peek=peek, poke=poke,
                           rx=rx, tx=tx, width=width)
        for stage in (self._inputs, self._receive, self._parser, self._send):
            stage(m, st)
        return m

    def _inputs(self, m: Module, st: SimpleNamespace) -> None:
        """Poke: the component's other inputs, held."""
        dut, poke = st.dut, st.poke
        poked = Signal(max(1, poke.bits))
        offset = 0
        for name, w in poke.members:
            m.d.comb += getattr(dut, name).eq(poked[offset:offset + w])
            offset += w

        # Each input stream's beat waits in a holding register: the ACK says the bridge has
        # it, so a component that takes beats of several streams together (the tensor
        # core's A and B) gets them one frame after the other.
        held = {}
        for c in self.channels:
            if c.kind == "in":
                port = getattr(dut, c.name)
                valid = Signal(name=f"{c.name}_held")
                payload = Signal(c.bits, name=f"{c.name}_beat")
                m.d.comb += [port.valid.eq(valid), port.payload.eq(payload)]
                with m.If(port.ready):
                    m.d.sync += valid.eq(0)
                held[c.name] = (valid, payload, port)
        st.__dict__.update(held=held, poked=poked)

    def _receive(self, m: Module, st: SimpleNamespace) -> None:
        """Receive: parse host frames."""
        error_events, rx, width = st.error_events, st.rx, st.width
        buffer = Signal(width)
        channel = Signal(8)
        count = Signal(range(width // 8 + 1))
        crc = Signal(8)
        idle = Signal(range(FRAME_TIMEOUT_BYTES * 10 * self.divisor + 1))
        reply = Signal(2)  # 0 none, 1 ACK, 2 NAK, 3 peek frame: pending for the sender
        nak_code = Signal(8)
        byte = rx.data.payload
        got = Signal()
        m.d.comb += got.eq(rx.data.valid & rx.data.ready)
        m.d.comb += error_events[0].eq(rx.framing | rx.overrun)

        def nbytes_of(value):
            result = Signal(range(width // 8 + 1))
            with m.Switch(value):
                for c in self.channels:
                    with m.Case(c.number):
                        m.d.comb += result.eq(c.host_bytes)
            return result

        def refuse(code: Nak) -> None:
            """Inside a parser state: answer NAK ``code``, count it, wait for a sync."""
            m.d.sync += [reply.eq(2), nak_code.eq(code)]
            m.d.comb += error_events[1].eq(1)
            m.next = "IDLE"
        st.__dict__.update(buffer=buffer, byte=byte, channel=channel, count=count, crc=crc,
                           got=got, idle=idle, nak_code=nak_code, nbytes_of=nbytes_of,
                           refuse=refuse, reply=reply)

    def _parser(self, m: Module, st: SimpleNamespace) -> None:
        buffer, byte, channel, count, crc = st.buffer, st.byte, st.channel, st.count, st.crc
        error_events, got, held, idle = st.error_events, st.got, st.held, st.idle
        nbytes_of, poked, refuse, reply, rx = st.nbytes_of, st.poked, st.refuse, st.reply, st.rx
        expected = nbytes_of(channel)
        timed_out = Signal()
        m.d.comb += timed_out.eq(idle == FRAME_TIMEOUT_BYTES * 10 * self.divisor)
        with m.FSM(name="parser") as parser:
            with m.State("IDLE"):
                m.d.comb += rx.data.ready.eq(1)
                with m.If(got & (byte == HOST_SYNC)):
                    m.d.sync += idle.eq(0)
                    m.next = "CHANNEL"
            with m.State("CHANNEL"):
                m.d.comb += rx.data.ready.eq(reply == 0)
                with m.If(got):
                    m.d.sync += [channel.eq(byte), crc.eq(_crc8_step(Const(0, 8), byte)),
                                 count.eq(0), buffer.eq(0), idle.eq(0)]
                    with m.If(byte >= len(self.channels)):
                        refuse(Nak.UNKNOWN_CHANNEL)
                    with m.Else():
                        m.next = "DATA"
                with m.Elif(timed_out):
                    m.next = "DROP"
            with m.State("DATA"):
                m.d.comb += rx.data.ready.eq(count != expected)
                with m.If(count == expected):
                    m.next = "CRC"
                with m.Elif(got):
                    m.d.sync += [buffer.word_select(count, 8).eq(byte), count.eq(count + 1),
                                 crc.eq(_crc8_step(crc, byte)), idle.eq(0)]
                with m.Elif(timed_out):
                    m.next = "DROP"
            with m.State("CRC"):
                m.d.comb += rx.data.ready.eq(1)
                with m.If(got):
                    with m.If(byte != crc):
                        refuse(Nak.BAD_CRC)
                    with m.Else():
                        m.next = "ACT"
                with m.Elif(timed_out):
                    m.next = "DROP"
            with m.State("ACT"):
                with m.Switch(channel):
                    for c in self.channels:
                        with m.Case(c.number):
                            if c.kind == "in":
                                valid, payload, port = held[c.name]
                                with m.If(~valid | port.ready):  # room for the beat
                                    m.d.sync += [valid.eq(1), payload.eq(buffer[:c.bits]),
                                                 reply.eq(1)]
                                    m.next = "IDLE"
                            elif c.kind == "poke":
                                if c.bits:
                                    m.d.sync += poked.eq(buffer[:c.bits])
                                m.d.sync += reply.eq(1)
                                m.next = "IDLE"
                            elif c.kind == "peek":
                                m.d.sync += reply.eq(3)
                                m.next = "IDLE"
                            else:
                                refuse(Nak.NOT_AN_INPUT)
            # An unfinished frame times out (the parser then waits for the next sync).
            with m.State("DROP"):
                m.d.comb += error_events[2].eq(1)
                m.next = "IDLE"
        in_frame = parser.ongoing("CHANNEL") | parser.ongoing("DATA") | parser.ongoing("CRC")
        with m.If(in_frame & ~got & ~timed_out):
            m.d.sync += idle.eq(idle + 1)
        with m.If(parser.ongoing("DROP")):
            m.d.sync += idle.eq(0)

    def _send(self, m: Module, st: SimpleNamespace) -> None:
        """Send: replies, peeks and the out streams' beats."""
        dut, errors, nak_code, peek, reply = st.dut, st.errors, st.nak_code, st.peek, st.reply
        tx, width = st.tx, st.width
        frame = Signal(width)
        frame_channel = Signal(8)
        frame_bytes = Signal(range(width // 8 + 1))
        sent = Signal(range(width // 8 + 1))
        tx_crc = Signal(8)
        peek_value = Cat(errors, *(getattr(dut, name) for name, _ in peek.members[1:]))
        outs = [c for c in self.channels if c.kind == "out"]
        with m.FSM(name="sender"):
            with m.State("IDLE"):
                with m.If(reply == 1):
                    m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(ACK)]
                    with m.If(tx.data.ready):
                        m.d.sync += reply.eq(0)
                with m.Elif(reply == 2):
                    m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(NAK)]
                    with m.If(tx.data.ready):
                        m.next = "NAK_CODE"
                with m.Elif(reply == 3):
                    m.d.sync += [frame.eq(peek_value), frame_channel.eq(peek.number),
                                 frame_bytes.eq(peek.nbytes), reply.eq(0)]
                    m.next = "SYNC"
                with m.Else():
                    for index, c in enumerate(outs):  # the first in signature order wins
                        port = getattr(dut, c.name)
                        with (m.If if index == 0 else m.Elif)(port.valid):
                            m.d.comb += port.ready.eq(1)
                            m.d.sync += [frame.eq(port.payload), frame_channel.eq(c.number),
                                         frame_bytes.eq(c.nbytes)]
                            m.next = "SYNC"
            with m.State("NAK_CODE"):
                m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(nak_code)]
                with m.If(tx.data.ready):
                    m.d.sync += reply.eq(0)
                    m.next = "IDLE"
            with m.State("SYNC"):
                m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(BRIDGE_SYNC)]
                with m.If(tx.data.ready):
                    m.next = "CHANNEL"
            with m.State("CHANNEL"):
                m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(frame_channel)]
                with m.If(tx.data.ready):
                    m.d.sync += [tx_crc.eq(_crc8_step(Const(0, 8), frame_channel)), sent.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(sent == frame_bytes):
                    m.next = "CRC"
                with m.Else():
                    out_byte = frame.word_select(sent, 8)
                    m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(out_byte)]
                    with m.If(tx.data.ready):
                        m.d.sync += [sent.eq(sent + 1), tx_crc.eq(_crc8_step(tx_crc, out_byte))]
            with m.State("CRC"):
                m.d.comb += [tx.data.valid.eq(1), tx.data.payload.eq(tx_crc)]
                with m.If(tx.data.ready):
                    m.next = "IDLE"
