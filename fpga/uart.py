"""8N1 UART receiver and transmitter, ``divisor`` clock cycles per bit."""


from amaranth.hdl import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


def check_divisor(divisor: int) -> None:
    if not isinstance(divisor, int) or divisor < 4:
        raise ValueError(f"UART divisor must be an integer >= 4 clocks per bit, not {divisor!r}")


class _UartPart(wiring.Component):
    def __init__(self, divisor: int):
        check_divisor(divisor)
        self.divisor = divisor
        super().__init__()


class UartRx(_UartPart):
    """Receives bytes on ``rx`` (idle high): the start bit's middle is found after half a
    bit, then each bit is sampled once in its middle. A byte whose stop bit is low is a
    framing error (dropped, ``framing`` pulses); a byte arriving while the previous one
    still waits on ``data`` is an overrun (dropped, ``overrun`` pulses). ``rx`` passes
    two flip-flops first (it comes from another clock domain)."""

    rx: In(1, init=1)
    data: Out(stream.Signature(8))
    framing: Out(1)
    overrun: Out(1)

    def elaborate(self, platform):
        m = Module()
        sync1, line = Signal(init=1), Signal(init=1)
        m.d.sync += [sync1.eq(self.rx), line.eq(sync1)]
        timer = Signal(range(self.divisor))
        bits = Signal(range(9))
        shift = Signal(8)
        m.d.sync += [self.framing.eq(0), self.overrun.eq(0)]
        with m.If(self.data.valid & self.data.ready):
            m.d.sync += self.data.valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(self.divisor // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(timer == 0):
                    with m.If(line):  # a glitch, not a start bit
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [timer.eq(self.divisor - 1), bits.eq(0)]
                        m.next = "DATA"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("DATA"):
                with m.If(timer == 0):
                    m.d.sync += [shift.eq((shift >> 1) | (line << 7)), bits.eq(bits + 1),
                                 timer.eq(self.divisor - 1)]
                    with m.If(bits == 7):
                        m.next = "STOP"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("STOP"):
                with m.If(timer == 0):
                    with m.If(~line):
                        m.d.sync += self.framing.eq(1)
                    with m.Elif(self.data.valid & ~self.data.ready):
                        m.d.sync += self.overrun.eq(1)
                    with m.Else():
                        m.d.sync += [self.data.payload.eq(shift), self.data.valid.eq(1)]
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
        return m


class UartTx(_UartPart):
    """Sends each byte of ``data`` on ``tx``: start bit, 8 data bits LSB first, stop bit."""

    data: In(stream.Signature(8))
    tx: Out(1, init=1)

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        left = Signal(range(11))  # line symbols left, this one included (0: idle)
        shift = Signal(9)  # the data bits, then the stop bit
        with m.If(left == 0):
            m.d.comb += self.data.ready.eq(1)
            with m.If(self.data.valid):
                m.d.sync += [self.tx.eq(0), shift.eq((1 << 8) | self.data.payload),
                             left.eq(10), timer.eq(self.divisor - 1)]
        with m.Elif(timer == 0):
            m.d.sync += left.eq(left - 1)
            with m.If(left != 1):
                m.d.sync += [self.tx.eq(shift[0]), shift.eq(shift >> 1),
                             timer.eq(self.divisor - 1)]
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        return m
