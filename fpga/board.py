"""What goes on the board, and what the host runs on it.

``DESIGNS``: ``tile`` — one tile (N = 4, a tiny-shaped KV cache; the 2 x 2 chip of
``make sim`` does not fit an LFE5U-85F: its vector units alone would need more logic
than the device has, docs/synth.md) — and ``tensor_core`` (N = 4), a small design to
bring a board up with. Each sits behind :class:`fpga.bridge.UartBridge` at
:data:`BAUD` on the board's 25 MHz clock. The host routines (:func:`run_gemm`,
:func:`run_prefill`) drive a :class:`fpga.host.BridgeClient` and check every result
against golden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from amaranth.hdl import Module
from amaranth.lib import data, wiring

from fpga.bridge import UartBridge

#: The serial link: 1 Mbaud (the ULX3S's FT231X goes to 3 Mbaud).
BAUD = 1_000_000
CLOCK_HZ = 25_000_000


@dataclass(frozen=True)
class Board:
    platform: str  # class name in amaranth_boards
    module: str


BOARDS = {"ulx3s-85f": Board("ULX3S_85F_Platform", "amaranth_boards.ulx3s")}


def board_tile():
    """The tile on the board and its compiler config."""
    from sim.tile_run import tile_config, tile_from_config

    config = tile_config("tiny", n=4, max_context=64)
    return tile_from_config(config), config


def tensor_core():
    from rtl.tensor_core import TensorCore

    return TensorCore(4)


DESIGNS = {"tile": lambda: board_tile()[0], "tensor_core": tensor_core}


class BoardTop(wiring.Component):
    """``design`` behind the UART bridge on the board's serial port and clock."""

    def __init__(self, design, divisor: int = CLOCK_HZ // BAUD):
        self.bridge = UartBridge(design, divisor)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = self.bridge
        uart = platform.request("uart", 0)
        m.d.comb += [self.bridge.rx.eq(uart.rx.i), uart.tx.o.eq(self.bridge.tx)]
        return m


def _pack(layout, fields: dict) -> int:
    return layout.const(fields).as_value().value


def _layout(component, port: str):
    return component.signature.members[port].signature.members["payload"].shape


def run_gemm(client, n: int, m: int, k: int, p: int, seed: int = 1) -> dict:
    """An M x K by K x P int8 GEMM on the tensor core behind ``client``, checked against
    golden; returns the shapes and ``passed``."""
    from golden.gemm import gemm
    from sim.gemm_stream import assemble, operand_beats, result_rows, tile_grid

    rng = np.random.default_rng(seed)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, p))
    a_beats, b_beats = operand_beats(a, b, n)
    for x, y in zip(a_beats, b_beats, strict=True):  # interleaved: the core needs both
        client.send("a", x)
        client.send("b", y)
    rows, cols = tile_grid(m, p, n)
    values, _ = result_rows(client.receive("c", rows * cols * n), n)
    got = assemble(values, m, p, n)
    return {"m": m, "k": k, "p": p, "passed": bool((got == gemm(a, b)).all()),
            "error": client.peek()["error"]}


def run_prefill(client, tile, config, workload: str, layer: int, prefill: int) -> dict:
    """Attention prefill of ``prefill`` tokens on the tile behind ``client``: program,
    queries and KV through the host ports, ``go``, wait for the halt, read the outputs;
    every output checked against golden."""
    from rtl.sequencer import ErrorCode
    from sim.attention_scenario import attention_steps

    step = attention_steps(config, workload, layer, prefill=prefill, steps=0)[0]
    program = step.program
    host, kv, prog = (_layout(tile, name) for name in ("host_req", "kv_req", "program"))
    response = _layout(tile, "host_resp")
    for address, word in enumerate(program.instructions):
        client.send("program", _pack(prog, {"address": address, "word": word}))
    for address, word in sorted(program.spad_writes.items()):
        client.send("host_req", _pack(host, {"addr": address, "write": 1, "data": word}))
    writes = client.receive("host_resp", len(program.spad_writes))
    for request in step.kv_requests:
        client.send("kv_req", _pack(kv, request))
    kv_answers = client.receive("kv_resp", len(step.kv_requests))
    failed = [r for r in writes + kv_answers if _failed(response, r)]
    if failed:
        return {"passed": False, "why": f"{len(failed)} host/KV requests refused"}
    client.poke(go=1)
    client.poke(go=0)
    status_layout = tile.signature.members["status"].shape
    while True:
        status = data.Const(status_layout, client.peek()["status"])
        if status.halted:
            break
    if status.error != ErrorCode.NONE:
        return {"passed": False, "why": f"the tile stopped with {status.error.name}"}
    for address in program.output_words:
        client.send("host_req", _pack(host, {"addr": address, "write": 0, "data": 0}))
    words = [int(data.Const(response, r).data)
             for r in client.receive("host_resp", len(program.output_words))]
    got = program.read_output(dict(zip(program.output_words, words, strict=True)).__getitem__)
    return {"passed": bool((got == step.expected).all()), "outputs": int(got.size),
            "instructions": len(program.instructions)}


def _failed(layout, raw: int) -> bool:
    status = data.Const(layout, raw).status
    return any(status[name] for name, _ in status.shape() if name != "corrected")
