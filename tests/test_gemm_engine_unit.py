"""The GEMM engine in the Amaranth simulator: a modelled scratchpad (random latency and
ready), the real accumulator memory, every operand layout, the accumulate mode and A
joined from two limb regions."""

from __future__ import annotations

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from golden.gemm import wrap
from rtl.accumulator import AccumulatorMemory
from rtl.gemm_engine import GemmEngine, OperandStreamer
from sim.runner import run_amaranth

LANE = 48


class Bench(wiring.Component):
    """The engine wired to an accumulator memory with a probe read port."""

    def __init__(self, n, depth, gated=False):
        self.engine = GemmEngine(n, acc_depth=depth, gate_core_clock=gated)
        self.acc = AccumulatorMemory(n, depth, read_ports=("gemm", "probe"), writers=("gemm",))
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine, m.submodules.acc = e, acc = self.engine, self.acc
        wiring.connect(m, e.acc_w, acc.gemm)
        m.d.comb += [acc.gemm_addr.eq(e.acc_addr), e.acc_data.eq(acc.gemm_data)]
        return m


def place(a: np.ndarray, layout: int, n: int) -> list[np.ndarray]:
    """Words (n int8 each) of operand ``a`` (extent x k) in the block (0), row (1) or
    row-major (2) layout."""
    extent, k = a.shape
    words = []
    if layout == 2:  # word i*⌈k⌉ + c = a[i, c*n : c*n + n]
        for i in range(extent):
            for c in range(-(-k // n)):
                w = np.zeros(n, np.int8)
                chunk = a[i, c * n:(c + 1) * n]
                w[:chunk.size] = chunk
                words.append(w)
    elif layout:  # word c*extent + i = a[i, c*n : c*n + n]
        for c in range(-(-k // n)):
            for i in range(extent):
                w = np.zeros(n, np.int8)
                chunk = a[i, c * n:(c + 1) * n]
                w[:chunk.size] = chunk
                words.append(w)
    else:  # block t, word kk = a[t*n : t*n + n, kk] (padding rows random)
        for t in range(-(-extent // n)):
            for kk in range(k):
                col = a[t * n:(t + 1) * n, kk]
                w = np.zeros(n, np.int8)
                w[:col.size] = col
                words.append(w)
    return words


def to_int(word: np.ndarray) -> int:
    return int.from_bytes(word.astype(np.int8).tobytes(), "little")


def reference(a, b, n, c_old=None, shift=0):
    """C tiles (row-tile-major, n rows each) as an (entries, n) array."""
    m, p = a.shape[0], b.shape[1]
    rt, ct = -(-m // n), -(-p // n)
    prod = wrap(a.astype(np.int64) @ b.astype(np.int64), 32)
    full = np.zeros((rt * n, ct * n), np.int64)
    full[:m, :p] = prod
    tiles = np.concatenate([full[i * n:(i + 1) * n, j * n:(j + 1) * n]
                            for i in range(rt) for j in range(ct)])
    if c_old is not None:
        tiles = wrap((c_old << shift) + tiles, LANE)
    return tiles


def run(n, gemms, *, seed=0, depth=128, stall=0.3, bad=frozenset(), gated=False, gaps=None,
        timeline=None):
    """Run ``gemms`` (dicts of GemmArgs fields + operand arrays) back to back; return
    the accumulator contents, done signals and the error flag. A read of an address in
    ``bad`` returns 0 with the ``uncorrectable`` status (a double-bit ECC error).
    ``gated``: the tensor core's clock gated while it is quiet; ``gaps``: idle cycles
    before each command; ``timeline`` (a list): gets each done's cycle."""
    bench = Bench(n, depth, gated)
    engine = bench.engine
    spad: dict[int, int] = {}
    commands = []
    for g in gemms:
        a_layout = g.get("a_rows", 0) * (1 + g.get("a_row_major", 0))  # 0 ignores row-major
        stride = 0 if g.get("b_rows") else g.get("b_stride", 0)
        regions = [(g["a"], place(g["A"], a_layout, n))]
        if stride:  # B row after row, rows `stride` words apart (the gaps left unwritten)
            width = -(-g["B"].shape[1] // n)
            rows = place(g["B"], 2, n)
            for kk in range(g["B"].shape[0]):
                regions.append((g["b"] + kk * stride, rows[kk * width:(kk + 1) * width]))
        else:
            regions.append((g["b"], place(g["B"].T, g.get("b_rows", 0), n)))
        if "A_lo" in g:
            regions.append((g["a_lo"], place(g["A_lo"], a_layout, n)))
        for base, words in regions:
            for i, w in enumerate(words):
                spad[base + i] = to_int(w)
        fields = {k: v for k, v in g.items() if k not in ("A", "B", "A_lo")}
        fields.update(m=g["A"].shape[0], k=g["A"].shape[1], p=g["B"].shape[1])
        commands.append(fields)
    dones, result = [], {}
    sim = Simulator(bench)
    sim.add_clock(1e-8)

    async def commander(ctx):
        for fields, gap in zip(commands, gaps or [0] * len(commands), strict=True):
            if gap:
                await ctx.tick().repeat(gap)
            for name, value in fields.items():
                if name == "signal":
                    ctx.set(engine.cmd.payload.signal.enable, value["enable"])
                    ctx.set(engine.cmd.payload.signal.semaphore, value["semaphore"])
                else:
                    ctx.set(getattr(engine.cmd.payload, name), value)
            ctx.set(engine.cmd.valid, 1)
            await ctx.tick().until(engine.cmd.ready)
            ctx.set(engine.cmd.valid, 0)
            for name in ("a_rows", "b_rows", "accumulate", "acc_shift", "a_limbs",
                         "a_row_major", "b_stride"):
                ctx.set(getattr(engine.cmd.payload, name), 0)

    def scratchpad(req, resp, index):
        # A random stream per port: its draws depend only on its own requests, so the
        # order in which the simulator runs the ports' processes changes nothing.
        rng = np.random.default_rng([seed, index])

        async def port(ctx):
            pending = []  # (due cycle, data)
            cycle = 0
            while True:
                ready = rng.random() >= stall and len(pending) < 6
                ctx.set(req.ready, ready)
                head = pending and pending[0][0] <= cycle
                ctx.set(resp.valid, bool(head))
                if head:
                    ctx.set(resp.payload.data, pending[0][1])
                ctx.set(resp.payload.status, {"uncorrectable": bool(head and pending[0][2])})
                _, _, valid, addr, resp_ready = await ctx.tick().sample(
                    req.valid, req.payload.addr, resp.ready)
                if head and resp_ready:
                    pending.pop(0)
                if ready and valid:
                    assert addr in spad, f"read of unwritten word {addr}"
                    failed = addr in bad
                    pending.append((cycle + 5 + int(rng.integers(3)), 0 if failed else spad[addr],
                                    failed))
                cycle += 1
        return port

    async def watcher(ctx):
        ctx.set(engine.done.ready, 1)
        for cycle in range(20000):  # watchdog: a hung engine fails the assertion below
            if len(dones) == len(commands):
                break
            _, _, valid, enable, sem = await ctx.tick().sample(
                engine.done.valid, engine.done.payload.enable, engine.done.payload.semaphore)
            if valid:
                dones.append((enable, sem))
                if timeline is not None:
                    timeline.append(cycle)
        await ctx.tick().repeat(3)
        for entry in range(depth):
            ctx.set(bench.acc.probe_addr, entry)
            await ctx.tick()
            result[entry] = [int(x) for x in ctx.get(bench.acc.probe_data)]
        result["error"] = ctx.get(engine.error)

    sim.add_testbench(commander)
    sim.add_process(scratchpad(engine.a_req, engine.a_resp, 0))
    sim.add_process(scratchpad(engine.a_lo_req, engine.a_lo_resp, 1))
    sim.add_process(scratchpad(engine.b_req, engine.b_resp, 2))
    sim.add_testbench(watcher)
    run_amaranth(sim)
    assert len(dones) == len(commands), "not every GEMM finished"
    acc = np.array([result[e] for e in range(depth)], np.int64)
    return acc, dones, result["error"]


def operands(rng, m, k, p):
    return (rng.integers(-128, 128, (m, k), dtype=np.int64).astype(np.int8),
            rng.integers(-128, 128, (k, p), dtype=np.int64).astype(np.int8))


#: A's layouts: block (a_rows 0; the row-major flag alone changes nothing), chunk-major
#: rows (a_rows 1), row-major rows.
A_LAYOUTS = {"block": {"a_rows": 0, "a_row_major": 1}, "rows": {"a_rows": 1},
             "row_major": {"a_rows": 1, "a_row_major": 1}}
#: B's layouts: blocks, Bᵀ in chunks (a stride ignored), B row after row (rows one
#: word further apart than their length, the stride set per GEMM).
B_LAYOUTS = {"block": {"b_rows": 0}, "rows": {"b_rows": 1, "b_stride": 3},
             "row_major": {"b_rows": 0}}


@pytest.mark.parametrize("a_layout", list(A_LAYOUTS))
@pytest.mark.parametrize("b_layout", list(B_LAYOUTS))
def test_layouts(a_layout, b_layout, seed):
    n = 4
    layout_no = list(A_LAYOUTS).index(a_layout)
    b_rows = list(B_LAYOUTS).index(b_layout)
    rng = np.random.default_rng(layout_no * 2 + b_rows + 4 * seed)
    shapes = [(5, 6, 7), (4, 4, 4), (1, 3, 2), (9, 9, 5)]
    gemms, c = [], 0
    for m, k, p in shapes:
        a, b = operands(rng, m, k, p)
        gemms.append({"A": a, "B": b, "a": 0 + 100 * len(gemms), "b": 1000 + 100 * len(gemms),
                      "c": c, **A_LAYOUTS[a_layout], **B_LAYOUTS[b_layout],
                      **({"b_stride": -(-p // n) + 1} if b_layout == "row_major" else {}),
                      "signal": {"enable": 1, "semaphore": len(gemms)}})
        c += -(-m // n) * -(-p // n) * n
    acc, dones, error = run(n, gemms, seed=layout_no + 2 * b_rows + 4 * seed)
    assert dones == [(1, i) for i in range(len(gemms))]
    assert error == 0
    c = 0
    for g in gemms:
        want = reference(g["A"], g["B"], n)
        got = acc[c:c + len(want)]
        m, p = g["A"].shape[0], g["B"].shape[1]
        for t in range(len(want) // n):  # rows beyond m are padding (block layout)
            rows = [r for r in range(n) if (t // -(-p // n)) * n + r < m]
            np.testing.assert_array_equal(got[t * n:(t + 1) * n][rows],
                                          want[t * n:(t + 1) * n][rows])
        if g["a_rows"]:  # zero-filled rows give zero results
            np.testing.assert_array_equal(got, want)
        c += len(want)


@pytest.mark.parametrize("stall", [0.0, 0.3])  # 0: rows written back to back
def test_accumulate_with_shift_combines_limbs(stall, seed):
    n = 4
    rng = np.random.default_rng(7 + seed)
    p_full = rng.integers(0, 1 << 14, (3, 8))
    hi, lo = (p_full >> 7).astype(np.int8), (p_full & 127).astype(np.int8)
    v = rng.integers(-128, 128, (8, 6), dtype=np.int64).astype(np.int8)
    gemms = [
        {"A": hi, "B": v, "a": 0, "b": 200, "c": 16, "a_rows": 1},
        {"A": lo, "B": v, "a": 100, "b": 200, "c": 16, "a_rows": 1, "accumulate": 1,
         "acc_shift": 7, "signal": {"enable": 1, "semaphore": 3}},
    ]
    acc, dones, _ = run(n, gemms, seed=3 + seed, stall=stall)
    want = reference(p_full, v.astype(np.int64), n)
    np.testing.assert_array_equal(acc[16:16 + len(want)], want)
    assert dones == [(0, 0), (1, 3)]


@pytest.mark.parametrize("a_layout", list(A_LAYOUTS))
@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_joined_limbs_multiply_in_one_pass(a_layout, stall, seed):
    """A = hi·2⁷ + lo from two regions read in step, between plain GEMMs; the limbs
    are any int8 (negative ones too), so the joined value spans 16 bits."""
    n = 4
    layout_no = list(A_LAYOUTS).index(a_layout)
    rng = np.random.default_rng(11 + layout_no + 2 * seed)
    gemms, c, wants = [], 0, []
    for index, (m, k, p) in enumerate([(5, 6, 7), (4, 16, 8), (9, 3, 2)]):
        hi, b = operands(rng, m, k, p)
        lo, _ = operands(rng, m, k, p)
        g = {"A": hi, "B": b, "a": 100 * index, "b": 1000 + 100 * index, "c": c,
             **A_LAYOUTS[a_layout], "signal": {"enable": 1, "semaphore": index}}
        if index != 1:  # the middle GEMM is a plain one
            g.update(A_lo=lo, a_lo=500 + 100 * index, a_limbs=1)
        joined = (hi.astype(np.int64) << 7) + (lo.astype(np.int64) if index != 1 else 0)
        wants.append((c, joined, b))
        gemms.append(g)
        c += -(-m // n) * -(-p // n) * n
    acc, dones, error = run(n, gemms, seed=5 + layout_no + 2 * seed, stall=stall)
    assert dones == [(1, i) for i in range(len(gemms))] and error == 0
    for (c, joined, b), g in zip(wants, gemms, strict=True):
        if "A_lo" not in g:
            joined = g["A"].astype(np.int64)
        want = reference(joined, b.astype(np.int64), n)
        got = acc[c:c + len(want)]
        m, p = joined.shape[0], b.shape[1]
        for t in range(len(want) // n):  # rows beyond m are padding (block layout)
            rows = [r for r in range(n) if (t // -(-p // n)) * n + r < m]
            np.testing.assert_array_equal(got[t * n:(t + 1) * n][rows],
                                          want[t * n:(t + 1) * n][rows])


@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_rows_past_m_keep_their_entries(stall, seed):
    """A GEMM writes its result rows up to m only: over entries a full GEMM wrote, GEMMs
    of m = N + 1 rows (in every layout of A) and an accumulating one of m = 3 leave the
    other rows of their last row tile as they were; the accumulating one adds onto
    what the GEMMs before it left."""
    n = 4
    rng = np.random.default_rng(41 + seed)
    k, p = 5, 6  # two column tiles
    a_full, b = operands(rng, 2 * n, k, p)
    gemms = [{"A": a_full, "B": b, "a": 0, "b": 200, "c": 0, "a_rows": 1}]
    for index, layout in enumerate(A_LAYOUTS.values()):
        a, b2 = operands(rng, n + 1, k, p)
        gemms.append({"A": a, "B": b2, "a": 300 + 100 * index, "b": 700 + 100 * index,
                      "c": 0, **layout})
    a3, b3 = operands(rng, 3, k, p)
    gemms.append({"A": a3, "B": b3, "a": 1000, "b": 1100, "c": 0, "a_rows": 1,
                  "accumulate": 1, "acc_shift": 2, "signal": {"enable": 1, "semaphore": 4}})
    acc, dones, error = run(n, gemms, seed=13 + seed, stall=stall)
    assert error == 0 and dones[-1] == (1, 4)
    want = np.zeros_like(acc)
    for g in gemms:  # each GEMM's rows below m, over what the GEMMs before left
        m = g["A"].shape[0]
        size = -(-m // n) * 2 * n
        tiles = reference(g["A"], g["B"], n, want[:size] if g.get("accumulate") else None,
                          g.get("acc_shift", 0))
        for t in range(len(tiles) // n):
            rows = [r for r in range(n) if (t // 2) * n + r < m]
            want[[t * n + r for r in rows]] = tiles[[t * n + r for r in rows]]
    np.testing.assert_array_equal(acc, want)


@pytest.mark.parametrize("port", ["a", "a_lo", "b"])
def test_an_uncorrectable_word_sets_the_error_and_the_gemms_still_finish(port):
    """A double-bit ECC error on any operand port, the low-limb one included, sets the
    sticky error; the beat count does not change, so every GEMM still finishes."""
    n = 4
    rng = np.random.default_rng(21)
    hi, b = operands(rng, 5, 6, 7)
    lo, _ = operands(rng, 5, 6, 7)
    gemm = {"A": hi, "A_lo": lo, "B": b, "a": 0, "a_lo": 100, "b": 200, "c": 0,
            "a_rows": 1, "a_limbs": 1, "signal": {"enable": 1, "semaphore": 1}}
    clean = dict(gemm, a=300, a_lo=400, b=500, c=32, signal={"enable": 1, "semaphore": 2})
    acc, dones, error = run(n, [gemm, clean], bad={gemm[port] + 3})
    assert error == 1 and dones == [(1, 1), (1, 2)]
    want = reference((clean["A"].astype(np.int64) << 7) + clean["A_lo"], b.astype(np.int64), n)
    np.testing.assert_array_equal(acc[32:32 + len(want)], want)  # the next GEMM is exact
    _, _, error = run(n, [clean])
    assert error == 0


@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_a_gated_core_clock_changes_no_cycle(stall, seed):
    """With the tensor core's clock gated while it is quiet, GEMMs after idle gaps
    (long enough for the core to stop, or not) finish on the same cycles with the same
    results as with the free-running clock; limbs, layouts and accumulation mixed."""
    n = 4
    rng = np.random.default_rng(31 + seed)
    gemms, c = [], 0
    for index, (m, k, p) in enumerate([(5, 6, 7), (4, 16, 8), (9, 3, 2), (4, 4, 4), (1, 3, 2)]):
        hi, b = operands(rng, m, k, p)
        lo, _ = operands(rng, m, k, p)
        g = {"A": hi, "B": b, "a": 100 * index, "b": 1000 + 100 * index, "c": c,
             **list(A_LAYOUTS.values())[index % 3], "signal": {"enable": 1, "semaphore": index}}
        if index % 2:
            g.update(A_lo=lo, a_lo=500 + 100 * index, a_limbs=1)
        gemms.append(g)
        c += -(-m // n) * -(-p // n) * n
    gaps = [int(g) for g in rng.choice([0, 3, 12, 40], len(gemms))]
    runs = {}
    for gated in (False, True):
        timeline = []
        acc, dones, error = run(n, gemms, seed=9 + seed, stall=stall, gated=gated, gaps=gaps,
                                timeline=timeline)
        runs[gated] = (acc, dones, error, timeline)
    assert runs[False][1] == [(1, i) for i in range(len(gemms))] and runs[False][2] == 0
    np.testing.assert_array_equal(runs[True][0], runs[False][0])
    assert runs[True][1:] == runs[False][1:]


def test_impossible_parameters_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        GemmEngine(6)
    with pytest.raises(ValueError, match="acc_depth"):
        GemmEngine(8, acc_depth=100)
    with pytest.raises(ValueError, match="queue"):
        GemmEngine(8, queue=0)
    with pytest.raises(ValueError, match="addr_bits"):
        GemmEngine(8, addr_bits=100)
    with pytest.raises(ValueError, match="gate_core_clock must be True or False"):
        GemmEngine(8, gate_core_clock=1)
    with pytest.raises(ValueError, match="power of two"):
        GemmEngine(8.0)
    with pytest.raises(ValueError, match="addr_bits"):
        OperandStreamer(8, addr_bits=0)
