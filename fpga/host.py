"""The host side of :mod:`fpga.bridge`: frames over a serial port (or a simulated one).

``python -m fpga.host --port /dev/ttyUSB0`` loads an attention prefill program and its
data into the tile on the board, runs it and checks every output against golden (the
same program builder and golden model as the simulations); ``--design tensor_core``
runs a GEMM on a tensor-core bitstream instead. :class:`BridgeClient` is the
protocol; :class:`SerialLink` the board's serial port (pyserial); tests use
:class:`SimulatedLink`, which runs the bridge in the Amaranth simulator.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
import time

from fpga.bridge import ACK, BRIDGE_SYNC, HOST_SYNC, NAK, Channel, Nak, channels, crc8


class BridgeError(RuntimeError):
    """The bridge refused a frame, or the host could not make sense of its answer."""


class BridgeClient:
    """Sends beats, pokes and peeks through the bridge of a component with ``signature``."""

    def __init__(self, link, signature, timeout: float = 5.0):
        self.link, self.timeout = link, timeout
        self.channels = {c.name: c for c in channels(signature)}
        self._by_number = {c.number: c for c in self.channels.values()}
        self._received: dict[str, list[int]] = {c.name: [] for c in self.channels.values()}

    def _channel(self, name: str, kinds: tuple[str, ...]) -> Channel:
        channel = self.channels.get(name)
        if channel is None or channel.kind not in kinds:
            known = [c.name for c in self.channels.values() if c.kind in kinds]
            raise ValueError(f"no {'/'.join(kinds)} channel {name!r}; known: {known}")
        return channel

    def _frame(self, channel: Channel, value: int) -> bytes:
        if not 0 <= value < 1 << max(channel.bits, 1) or (channel.bits == 0 and value):
            raise ValueError(f"{value:#x} does not fit channel {channel.name!r} "
                             f"({channel.bits} bits)")
        body = bytes([channel.number]) + value.to_bytes(channel.host_bytes, "little")
        return bytes([HOST_SYNC]) + body + bytes([crc8(body)])

    def _read(self, count: int) -> bytes:
        data = self.link.read(count, self.timeout)
        if len(data) != count:
            raise BridgeError(f"the bridge went silent ({len(data)} of {count} bytes in "
                              f"{self.timeout} s)")
        return data

    def _next(self) -> tuple:
        """The next thing the bridge says: ("ack",), ("nak", code) or ("frame", name)."""
        head = self._read(1)[0]
        if head == ACK:
            return ("ack",)
        if head == NAK:
            return ("nak", self._read(1)[0])
        if head != BRIDGE_SYNC:
            raise BridgeError(f"unexpected byte {head:#04x} from the bridge")
        number = self._read(1)[0]
        channel = self._by_number.get(number)
        if channel is None or channel.kind not in ("out", "peek"):
            raise BridgeError(f"a frame on channel {number}, which the bridge never sends")
        body = bytes([number]) + self._read(channel.nbytes)
        if self._read(1)[0] != crc8(body):
            raise BridgeError(f"a frame on {channel.name!r} with a bad CRC")
        self._received[channel.name].append(int.from_bytes(body[1:], "little"))
        return ("frame", channel.name)

    def _answer(self, wanted: str | None) -> None:
        """Read until the ACK (``wanted`` None) or a frame on ``wanted`` arrives."""
        while True:
            got = self._next()
            if got[0] == "nak":
                raise BridgeError(f"the bridge refused the frame: {Nak(got[1]).name}")
            if (got[0] == "ack" and wanted is None) or (got[0] == "frame" and got[1] == wanted):
                return

    def send(self, name: str, value: int) -> None:
        """One beat into input stream ``name`` (returns once the component took it)."""
        self.link.write(self._frame(self._channel(name, ("in",)), value))
        self._answer(None)

    def poke(self, **values: int) -> None:
        """Set the component's other inputs (all of them; those not given become 0)."""
        channel = self.channels["poke"]
        unknown = set(values) - {name for name, _ in channel.members}
        if unknown:
            raise ValueError(f"no input {sorted(unknown)} to poke; known: "
                             f"{[name for name, _ in channel.members]}")
        value, offset = 0, 0
        for name, width in channel.members:
            field = values.get(name, 0)
            if not 0 <= field < 1 << width:
                raise ValueError(f"{name}={field} does not fit {width} bits")
            value |= field << offset
            offset += width
        self.link.write(self._frame(channel, value))
        self._answer(None)

    def peek(self) -> dict[str, int]:
        """The component's other outputs now (and the bridge's ``errors``)."""
        channel = self.channels["peek"]
        self.link.write(self._frame(channel, 0))
        self._answer("peek")
        raw, out, offset = self._received["peek"].pop(), {}, 0
        for name, width in channel.members:
            out[name] = raw >> offset & ((1 << width) - 1)
            offset += width
        return out

    def receive(self, name: str, count: int) -> list[int]:
        """The next ``count`` beats of output stream ``name``."""
        self._channel(name, ("out",))
        while len(self._received[name]) < count:
            self._next()
        beats, self._received[name] = (self._received[name][:count],
                                       self._received[name][count:])
        return beats


class SerialLink:
    """The board's serial port (pyserial), 8N1 at ``baud``."""

    def __init__(self, port: str, baud: int):
        import serial

        self.port = serial.Serial(port, baud, timeout=0.1)

    def write(self, data: bytes) -> None:
        self.port.write(data)

    def read(self, count: int, timeout: float) -> bytes:
        out, deadline = b"", time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            out += self.port.read(count - len(out))
        return out


class SimulatedLink:
    """The bridge in the Amaranth simulator, its UART driven bit by bit: ``run(client
    code)`` runs the host code in a thread while the simulation runs the bridge."""

    def __init__(self, bridge, divisor: int):
        self.bridge, self.divisor = bridge, divisor
        self._to_bridge: queue.Queue[int] = queue.Queue()
        self._from_bridge: queue.Queue[int] = queue.Queue()
        self.cycles = 0
        self._waiting: tuple[int, threading.Event] | None = None

    def pause(self, cycles: int) -> None:
        """Let ``cycles`` clock cycles pass with the line idle (from the host thread)."""
        done = threading.Event()
        self._waiting = (self.cycles + cycles, done)
        done.wait()

    def write(self, data: bytes) -> None:
        for byte in data:
            self._to_bridge.put(byte)

    def read(self, count: int, timeout: float) -> bytes:
        out = bytearray()
        try:
            while len(out) < count:
                out.append(self._from_bridge.get(timeout=timeout))
        except queue.Empty:
            pass
        return bytes(out)

    def run(self, host, max_cycles: int = 2_000_000):
        """Simulate until ``host()`` (run in a thread) returns; return its result."""
        from amaranth.sim import Simulator

        from sim.runner import run_amaranth

        result, failure, finished = {}, [], threading.Event()

        def target():
            try:
                result["value"] = host()
            except BaseException as why:  # noqa: BLE001 -- re-raised below
                failure.append(why)
            finally:
                finished.set()

        sim = Simulator(self.bridge)
        sim.add_clock(1e-8)
        bit = self.divisor

        async def uart(ctx):
            sending: list[int] = []  # line levels still to drive, one per bit time
            left, receiving, sample, shift = 0, False, 0, 0
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            for cycle in range(max_cycles):
                if left == 0:
                    if not sending and not self._to_bridge.empty():
                        byte = self._to_bridge.get()
                        sending = [0] + [byte >> i & 1 for i in range(8)] + [1]
                    if sending:
                        ctx.set(self.bridge.rx, sending.pop(0))
                        left = bit
                left -= 1 if left else 0
                level = ctx.get(self.bridge.tx)
                if not receiving and level == 0:
                    receiving, sample, shift = True, bit // 2 + bit, 0
                    bits = 0
                elif receiving:
                    sample -= 1
                    if sample == 0:
                        if bits < 8:
                            shift |= level << bits
                            bits += 1
                            sample = bit
                        else:  # the stop bit
                            self._from_bridge.put(shift)
                            receiving = False
                await ctx.tick()
                self.cycles = cycle
                if self._waiting and self._waiting[0] <= cycle:
                    self._waiting[1].set()
                    self._waiting = None
                if finished.is_set() and not sending and self._to_bridge.empty() \
                        and not receiving:
                    break
            else:
                raise AssertionError(f"the host code did not finish in {max_cycles} cycles")

        sim.add_testbench(uart)
        run_amaranth(sim)
        if failure:
            raise failure[0]
        return result.get("value")


def main(argv: list[str] | None = None) -> int:
    from fpga.board import BAUD, board_tile, run_gemm, run_prefill, tensor_core

    parser = argparse.ArgumentParser(
        prog="python -m fpga.host",
        description="Drive the design on the board through its UART bridge: attention "
                    "prefill on the tile, or a GEMM on the tensor core; every result is "
                    "checked against golden.")
    parser.add_argument("--port", required=True, help="serial port, e.g. /dev/ttyUSB0")
    parser.add_argument("--baud", type=int, default=BAUD, help=f"default {BAUD}")
    parser.add_argument("--design", choices=("tile", "tensor_core"), default="tile",
                        help="what the bitstream holds (make fpga DESIGN=...)")
    parser.add_argument("--workload", default="tiny", help="tile: the workload (tiny)")
    parser.add_argument("--layer", type=int, default=1, help="tile: the layer")
    parser.add_argument("--prefill", type=int, default=8, help="tile: prompt tokens")
    parser.add_argument("--gemm", default="8x12x8", help="tensor_core: MxKxP")
    args = parser.parse_args(argv)
    if args.design == "tile":
        tile, config = board_tile()
        client = BridgeClient(SerialLink(args.port, args.baud), tile.signature)
        report = run_prefill(client, tile, config, args.workload, args.layer, args.prefill)
    else:
        try:
            m, k, p = (int(x) for x in args.gemm.split("x"))
        except ValueError:
            parser.error(f"--gemm {args.gemm!r}: expected MxKxP, e.g. 8x12x8")
        core = tensor_core()
        client = BridgeClient(SerialLink(args.port, args.baud), core.signature)
        report = run_gemm(client, core.n, m, k, p)
    print(report)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
