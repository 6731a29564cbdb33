"""The DMA engine in the Amaranth simulator: local copies, words to other tiles, bare
signals, with a modelled scratchpad port (random latency and ready) and a stalling
network."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth.sim import Simulator

from rtl.dma_engine import DmaEngine
from sim.runner import run_amaranth
from spec.isa import DmaTarget, tile_bit
from spec.memory import MemRead

OWN = tile_bit(1, 1)
OTHER = (1 << 0) | (1 << 8)  # tiles (0, 0) and (0, 1)


def run(commands, memory, *, seed=0, stall=0.3, channels=False):
    rng = np.random.default_rng(seed)
    dut = DmaEngine(4, position=(1, 1), memory=channels)
    mem = dict(memory)
    events = {"done": [], "arrival": [], "net": [], "targets": []}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def commander(ctx):
        for fields in commands:
            for name, value in fields.items():
                if name == "signal":
                    ctx.set(dut.cmd.payload.signal.enable, value["enable"])
                    ctx.set(dut.cmd.payload.signal.semaphore, value["semaphore"])
                else:
                    ctx.set(getattr(dut.cmd.payload, name), value)
            ctx.set(dut.cmd.valid, 1)
            await ctx.tick().until(dut.cmd.ready)
            ctx.set(dut.cmd.valid, 0)
            for name in ("remote_signal", "remote_semaphore", "target", "channel",
                         "mem_addr", "tiles"):
                ctx.set(getattr(dut.cmd.payload, name), 0)
        for _ in range(5000):  # watchdog
            if len(events["done"]) == len(commands):
                break
            await ctx.tick()

    async def port(ctx):
        pending, cycle = [], 0
        while True:
            ready = rng.random() >= stall and len(pending) < 6
            ctx.set(dut.req.ready, ready)
            head = bool(pending) and pending[0][0] <= cycle
            ctx.set(dut.resp.valid, head)
            if head:
                ctx.set(dut.resp.payload.data, pending[0][1])
                ctx.set(dut.resp.payload.write, pending[0][2])
            net_ready = rng.random() >= stall
            ctx.set(dut.net_out.ready, net_ready)
            ctx.set(dut.done.ready, 1)
            ctx.set(dut.arrival.ready, 1)
            sampled = await ctx.tick().sample(
                dut.req.valid, dut.req.payload.addr, dut.req.payload.write,
                dut.req.payload.data, dut.resp.ready, dut.net_out.valid, dut.net_out.payload,
                dut.done.valid, dut.done.payload, dut.arrival.valid, dut.arrival.payload)
            (valid, addr, write, wdata, resp_ready, net_valid, net, done_valid, done,
             arrival_valid, arrival) = sampled[2:]
            if head and resp_ready:
                pending.pop(0)
            if ready and valid:
                if write:
                    mem[addr] = wdata
                pending.append((cycle + 5 + int(rng.integers(3)), 0 if write else
                                mem.get(addr, 0), write))
            if net_valid and net_ready:
                events["net"].append((int(net.tiles), int(net.addr), int(net.data),
                                      int(net.write), int(net.last), int(net.signal),
                                      int(net.semaphore)))
                events["targets"].append((net.target.value, int(net.channel)))
            if done_valid:
                events["done"].append((int(done.enable), int(done.semaphore)))
            if arrival_valid:
                events["arrival"].append(int(arrival))
            cycle += 1

    sim.add_testbench(commander)
    sim.add_process(port)
    run_amaranth(sim)
    return mem, events


def test_local_copy_and_remote_words(seed):
    source = {100 + i: 0x1000 + i for i in range(10)}
    commands = [
        {"src": 100, "dst": 200, "length": 10, "tiles": OWN,
         "signal": {"enable": 1, "semaphore": 2}, "remote_signal": 1, "remote_semaphore": 5},
        {"src": 100, "dst": 300, "length": 3, "tiles": OWN | OTHER,
         "signal": {"enable": 0, "semaphore": 0}, "remote_signal": 1, "remote_semaphore": 7},
        {"src": 0, "dst": 0, "length": 0, "tiles": OTHER,
         "signal": {"enable": 1, "semaphore": 9}, "remote_signal": 1, "remote_semaphore": 3},
    ]
    mem, events = run(commands, source, seed=seed)
    assert [mem[200 + i] for i in range(10)] == [0x1000 + i for i in range(10)]
    assert [mem[300 + i] for i in range(3)] == [0x1000 + i for i in range(3)]
    assert events["done"] == [(1, 2), (0, 0), (1, 9)]
    assert events["arrival"] == [5, 7]  # the local copies that asked for a signal
    assert events["net"] == [
        (OTHER, 300, 0x1000, 1, 0, 1, 7), (OTHER, 301, 0x1001, 1, 0, 1, 7),
        (OTHER, 302, 0x1002, 1, 1, 1, 7),
        (OTHER, 0, 0, 0, 1, 1, 3),  # length 0: one bare signalling word
    ]


def test_stores_and_loads_to_memory_channels(seed):
    """A STORE sends its words to the channel (no local write); a LOAD sends one request
    word carrying its MemRead (this tile's position, the destination, the length); a
    LOAD of no words is a fence, one request word too."""
    source = {100 + i: 0x2000 + i for i in range(5)}
    store, load = DmaTarget.STORE, DmaTarget.LOAD
    commands = [
        {"src": 100, "length": 5, "target": store, "channel": 2, "mem_addr": 7000,
         "signal": {"enable": 1, "semaphore": 1}},
        {"dst": 250, "length": 6, "target": load, "channel": 1, "mem_addr": 40,
         "signal": {"enable": 1, "semaphore": 2}, "remote_signal": 1, "remote_semaphore": 4},
        {"dst": 0, "length": 0, "target": load, "channel": 0,
         "signal": {"enable": 0, "semaphore": 0},
         "remote_signal": 1, "remote_semaphore": 6},
    ]
    mem, events = run(commands, source, seed=seed, channels=True)
    assert mem == source  # nothing written here
    layout = MemRead(4)
    request = layout.const({"spad_addr": 250, "x": 1, "y": 1, "length": 6}).as_value().value
    fence = layout.const({"spad_addr": 0, "x": 1, "y": 1, "length": 0}).as_value().value
    assert events["net"] == [(0, 7000 + i, 0x2000 + i, 1, int(i == 4), 0, 0) for i in range(5)] + [
        (0, 40, request, 0, 1, 1, 4), (0, 0, fence, 0, 1, 1, 6)]
    assert events["targets"] == [(store.value, 2)] * 5 + [(load.value, 1), (load.value, 0)]
    assert events["done"] == [(1, 1), (1, 2), (0, 0)] and events["arrival"] == []


def test_position_outside_the_mesh_is_refused():
    with pytest.raises(ValueError, match="outside the 8 x 8 mesh"):
        DmaEngine(8, position=(8, 0))
    with pytest.raises(ValueError, match="outside the 8 x 8 mesh"):
        DmaEngine(8, position=(0.5, 0))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": 3}, "n must be a power of two"),
    ({"n": 8.0}, "n must be a power of two"),
    ({"addr_bits": 0}, "addr_bits must be an integer in \\[1, 16\\]"),
])
def test_impossible_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DmaEngine(**kwargs)
