"""The network interface in the Amaranth simulator: DMA words through a 2 x 2 mesh of
routers and back (unicast packets, multicast, ordering, backpressure, unroutable
words), and malformed packets driven straight into its ejection port."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.lib import data, wiring
from amaranth.sim import Simulator

from rtl.mesh import Mesh
from rtl.network_interface import NetPayload, NetworkInterface, PacketKind, payload_bits
from sim.runner import run_amaranth
from spec.isa import DmaTarget, tile_bit
from spec.noc import MessageClass

# Routers, meshes and NIs that refuse their parameters are, rightly, never elaborated.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")

N, K = 4, 2
MASK = 0xFFFF_FFFF_FFFF_FFFF


class MeshBench(wiring.Component):
    """A k x k mesh with a network interface at every node."""

    def __init__(self, k=K, vcs=2, max_packet=4, sim_gating=False):
        self.mesh = Mesh(k, payload_bits=payload_bits(N), vcs=vcs, depth=4,
                         sim_gating=sim_gating)
        self.nis = [NetworkInterface(N, x, y, k=k, vcs=vcs, max_packet=max_packet,
                                     sim_gating=sim_gating)
                    for y in range(k) for x in range(k)]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mesh = self.mesh
        for node, ni in enumerate(self.nis):
            m.submodules[f"ni{node}"] = ni
            for v in range(len(ni.inject)):
                wiring.connect(m, ni.inject[v], self.mesh.inject[node][v])
                wiring.connect(m, self.mesh.eject[node][v], ni.eject[v])
        return m


def dma(tiles: int, addr: int, values: list[int], semaphore: int = 3) -> list[dict]:
    """The NetWords of one DMA (a signal on the last word); no values: a signal only."""
    if not values:
        return [dict(tiles=tiles, addr=addr, data=0, write=0, last=1, signal=1,
                     semaphore=semaphore)]
    return [dict(tiles=tiles, addr=addr + i, data=v, write=1, last=int(i == len(values) - 1),
                 signal=1, semaphore=semaphore) for i, v in enumerate(values)]


FIELDS = ("tiles", "addr", "data", "write", "last", "signal", "semaphore")


def run_mesh(sources: dict[int, list[dict]], *, expect: int, cycles: int = 1000, seed: int = 0,
             idle=0.0, stall=0.0, **bench_args):
    """Send each node's NetWords, collect every node's tile_in words until ``expect``
    of them arrived (or ``cycles`` passed) and 20 cycles more; return them and the
    NIs' counters and each node's arrival cycles."""
    bench = MeshBench(**bench_args)
    got = {node: [] for node in range(len(bench.nis))}
    counters, arrivals = {}, {node: [] for node in got}
    sim = Simulator(bench)
    sim.add_clock(1e-8)

    # One random stream per process, so that the traffic does not depend on the order
    # the simulator runs processes in.
    def sender(node, words):
        port = bench.nis[node].tile_out
        rng = random.Random(f"{seed} send {node}")

        async def process(ctx):
            for word in words:
                while rng.random() < idle:
                    await ctx.tick()
                for name in FIELDS:
                    ctx.set(getattr(port.payload, name), word[name])
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
                ctx.set(port.valid, 0)
        return process

    def receiver(node):
        port = bench.nis[node].tile_in
        rng = random.Random(f"{seed} receive {node}")

        async def process(ctx):
            cycle = 0
            while True:
                cycle += 1
                ready = rng.random() >= stall
                ctx.set(port.ready, ready)
                _, _, valid, *values = await ctx.tick().sample(
                    port.valid, *(getattr(port.payload, f) for f in FIELDS))
                if valid and ready:
                    word = dict(zip(FIELDS, (int(v) for v in values), strict=True))
                    del word["tiles"]
                    got[node].append(word)
                    arrivals[node].append(cycle)
        return process

    async def watch(ctx):  # until `expect` words arrived (or `cycles`), then 20 more
        for _ in range(cycles):
            if sum(map(len, got.values())) >= expect:
                break
            await ctx.tick()
        await ctx.tick().repeat(20)
        for node, ni in enumerate(bench.nis):
            counters[node] = {name: ctx.get(getattr(ni, name)) for name in
                              ("sent", "received", "dropped_out", "dropped_in", "error")}

    for node, words in sources.items():
        sim.add_testbench(sender(node, words), background=True)
    for node in got:
        sim.add_testbench(receiver(node), background=True)
    sim.add_testbench(watch)
    run_amaranth(sim)
    return got, counters, arrivals


def expected(words: list[dict], packet_words: int = 1) -> list[dict]:
    """What the destination's tile_in shows for one DMA's ``words``: ``last`` ends each
    packet (of ``packet_words`` words), the signal only on the DMA's last word."""
    return [{k: v for k, v in w.items() if k != "tiles"}
            | {"signal": w["signal"] & w["last"],
               "last": int(w["last"] or (i + 1) % packet_words == 0)}
            for i, w in enumerate(words)]


def test_unicast_multicast_signal_and_unroutable_words():
    """One run, four kinds of traffic, each told apart by source:
    node 0: a 10-word DMA to (1, 1), cut into packets of 4 + 4 + 2 flits, after words
    that name no tile or a tile outside the 2 x 2 mesh (dropped and counted);
    node 2: a 3-word multicast DMA to (0, 0), (1, 0), (1, 1) (one flit per word);
    node 3: a DMA of length 0 to (1, 0), one SIGNAL flit."""
    outside = tile_bit(2, 0)  # column 2 of a 2 x 2 mesh
    unroutable = dma(outside, 0, [1, 2]) + dma(0, 0, [3]) + dma(tile_bit(1, 0) | outside, 0, [4])
    unicast = dma(tile_bit(1, 1), 100, [0x1111 * (i + 1) for i in range(10)], semaphore=5)
    multicast = dma(tile_bit(0, 0) | tile_bit(1, 0) | tile_bit(1, 1), 7, [5, 6, 7], semaphore=2)
    signal = dma(tile_bit(1, 0), 0, [], semaphore=9)
    got, counters, _ = run_mesh({0: unroutable + unicast, 2: multicast, 3: signal}, expect=20,
                             max_packet=4)
    from_multicast = expected(multicast)
    assert got[0] == from_multicast
    assert [w for w in got[1] if w["semaphore"] == 2] == from_multicast
    assert [w for w in got[1] if w["semaphore"] == 9] == [
        dict(addr=0, data=0, write=0, last=1, signal=1, semaphore=9)]
    assert [w for w in got[3] if w["semaphore"] == 2] == from_multicast
    assert [w for w in got[3] if w["semaphore"] == 5] == expected(unicast, packet_words=4)
    assert not got[2] and len(got[1]) == 4 and len(got[3]) == 13
    assert counters[0]["dropped_out"] == 4 and counters[0]["error"] == 1
    assert counters[0]["sent"] == 10  # one flit per word
    assert counters[2]["sent"] == 3 and counters[3]["sent"] == 1
    assert counters[3]["received"] == 3 + 3  # packets of 4 + 4 + 2 words, 3 multicasts
    assert all(c["error"] == 0 for node, c in counters.items() if node)


def test_all_to_all_with_backpressure_keeps_order_per_source(seed):
    """Every node sends DMAs to random destinations (some multicast); with idle sources
    and stalled tiles, each destination sees each source's words in order, all of
    them, exactly once."""
    vcs = 4  # two per class: unicast packets spread over the request VCs
    rng = random.Random(vcs + seed)
    sources, want = {}, {node: {} for node in range(K * K)}
    for src in range(K * K):
        words = []
        for d in range(3):
            dsts = rng.sample(range(K * K), rng.choice([1, 1, 2]))
            mask = sum(tile_bit(t % K, t // K) for t in dsts)
            values = [(src << 12) | (d << 8) | i for i in range(rng.randint(1, 6))]
            new = dma(mask, 16 * d, values, semaphore=src)
            words += new
            for t in dsts:
                want[t].setdefault(src, []).extend(expected(new, 3 if len(dsts) == 1 else 1))
        sources[src] = words
    total = sum(len(words) for per in want.values() for words in per.values())
    got, counters, _ = run_mesh(sources, expect=total, seed=vcs + seed, idle=0.3, stall=0.3,
                                vcs=vcs, max_packet=3)
    for node in range(K * K):
        by_source: dict[int, list] = {}
        for word in got[node]:
            src = word["semaphore"] if not word["write"] else word["data"] >> 12
            by_source.setdefault(src, []).append(word)
        assert by_source == want[node], f"node {node}"
    assert all(c["error"] == 0 for c in counters.values())


def test_gated_interfaces_and_mesh_change_nothing(seed):
    """With ``sim_gating`` the interfaces' and the routers' clocks stop while idle: DMAs
    one at a time, with quiet gaps, then all at once with idle sources and stalled
    tiles, arrive as the same words in the same cycles as without gating."""
    rng = random.Random(seed)
    sources = {src: [] for src in range(K * K)}
    for d in range(12):
        src, dsts = rng.randrange(K * K), rng.sample(range(K * K), rng.choice([1, 1, 2]))
        mask = sum(tile_bit(t % K, t // K) for t in dsts)
        sources[src] += dma(mask, 16 * d, [d << 8 | i for i in range(rng.randint(0, 5))])
    total = sum(len(words) for words in sources.values()) * K * K  # an upper bound
    runs = [run_mesh(sources, expect=total, cycles=600, seed=seed, idle=0.9, stall=0.3,
                     sim_gating=gating) for gating in (False, True)]
    assert runs[0] == runs[1]
    assert sum(map(len, runs[0][0].values())) > 12


# --- malformed packets straight into one NI's ejection port ----------------------------


def run_eject(flits: list[dict], *, spad_words=64, max_packet=4, cycles=None):
    ni = NetworkInterface(N, 0, 0, k=K, vcs=2, max_packet=max_packet, spad_words=spad_words)
    got, state = [], {}
    sim = Simulator(ni)
    sim.add_clock(1e-8)

    async def drive(ctx):
        for f in flits:
            port = ni.eject[f.get("vc", 0)]
            payload = NetPayload(N)
            raw = payload.const({
                "data": f.get("data", 0), "addr": f.get("addr", 0),
                "kind": f.get("kind", PacketKind.WRITE), "signal": f.get("signal", 0),
                "semaphore": f.get("semaphore", 0)}).as_value().value
            if "raw_kind" in f:  # an undefined kind
                raw |= f["raw_kind"] << (8 * N + 16)
            ctx.set(port.payload, {"head": f["head"], "tail": f["tail"], "vc": f.get("vc", 0),
                                   "cls": MessageClass.REQUEST, "multicast": 0, "mask": 0,
                                   "dst": {"x": 0, "y": 0}, "payload": raw})
            ctx.set(port.valid, 1)
            await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        await ctx.tick().repeat(cycles or 4 * len(flits) + 20)
        state.update(dropped=ctx.get(ni.dropped_in), received=ctx.get(ni.received),
                     error=ctx.get(ni.error))

    async def collect(ctx):
        ctx.set(ni.tile_in.ready, 1)
        while True:
            _, _, valid, addr, data, last = await ctx.tick().sample(
                ni.tile_in.valid, ni.tile_in.payload.addr, ni.tile_in.payload.data,
                ni.tile_in.payload.last)
            if valid:
                got.append((int(addr), int(data), int(last)))

    sim.add_testbench(drive)
    sim.add_process(collect)
    run_amaranth(sim)
    return got, state


def packet(addr, values, **extra):
    return [dict(head=int(i == 0), tail=int(i == len(values) - 1), addr=addr, data=v, **extra)
            for i, v in enumerate(values)]


def test_malformed_packets_are_dropped_whole():
    good = packet(10, [7, 8])
    flits = (
        packet(0, [1, 2, 3, 4, 5])  # longer than max_packet = 4
        + packet(0, [1, 2])[:1]  # a head, then another head: no tail
        + packet(20, [1])  # (this one is fine: it closes the open packet above)
        + [dict(head=1, tail=0, kind=PacketKind.SIGNAL), dict(head=0, tail=1)]  # 2-flit SIGNAL
        + [dict(head=1, tail=1, raw_kind=3)]  # no such kind
        + packet(62, [1, 2, 3])  # words 62..64 of a 64-word scratchpad
        + good
    )
    got, state = run_eject(flits)
    assert got == [(20, 1, 1), (10, 7, 0), (11, 8, 1)]
    assert state["dropped"] == 5 and state["received"] == 2 and state["error"] == 1


def test_packets_on_two_vcs_are_not_mixed():
    a = packet(0, [1, 2, 3])
    b = [dict(f, vc=1) for f in packet(8, [9, 10])]
    flits = [a[0], b[0], a[1], b[1], a[2]]
    got, state = run_eject(flits)
    assert sorted(got) == [(0, 1, 0), (1, 2, 0), (2, 3, 1), (8, 9, 0), (9, 10, 1)]
    first = [addr for addr, _, _ in got]
    assert first in ([8, 9, 0, 1, 2], [0, 1, 2, 8, 9])  # one packet after the other
    assert state["dropped"] == 0


def test_impossible_parameters_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        NetworkInterface(3)
    with pytest.raises(ValueError, match=r"x must be an integer in \[0, 2\)"):
        NetworkInterface(8, 2, 0, k=2)
    with pytest.raises(ValueError, match="max_packet"):
        NetworkInterface(8, max_packet=0)
    with pytest.raises(ValueError, match="spad_words"):
        NetworkInterface(8, spad_words=0)
    with pytest.raises(ValueError, match="vcs must be even"):
        NetworkInterface(8, vcs=3)


def test_memory_words_become_packets_to_their_channel():
    """With memory channels at (0, 0) and (0, 1): a STORE's words become MEM_WRITE packets
    of at most ``max_packet`` flits to its channel's node, with full memory addresses; a
    LOAD word one MEM_READ flit; a word for a channel the chip lacks is dropped."""
    ni = NetworkInterface(N, 1, 0, k=K, max_packet=4, memory_nodes=((0, 0), (0, 1)))
    layout = NetPayload(N, ni.addr_bits)
    store = [dict(tiles=0, addr=0x12340 + i, data=i + 1, write=1, last=int(i == 5), signal=0,
                  semaphore=0, target=DmaTarget.STORE, channel=1) for i in range(6)]
    load = [dict(tiles=0, addr=0xABCDE, data=0x55, write=0, last=1, signal=1, semaphore=9,
                 target=DmaTarget.LOAD, channel=0)]
    lost = [dict(load[0], channel=2)]
    flits, counters = [], {}
    sim = Simulator(ni)
    sim.add_clock(1e-8)

    async def send(ctx):
        for word in store + load + lost:
            for name, value in word.items():
                ctx.set(getattr(ni.tile_out.payload, name), value)
            ctx.set(ni.tile_out.valid, 1)
            await ctx.tick().until(ni.tile_out.ready)
            ctx.set(ni.tile_out.valid, 0)
        await ctx.tick().repeat(10)
        counters["dropped_out"] = ctx.get(ni.dropped_out)

    async def take(ctx):
        port = ni.inject[0]
        ctx.set(port.ready, 1)
        while True:
            _, _, valid, flit = await ctx.tick().sample(port.valid, port.payload)
            if valid:
                p = data.Const(layout, flit.payload)
                flits.append((flit.head, flit.tail, flit.multicast, (flit.dst.x, flit.dst.y),
                              p.kind, p.addr, p.data, p.signal, p.semaphore))

    sim.add_testbench(send)
    sim.add_testbench(take, background=True)
    run_amaranth(sim)
    write, read = PacketKind.MEM_WRITE, PacketKind.MEM_READ
    assert flits == [(int(i in (0, 4)), int(i in (3, 5)), 0, (0, 1), write, 0x12340 + i, i + 1,
                      0, 0) for i in range(6)] + [(1, 1, 0, (0, 0), read, 0xABCDE, 0x55, 1, 9)]
    assert counters["dropped_out"] == 1
