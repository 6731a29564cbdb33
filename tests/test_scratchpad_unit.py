"""KV scratchpad in the Amaranth simulator at a small size, its ECC logic against
golden.ecc, and its parameter checks."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from golden.ecc import Secded, flip_bits
from rtl import _ecc
from rtl.scratchpad import Scratchpad
from sim.runner import run_amaranth
from tb.scratchpad_tb import (
    APPEND,
    RESET,
    ScratchpadModel,
    kv_traffic,
    owned_addresses,
    pack,
    plain_ports,
    plain_traffic,
    unpack_response,
)

SMALL = {"banks": 2, "depth": 16, "word_bits": 16, "ports": ("a", "b", "kv"),
         "page_size": 2, "token_words": 2, "num_pages": 4, "sequences": 2, "max_pages": 2,
         "fault_injection": True}


@pytest.mark.parametrize("data_bits", [8, 16, 64])
def test_ecc_rtl_matches_golden(data_bits):
    """RTL encoder and decoder against golden.ecc, clean and with one or two flipped bits."""
    code = Secded(data_bits)
    m = Module()
    data_in = Signal(data_bits)
    word_in = Signal(code.code_bits)
    encoded = Signal(code.code_bits)
    m.d.comb += encoded.eq(_ecc.encode(code, data_in))
    syn, parity = _ecc.syndrome(code, word_in)
    data_out, corrected, uncorrectable = _ecc.correct(m, code, word_in, syn, parity)
    rng = np.random.default_rng(data_bits)
    words = [int.from_bytes(rng.bytes(data_bits // 8), "little") for _ in range(12)]

    async def bench(ctx):
        for word in words:
            ctx.set(data_in, word)
            good = int(code.encode([word])[0])
            assert ctx.get(encoded) == good
            cases = [good] + [flip_bits(good, [int(b)]) for b in rng.choice(code.code_bits, 6)]
            cases += [flip_bits(good, rng.choice(code.code_bits, 2, replace=False))
                      for _ in range(6)]
            want = code.decode(cases)
            for i, case in enumerate(cases):
                ctx.set(word_in, case)
                got = (ctx.get(data_out), ctx.get(corrected), ctx.get(uncorrectable))
                assert got == (want[0][i], want[1][i], want[2][i]), f"codeword {case:#x}"

    sim = Simulator(m)
    sim.add_testbench(bench)
    run_amaranth(sim)


def simulate(config: dict, traffic: dict, *, idle: int = 0, stall: int = 0, seed: int = 1,
             times: dict | None = None):
    """Run ``traffic`` through the scratchpad; return (responses per port, model responses).
    ``times``: filled with the cycle each port took each of its responses."""
    sp = Scratchpad(**config)
    model = ScratchpadModel(sp)
    want = {name: [model.kv(r) if name == sp.kv_port else model.plain(r) for r in reqs]
            for name, reqs in traffic.items()}
    got = {name: [] for name in traffic}
    sim = Simulator(sp)
    sim.add_clock(1e-8)
    rng = np.random.default_rng(seed)

    def source(name):
        port = getattr(sp, f"{name}_req")
        layout = sp.kv_request_layout if name == sp.kv_port else sp.request_layout
        gaps = rng.random(len(traffic[name])) < idle / 100

        async def process(ctx):
            for request, gap in zip(traffic[name], gaps, strict=True):
                if gap:
                    ctx.set(port.valid, 0)
                    await ctx.tick()
                ctx.set(port.payload.as_value(), pack(layout, request))
                ctx.set(port.valid, 1)
                await ctx.tick().until(port.ready)
            ctx.set(port.valid, 0)
        return process

    def sink(name):
        port = getattr(sp, f"{name}_resp")
        stalls = rng.random(100000) < stall / 100

        async def process(ctx):
            cycle = 0
            while len(got[name]) < len(traffic[name]):
                ready = not stalls[cycle]
                ctx.set(port.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(port.valid,
                                                               port.payload.as_value())
                if valid and ready:
                    got[name].append(unpack_response(sp.response_layout, payload))
                    if times is not None:
                        times.setdefault(name, []).append(cycle)
                cycle += 1
                assert cycle < 50 * len(traffic[name]) + 200, f"{name}: no progress"
            ctx.set(port.ready, 1)
            for _ in range(10):
                _, _, valid = await ctx.tick().sample(port.valid)
                assert not valid, f"{name}: an extra response"
        return process

    for name in traffic:
        sim.add_testbench(source(name))
        sim.add_testbench(sink(name))
    run_amaranth(sim)
    return got, want, model, sp


@pytest.mark.parametrize(("idle", "stall"), [(0, 0), (85, 30)])
def test_a_gated_clock_changes_no_cycle(idle, stall, seed):
    """With ``gate_clock`` (simulation only) the scratchpad's clock ticks only in cycles
    that can change it: random traffic on every port, with long idle gaps (the clock
    then stops) and responses held back, gives the same responses in the same cycles
    as the ungated scratchpad, and the model's."""
    sp = Scratchpad(**SMALL)
    rng = np.random.default_rng(idle + 3 + 100 * seed)
    model = ScratchpadModel(sp)
    traffic = {name: plain_traffic(sp, rng, name, 40, faults=True) for name in plain_ports(sp)}
    traffic["kv"] = kv_traffic(sp, rng, 80, model)
    runs = []
    for gate in (False, True):
        times: dict = {}
        got, want, _, built = simulate(SMALL | {"gate_clock": gate}, traffic, idle=idle,
                                       stall=stall, seed=seed + 11, times=times)
        assert built.gate_clock is gate
        assert got == want
        runs.append(times)
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("idle", "stall"), [(0, 0), (30, 50)])
def test_random_traffic_matches_model(idle, stall, seed):
    sp = Scratchpad(**SMALL)
    rng = np.random.default_rng(idle + stall + 100 * seed)
    model = ScratchpadModel(sp)
    traffic = {name: plain_traffic(sp, rng, name, 60, faults=True) for name in plain_ports(sp)}
    # Every seed sees both ECC events: a word written with one, then two, flipped bits
    # and read back, at the end of a plain port's random traffic.
    port = plain_ports(sp)[0]
    word = owned_addresses(sp, port)[0]
    for flip in (0b1, 0b11):
        traffic[port] += [{"addr": word, "write": 1, "data": 5, "flip": flip},
                          {"addr": word, "write": 0}]
    traffic["kv"] = kv_traffic(sp, rng, 150, model)
    # ... and an append to a sequence just reset, whose first page is unmapped.
    traffic["kv"] += [{"op": RESET, "seq": 0, "index": 0, "phys": 0},
                      {"op": APPEND, "seq": 0, "word": 0, "last": 1, "data": 1}]
    got, want, model, _ = simulate(SMALL, traffic, idle=idle, stall=stall, seed=idle + 7 + seed)
    for name in traffic:
        for i, (g, w) in enumerate(zip(got[name], want[name], strict=True)):
            assert g == w, f"{name} response {i} to {traffic[name][i]}: got {g}, want {w}"
    statuses = [r["status"] for reqs in want.values() for r in reqs]
    for flag in ("corrected", "uncorrectable", "bad_address", "kv_full", "unmapped",
                 "bad_page", "bad_request"):
        assert any(s[flag] for s in statuses), f"the traffic never produced {flag}"


@pytest.mark.parametrize(("b_addr", "conflicts"), [(2, 1), (3, 0)])
def test_bank_conflicts_are_counted(b_addr, conflicts):
    """Ports a and b read at once: the same bank (0 and 2) costs one of them a cycle,
    counted in its ``<port>_conflicts``; different banks (0 and 3) cost nothing."""
    sp = Scratchpad(**SMALL)
    sim = Simulator(sp)
    sim.add_clock(1e-8)
    counts = {}

    async def bench(ctx):
        for name, addr in (("a", 0), ("b", b_addr)):
            ctx.set(getattr(sp, f"{name}_req").payload.as_value(),
                    pack(sp.request_layout, {"addr": addr, "write": 0, "data": 0}))
            ctx.set(getattr(sp, f"{name}_req").valid, 1)
            ctx.set(getattr(sp, f"{name}_resp").ready, 1)
        waiting = {"a", "b"}
        while waiting:
            sampled = await ctx.tick().sample(sp.a_req.ready, sp.b_req.ready)
            for name, ready in zip("ab", sampled[2:], strict=True):
                if ready and name in waiting:
                    waiting.discard(name)
                    ctx.set(getattr(sp, f"{name}_req").valid, 0)
        await ctx.tick().repeat(2)
        counts.update({name: ctx.get(getattr(sp, f"{name}_conflicts")) for name in "ab"})

    sim.add_testbench(bench)
    run_amaranth(sim)
    assert counts["a"] + counts["b"] == conflicts, counts


@pytest.mark.parametrize("gate_clock", [False, True])
def test_kv_latency_and_plain_latency(gate_clock):
    """A lone read: response valid ``latency`` cycles after acceptance (kv_latency for KV),
    also with the clock gated (it stops between the requests, and must tick through
    each one's pipeline)."""
    sp = Scratchpad(**SMALL, gate_clock=gate_clock)
    sim = Simulator(sp)
    sim.add_clock(1e-8)
    seen = {}

    async def bench(ctx):
        for name in ("a", "kv"):
            ctx.set(getattr(sp, f"{name}_resp").ready, 1)
        for name, layout, request in (("a", sp.request_layout, {"addr": 3, "write": 0}),
                                      ("kv", sp.kv_request_layout, {"op": 2, "seq": 0,
                                                                    "index": 0, "phys": 1})):
            port = getattr(sp, f"{name}_req")
            ctx.set(port.payload.as_value(), pack(layout, request))
            ctx.set(port.valid, 1)
            await ctx.tick()
            ctx.set(port.valid, 0)
            for cycle in range(1, 12):
                if ctx.get(getattr(sp, f"{name}_resp").valid):
                    seen[name] = cycle
                    break
                await ctx.tick()

    sim.add_testbench(bench)
    run_amaranth(sim)
    assert seen == {"a": sp.latency, "kv": sp.kv_latency}
    assert (sp.latency, sp.kv_latency) == (5, 6)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"banks": 3}, "banks must be a power of two"),
    ({"banks": 0}, "banks must be a power of two"),
    ({"depth": 100}, "depth must be a power of two"),
    ({"word_bits": 0}, "word_bits"),
    ({"ports": ()}, "1 to 16 ports"),
    ({"ports": ("a", "a", "kv")}, "unique"),
    ({"ports": ("a", "9x", "kv")}, "identifier"),
    ({"kv_port": "zz"}, "not one of the ports"),
    ({"page_size": 3}, "page_size"),
    ({"token_words": 0}, "token_words"),
    ({"num_pages": 0}, "num_pages"),
    ({"sequences": 0}, "sequences"),
    ({"num_pages": 1000}, "do not fit"),
    ({"kv_base": 3}, "kv_base"),
    ({"kv_base": 1000}, "kv_base"),
    ({"addr_bits": 4}, "addr_bits"),
    ({"sequences": 64, "max_pages": 64}, "block table"),
])
def test_impossible_parameters_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Scratchpad(**(SMALL | kwargs))


def test_defaults_build_and_fit():
    sp = Scratchpad()
    assert sp.code.code_bits == 72 and sp.words == 1024
    assert sp.kv_base == 1024 - 16 * 4
    assert [n for n in sp.signature.members] == [
        "tc_req", "tc_resp", "vu_req", "vu_resp", "ni_req", "ni_resp", "kv_req", "kv_resp",
        "corrected_count", "uncorrectable_count", "ecc_error", "tc_conflicts", "vu_conflicts",
        "ni_conflicts", "kv_conflicts", "accesses"]
