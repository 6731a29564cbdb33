"""The memory channel in the Amaranth simulator: writes and reads against a flit-level
model (random traffic with idle requesters and stalled replies, fences, malformed
packets), its latency and bandwidth, and its parameter checks."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from amaranth import Module
from amaranth.lib import data, wiring
from amaranth.sim import Simulator

from rtl.memory_channel import MIN_LATENCY, MemoryChannel
from rtl.mesh import Mesh
from rtl.network_interface import PacketKind
from sim.runner import run_amaranth
from spec.memory import H100_BALANCE, machine_balance_bandwidth
from spec.noc import MessageClass

pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")

N, K = 4, 2


def write(addr: int, values: list[int]) -> list[dict]:
    """The flits of a MEM_WRITE packet."""
    return [dict(head=int(i == 0), tail=int(i == len(values) - 1), kind=PacketKind.MEM_WRITE,
                 addr=addr, data=v, signal=0, semaphore=0) for i, v in enumerate(values)]


def read(channel: MemoryChannel, addr: int, length: int, x: int, y: int, spad: int,
         semaphore: int = 3, signal: int = 1) -> list[dict]:
    """The single flit of a MEM_READ request."""
    request = channel.read_layout.const({"spad_addr": spad, "x": x, "y": y, "length": length})
    return [dict(head=1, tail=1, kind=PacketKind.MEM_READ, addr=addr,
                 data=request.as_value().value, signal=signal, semaphore=semaphore)]


def model(channel: MemoryChannel, flits: list[dict]) -> tuple[list[dict], dict]:
    """The reply flits and the counters the documented rules give for ``flits``."""
    words, k, mp = channel.words, channel.config.k, channel.max_packet
    ops, counts = [], dict(reads=0, writes=0, requests=0, dropped=0)
    writing = skipping = False
    next_addr = 0
    for f in flits:
        if f["head"]:
            if writing or skipping:
                counts["dropped"] += 1
            writing = skipping = False
            if f["kind"] == PacketKind.MEM_WRITE:
                writing, next_addr = not f["tail"], f["addr"] + 1
                if f["addr"] < words:
                    ops.append(("write", f["addr"], f["data"]))
                else:
                    counts["dropped"] += 1
                continue
            if f["kind"] == PacketKind.MEM_READ and f["tail"]:
                r = data.Const(channel.read_layout, f["data"] & (1 << channel.read_layout.size) - 1)
                if (f["addr"] + r.length <= words and r.x < k and r.y < k
                        and r.spad_addr + r.length <= 1 << 16):
                    ops.append(("read", f, r))
                    counts["requests"] += 1
                    continue
            counts["dropped"] += 1
            skipping = not f["tail"]
        elif writing:
            writing = not f["tail"]
            if next_addr < words:
                ops.append(("write", next_addr, f["data"]))
            else:
                counts["dropped"] += 1
            next_addr += 1
        elif skipping:
            skipping = not f["tail"]
        else:
            counts["dropped"] += 1
    store, replies = {}, []
    for op in ops:
        if op[0] == "write":
            store[op[1]] = op[2]
            counts["writes"] += 1
            continue
        _, f, r = op
        if r.length == 0:
            replies.append(dict(head=1, tail=1, x=r.x, y=r.y, kind=PacketKind.SIGNAL,
                                signal=f["signal"], semaphore=f["semaphore"]))
        for i in range(r.length):
            last = i == r.length - 1
            replies.append(dict(head=int(i % mp == 0), tail=int(i % mp == mp - 1 or last),
                                x=r.x, y=r.y, kind=PacketKind.WRITE, addr=r.spad_addr + i,
                                data=store.get(f["addr"] + i, 0),
                                signal=int(f["signal"] and last), semaphore=f["semaphore"]))
        counts["reads"] += r.length
    return replies, counts


def run_channel(channel: MemoryChannel, flits: list[dict], *, expect: int, idle=0.0,
                stall=0.0, seed=0, cycles=20_000, host=(), after_host=()):
    """Send ``flits`` into ``req``, take ``resp`` until ``expect`` flits came (or
    ``cycles`` passed) and until the queue has drained; returns the replies (each with the cycle it
    was taken), the cycles each request flit was taken, and the counters. ``host``:
    (address, word) pairs written through the host port meanwhile; ``after_host``: flits
    sent once they all have been (after ``flits``)."""
    replies, accepted, counters = [], [], {}
    sim = Simulator(channel)
    sim.add_clock(1e-8)
    layout = channel.payload_layout
    host_done = []

    async def host_writer(ctx):
        for addr, word in host:
            ctx.set(channel.host.payload, {"addr": addr, "data": word})
            ctx.set(channel.host.valid, 1)
            await ctx.tick().until(channel.host.ready)
        ctx.set(channel.host.valid, 0)
        host_done.append(True)

    async def requester(ctx):
        rng = random.Random(f"{seed} requests")
        cycle = 0
        for i, f in enumerate([*flits, *after_host]):
            while i == len(flits) and not host_done:
                await ctx.tick()
                cycle += 1
            while rng.random() < idle:
                await ctx.tick()
                cycle += 1
            payload = layout.const({name: f[name] for name in
                                    ("kind", "addr", "data", "signal", "semaphore")})
            ctx.set(channel.req.payload, {"head": f["head"], "tail": f["tail"],
                                          "payload": payload.as_value().value})
            ctx.set(channel.req.valid, 1)
            while True:
                _, _, ready = await ctx.tick().sample(channel.req.ready)
                cycle += 1
                if ready:
                    break
            accepted.append(cycle - 1)
            ctx.set(channel.req.valid, 0)

    async def replier(ctx):
        rng = random.Random(f"{seed} replies")
        cycle = 0
        while True:
            ready = rng.random() >= stall
            ctx.set(channel.resp.ready, ready)
            _, _, valid, flit = await ctx.tick().sample(channel.resp.valid, channel.resp.payload)
            if valid and ready:
                assert flit.cls == MessageClass.RESPONSE and not flit.multicast
                p = data.Const(layout, flit.payload)
                replies.append(dict(head=flit.head, tail=flit.tail, x=flit.dst.x, y=flit.dst.y,
                                    kind=p.kind, addr=p.addr, data=p.data, signal=p.signal,
                                    semaphore=p.semaphore, cycle=cycle))
            cycle += 1

    async def watch(ctx):
        for _ in range(cycles):
            if len(replies) >= expect and len(accepted) == len(flits) + len(after_host):
                break
            await ctx.tick()
        # Then long enough for a full queue of writes to drain at the bandwidth.
        per_word = -(-channel.word_cost // channel.bandwidth.numerator)
        await ctx.tick().repeat(channel.queue * per_word + channel.latency + 50)
        for name in ("reads", "writes", "requests", "dropped", "error"):
            counters[name] = ctx.get(getattr(channel, name))

    sim.add_testbench(host_writer, background=True)
    sim.add_testbench(requester, background=True)
    sim.add_testbench(replier, background=True)
    sim.add_testbench(watch)
    run_amaranth(sim)
    return replies, accepted, counters


def check(channel, flits, **run_args):
    """Run ``flits``; the replies and counters must be the model's (a SIGNAL reply's
    address and data are not looked at)."""
    expected, counts = model(channel, flits)
    replies, _, counters = run_channel(channel, flits, expect=len(expected), **run_args)
    assert len(replies) == len(expected), f"{len(replies)} reply flits, {len(expected)} expected"
    assert [{f: r[f] for f in e} for r, e in zip(replies, expected, strict=True)] == expected
    assert counters == {**counts, "error": int(counts["dropped"] > 0)}
    return replies


def test_words_written_are_read_back_in_packets_to_the_requester():
    channel = MemoryChannel(N, k=K, words=256, bytes_per_cycle=N, latency=5, max_packet=4)
    flits = (write(10, [0x11, 0x22, 0x33, 0x44, 0x55, 0x66]) + read(channel, 10, 6, 1, 0, 100)
             + read(channel, 12, 1, 0, 1, 7, semaphore=9) + write(200, [0xDEADBEEF])
             + read(channel, 199, 2, 1, 1, 50, signal=0))
    replies = check(channel, flits)
    assert [r["data"] for r in replies] == [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x33, 0,
                                            0xDEADBEEF]
    # 6 words in packets of at most 4: a head at words 0 and 4, the signal on the last.
    assert [(r["head"], r["tail"], r["signal"]) for r in replies[:6]] == [
        (1, 0, 0), (0, 0, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0), (0, 1, 1)]


def test_a_read_of_length_zero_is_a_fence_after_earlier_writes():
    channel = MemoryChannel(N, k=K, words=256, bytes_per_cycle=Fraction(1, 2), latency=5)
    flits = write(0, list(range(1, 9))) + read(channel, 0, 0, 1, 1, 0, semaphore=5)
    replies, accepted, _ = run_channel(channel, flits, expect=1)
    assert [(r["kind"], r["semaphore"], r["signal"]) for r in replies] == [
        (PacketKind.SIGNAL, 5, 1)]
    # Eight words at half a byte per cycle (8 cycles a word): the fence waits for them.
    assert replies[0]["cycle"] - accepted[0] >= 7 * 8


def test_the_host_writes_the_store_beside_the_requests():
    # Host words stream in while MEM_WRITE packets take the store at its full bandwidth
    # (the requests first, the host in the cycles between), one host word past the store;
    # then both regions read back. The host's words are outside the `writes` count.
    channel = MemoryChannel(N, k=K, words=256, bytes_per_cycle=N, latency=5, max_packet=4)
    requested = [0x1000 + i for i in range(40)]
    host = [(100 + i, 0x2000 + i) for i in range(60)] + [(256, 0xBAD)]
    flits = write(0, requested[:20]) + write(20, requested[20:])
    reads = read(channel, 0, 40, 1, 0, 0) + read(channel, 100, 60, 0, 1, 0)
    replies, _, counters = run_channel(channel, flits, expect=100, host=host,
                                       after_host=reads)
    assert [r["data"] for r in replies] == requested + [w for _, w in host[:-1]]
    assert counters == dict(reads=100, writes=40, requests=2, dropped=1, error=1)


def test_random_traffic_matches_the_model(seed):
    """Writes, reads, fences and malformed packets, requests idle and replies stalled at
    random, on four channels of different queues, packet lengths, latencies and
    bandwidths: every reply flit as the model says, in order, nothing lost or extra."""
    for variant in range(4):
        rng = random.Random(f"{seed} {variant}")
        channel = MemoryChannel(N, k=K, words=64,
                                bytes_per_cycle=Fraction(rng.choice([1, 3, 4]), 2),
                                latency=rng.choice([5, 6, 20]), queue=rng.choice([2, 8]),
                                max_packet=rng.choice([1, 3, 8]))
        flits = []
        for _ in range(60):
            choice = rng.random()
            if choice < 0.4:
                flits += write(rng.randrange(70), [rng.getrandbits(8 * N)
                                                   for _ in range(rng.randint(1, 6))])
            elif choice < 0.8:
                flits += read(channel, rng.randrange(66), rng.randint(0, 9), rng.randrange(3),
                              rng.randrange(3), rng.randrange(1 << 16), rng.randrange(16),
                              rng.randint(0, 1))
            else:  # malformed: a tile's kind, a read in two flits, a lone body flit
                flits += rng.choice([
                    write(0, [1, 2])[:1], [dict(write(0, [1])[0], kind=PacketKind.WRITE)],
                    [dict(f, tail=0) for f in read(channel, 0, 1, 0, 0, 0)]
                    + write(0, [5, 6])[1:], write(3, [7, 8])[1:]])
        check(channel, flits, idle=0.3, stall=0.4, seed=f"{seed} {variant}")


def test_zero_load_latency_and_bandwidth():
    """A one-word read's first flit leaves ``latency`` cycles after the request was
    taken; a long read moves its words at the bandwidth (7/8 byte a cycle: a 4-byte word
    every 32/7 cycles)."""
    for latency in (MIN_LATENCY, 9, 40):
        channel = MemoryChannel(N, k=K, words=1024, bytes_per_cycle=N, latency=latency)
        replies, accepted, _ = run_channel(channel, read(channel, 5, 1, 0, 0, 0), expect=1)
        assert replies[0]["cycle"] - accepted[0] == latency
    channel = MemoryChannel(N, k=K, words=1024, bytes_per_cycle=Fraction(7, 8), latency=5)
    replies, _, counters = run_channel(channel, read(channel, 0, 1000, 1, 1, 0), expect=1000)
    assert counters["reads"] == 1000
    span = replies[-1]["cycle"] - replies[0]["cycle"]
    assert abs(span - 999 * Fraction(32, 7)) <= 1, span


def test_default_bandwidth_is_the_h100_machine_balance():
    assert round(float(H100_BALANCE)) == 591
    assert machine_balance_bandwidth(8, 4) == Fraction(7, 8)  # 512 ops / 591 = 0.87 B
    assert MemoryChannel(8).bandwidth == Fraction(7, 8)
    assert machine_balance_bandwidth(8, 16) == Fraction(55, 16)  # 2048 / 591 = 3.47 B


@pytest.mark.parametrize("args, message", [
    (dict(n=2), "N must be at least 4"),
    (dict(words=0), "words must be"),
    (dict(words=1 << 17, addr_bits=16), "words must be"),
    (dict(bytes_per_cycle=0), "more than 0"),
    (dict(bytes_per_cycle=9), "at most one 8-byte word"),
    (dict(bytes_per_cycle=Fraction(1, 300)), "denominator"),
    (dict(bytes_per_cycle="fast"), "number of bytes per cycle"),
    (dict(latency=MIN_LATENCY - 1), "latency must be"),
    (dict(queue=1), "queue must be"),
    (dict(max_packet=0), "max_packet must be"),
])
def test_bad_parameters_are_refused(args, message):
    n = args.pop("n", 8)
    with pytest.raises(ValueError, match=message):
        MemoryChannel(n, **args)


class ChannelOnMesh(wiring.Component):
    """A 2 x 2 mesh with the channel at node ``node`` (its requests off the node's
    request VC, its replies onto the response VC); the other nodes' local ports are the
    testbench's."""

    def __init__(self, channel: MemoryChannel, node: int):
        self.channel, self.node = channel, node
        self.mesh = Mesh(K, payload_bits=channel.config.payload_bits, vcs=2, depth=4)
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mesh, m.submodules.channel = self.mesh, self.channel
        request, response = (self.channel.config.class_vcs(c)[0] for c in MessageClass)
        wiring.connect(m, self.mesh.eject[self.node][request], self.channel.req)
        wiring.connect(m, self.channel.resp, self.mesh.inject[self.node][response])
        return m


def test_requests_from_every_tile_over_the_mesh():
    """Three nodes write their own regions and read them back through a 2 x 2 mesh,
    idle and stalled at random: each gets exactly its replies, in order, on the
    response class."""
    channel = MemoryChannel(N, k=K, words=512, bytes_per_cycle=Fraction(3, 2), latency=12)
    bench = ChannelOnMesh(channel, node=1)
    rng = random.Random(7)
    sources, expected = {}, {}
    for node in (0, 2, 3):
        x, y, base = node % K, node // K, node * 100
        flits = []
        for _ in range(12):
            if rng.random() < 0.5:
                flits += write(base + rng.randrange(50), [rng.getrandbits(8 * N)
                                                          for _ in range(rng.randint(1, 5))])
            else:
                flits += read(channel, base + rng.randrange(50), rng.randint(0, 12), x, y,
                              rng.randrange(1 << 16), rng.randrange(16))
        sources[node], expected[node] = flits, model(channel, flits)[0]
    got = {node: [] for node in sources}
    layout, request, response = channel.payload_layout, *(
        channel.config.class_vcs(c)[0] for c in MessageClass)
    sim = Simulator(bench)
    sim.add_clock(1e-8)

    def requester(node):
        port = bench.mesh.inject[node][request]
        source = random.Random(f"send {node}")

        async def process(ctx):
            for f in sources[node]:
                while source.random() < 0.3:
                    await ctx.tick()
                payload = layout.const({name: f[name] for name in
                                        ("kind", "addr", "data", "signal", "semaphore")})
                ctx.set(port.payload, {"head": f["head"], "tail": f["tail"],
                                       "cls": MessageClass.REQUEST, "dst": {"x": 1, "y": 0},
                                       "payload": payload.as_value().value})
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
        return process

    def receiver(node):
        port = bench.mesh.eject[node][response]
        stall = random.Random(f"receive {node}")

        async def process(ctx):
            while True:
                ready = stall.random() >= 0.3
                ctx.set(port.ready, ready)
                _, _, valid, flit = await ctx.tick().sample(port.valid, port.payload)
                if valid and ready:
                    p = data.Const(layout, flit.payload)
                    got[node].append(dict(head=flit.head, tail=flit.tail, x=flit.dst.x,
                                          y=flit.dst.y, kind=p.kind, addr=p.addr, data=p.data,
                                          signal=p.signal, semaphore=p.semaphore))
        return process

    async def watch(ctx):
        for _ in range(20_000):
            if all(len(got[n]) >= len(expected[n]) for n in got):
                break
            await ctx.tick()
        await ctx.tick().repeat(50)

    for node in sources:
        sim.add_testbench(requester(node), background=True)
        sim.add_testbench(receiver(node), background=True)
    sim.add_testbench(watch)
    run_amaranth(sim)
    assert sum(map(len, expected.values())) > 40
    for node, replies in got.items():
        assert len(replies) == len(expected[node]), node
        assert [{f: r[f] for f in e} for r, e in zip(replies, expected[node], strict=True)] \
            == expected[node], node


def test_the_memory_port_serves_request_vcs_in_turn():
    """Two request VCs (4 VCs in all) both offering memory packets back to back: the
    channel takes them in turn, one whole packet at a time (a write of three flits is
    never interleaved), never only the lower VC; other packets go on to the tile."""
    from rtl.memory_channel import MemoryPort
    from rtl.network_interface import NetPayload, payload_bits
    from spec.noc import NocConfig

    config = NocConfig(k=K, payload_bits=payload_bits(N), vcs=4, depth=4)
    layout = NetPayload(N)
    port = MemoryPort(config, layout)
    assert len(port.eject) == 2
    offered = {0: write(0, [1, 2, 3]) * 4 + [dict(head=1, tail=1, kind=PacketKind.WRITE,
                                                   addr=0, data=9, signal=0, semaphore=0)],
               1: write(8, [4]) * 4}
    taken, to_tile = [], []
    sim = Simulator(port)
    sim.add_clock(1e-8)

    def source(v):
        async def bench(ctx):
            for f in offered[v]:
                payload = layout.const({name: f[name] for name in
                                        ("kind", "addr", "data", "signal", "semaphore")})
                ctx.set(port.eject[v].payload, {"head": f["head"], "tail": f["tail"],
                                                "payload": payload.as_value().value})
                ctx.set(port.eject[v].valid, 1)
                await ctx.tick().until(port.eject[v].ready)
            ctx.set(port.eject[v].valid, 0)
        return bench

    async def watch(ctx):
        ctx.set(port.req.ready, 1)
        for v in range(2):
            ctx.set(port.tile[v].ready, 1)
        cycles = 0
        async for _, _, req_valid, req, tile0 in ctx.tick().sample(
                port.req.valid, port.req.payload, port.tile[0].valid):
            if req_valid:
                taken.append((data.Const(layout, req.payload).addr, req.head, req.tail))
            to_tile.append(tile0)
            cycles += 1
            if cycles == 40:
                break

    for v in (0, 1):
        sim.add_testbench(source(v), background=True)
    sim.add_testbench(watch)
    run_amaranth(sim)
    packets = [addr for addr, head, _ in taken if head]
    # Whole packets: a head of VC 0's write is followed by its two other flits.
    for i, (addr, head, _) in enumerate(taken):
        if head and addr == 0:
            assert [t[1] for t in taken[i + 1:i + 3]] == [0, 0]
    assert packets == [8, 0, 8, 0, 8, 0, 8, 0]  # VC 1 first (after the reset owner 0)
    assert len(taken) == 16 and sum(to_tile) == 1  # the WRITE packet went to the tile
