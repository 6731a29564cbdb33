"""The UART host bridge in the Amaranth simulator, driven by the host script's client."""

from __future__ import annotations

import pytest

from fpga.board import run_gemm
from fpga.bridge import FRAME_TIMEOUT_BYTES, HOST_SYNC, UartBridge, channels, crc8
from fpga.host import BridgeClient, BridgeError, SimulatedLink
from rtl.tensor_core import TensorCore

DIVISOR = 4  # clocks per bit: the fastest the UART allows, for a quick simulation


def bridge_and_client():
    core = TensorCore(2)
    bridge = UartBridge(core, DIVISOR)
    link = SimulatedLink(bridge, DIVISOR)
    return link, BridgeClient(link, core.signature, timeout=20.0)


def test_channels_follow_the_signature():
    chans = channels(TensorCore(2).signature)
    assert [(c.name, c.kind, c.bits) for c in chans] == [
        ("a", "in", 17), ("b", "in", 17), ("c", "out", 65), ("poke", "poke", 0),
        ("peek", "peek", 10)]
    assert crc8(b"123456789") == 0xF4  # the CRC-8/SMBUS check value


def test_a_gemm_through_the_bridge_is_exact():
    link, client = bridge_and_client()
    report = link.run(lambda: run_gemm(client, 2, 3, 5, 3, seed=4))
    assert report == {"m": 3, "k": 5, "p": 3, "passed": True, "error": 0}


def test_bad_frames_are_refused_and_change_nothing():
    link, client = bridge_and_client()

    def host():
        refusals = []
        body = bytes([0, 1, 0, 0])  # channel a, a 17-bit beat
        link.write(bytes([HOST_SYNC]) + body + bytes([crc8(body) ^ 1]))  # bad CRC
        refusals.append(client._next())
        link.write(bytes([HOST_SYNC, 9, 0]))  # no channel 9
        refusals.append(client._next())
        body = bytes([2]) + bytes(9)  # channel c is the bridge's to send
        link.write(bytes([HOST_SYNC]) + body + bytes([crc8(body)]))
        refusals.append(client._next())
        link.write(bytes([HOST_SYNC, 0, 7]))  # a frame that never finishes
        link.pause(FRAME_TIMEOUT_BYTES * 10 * DIVISOR + 100)
        silent = link.read(1, 0.1)
        peek = client.peek()  # the parser dropped the unfinished frame and resynchronised
        with pytest.raises(ValueError, match="no in channel"):
            client.send("c", 0)
        return refusals, silent, peek

    refusals, silent, peek = link.run(host, max_cycles=FRAME_TIMEOUT_BYTES * 40 * DIVISOR
                                      + 200_000)
    assert refusals == [("nak", 1), ("nak", 2), ("nak", 3)]
    assert silent == b""
    assert peek == {"errors": 4, "error": 0, "active": 0}  # three refusals, one dropped frame


def test_a_silent_bridge_is_an_error_not_a_hang():
    core = TensorCore(2)

    class Deaf:
        def write(self, data):
            pass

        def read(self, count, timeout):
            return b""

    with pytest.raises(BridgeError, match="went silent"):
        BridgeClient(Deaf(), core.signature, timeout=0.01).peek()


def test_impossible_divisors_are_refused():
    with pytest.raises(ValueError, match="divisor"):
        UartBridge(TensorCore(2), 2)
