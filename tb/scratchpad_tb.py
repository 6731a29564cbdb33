"""cocotb tests of the KV scratchpad inside a StreamHarness (see tests/test_scratchpad.py).

The scoreboard is :class:`ScratchpadModel`, a sequential reference of the scratchpad built
on :class:`golden.ecc.Secded` and the page layout of :mod:`golden.kv_cache`. Every port
gets random traffic on addresses it owns (rows ``r`` with ``r % plain_ports == p``, all
banks, so ports conflict on banks all the time), plus out-of-range addresses, writes with
one or two flipped codeword bits (the ``flip`` test hook) and reads of them; the KV port
maps pages, appends and reads tokens, and sends refused requests. Each port's responses
must equal the model's one for one: a wrong, missing, duplicated, reordered or extra
response fails, and so do wrong ECC counters.
"""

from __future__ import annotations

import functools

import cocotb
import numpy as np

from golden.ecc import Secded
from golden.kv_cache import PagedKVCache, check_block_table, gather
from rtl.scratchpad import Scratchpad
from sim import coverage
from sim.harness import StreamHarness
from sim.harness_driver import HarnessDriver
from sim.runner import SimBuild, build, parameters, report, run

MODULE = "tb.scratchpad_tb"

#: Design points the cocotb tests build (one Verilator build each, many runs on it).
CONFIGS = {
    # 4 banks x 64 words of 64 bits, four ports; 12 KV pages of 4 two-word tokens.
    "quad": {"banks": 4, "depth": 64, "word_bits": 64, "ports": ["tc", "vu", "ni", "kv"],
             "kv_port": "kv", "page_size": 4, "token_words": 2, "num_pages": 12,
             "sequences": 3, "max_pages": 4, "fault_injection": True},
    # 2 banks x 32 words of 32 bits, one plain port and the KV port, one-word tokens.
    "narrow": {"banks": 2, "depth": 32, "word_bits": 32, "ports": ["a", "kv"],
               "kv_port": "kv", "page_size": 2, "token_words": 1, "num_pages": 8,
               "sequences": 2, "max_pages": 4, "fault_injection": True},
}
#: Harness memory depth (beats) of every request and response stream.
HARNESS_DEPTH = 1024


def scratchpad_from_params(config: dict) -> Scratchpad:
    return Scratchpad(**config)


@functools.cache
def scratchpad_build(config: str, simulator: str | None = None,
                     waves: bool | None = None) -> SimBuild:
    sp = scratchpad_from_params(CONFIGS[config])
    depths = {}
    for name in sp.ports:
        depths[f"{name}_req"] = HARNESS_DEPTH
        depths[f"{name}_resp"] = HARNESS_DEPTH
    return build(StreamHarness(sp, depths), f"scratchpad-{config}", simulator=simulator,
                 waves=waves)


def run_scratchpad(config: str, testcase: str, *, seed: int = 1, **params) -> dict:
    """Run one cocotb test of this module on the ``config`` build; return its metrics."""
    params = {"config": CONFIGS[config], "seed": seed} | params
    return run(scratchpad_build(config), MODULE, testcase=testcase, seed=seed, params=params,
               tag=config)

# --- payload packing (by the RTL's own layouts) -----------------------------------------


def pack(layout, fields: dict) -> int:
    """An int holding ``fields`` (missing fields 0) at the offsets of a StructLayout."""
    value = 0
    for name, field in layout:
        if name not in fields:
            continue
        item = fields[name]
        if isinstance(item, dict):
            item = pack(field.shape, item)
        value |= (int(getattr(item, "value", item)) & ((1 << field.width) - 1)) << field.offset
    return value


def unpack_response(layout, word: int) -> dict:
    out = {}
    for name, field in layout:
        raw = (word >> field.offset) & ((1 << field.width) - 1)
        if name == "status":
            out[name] = {n: (raw >> f.offset) & 1 for n, f in field.shape}
        else:
            out[name] = raw
    return out


STATUS_FLAGS = ("corrected", "uncorrectable", "bad_address", "bad_request", "kv_full",
                "unmapped", "bad_page")


def response(data: int = 0, write: bool = False, **flags) -> dict:
    status = {flag: int(bool(flags.get(flag, 0))) for flag in STATUS_FLAGS}
    unknown = set(flags) - set(STATUS_FLAGS)
    if unknown:
        raise ValueError(f"unknown status flags {unknown}")
    return {"data": data, "write": int(write), "status": status}


# --- the reference model ----------------------------------------------------------------

APPEND, READ, MAP, RESET = 0, 1, 2, 3


class ScratchpadModel:
    """Sequential reference of a :class:`rtl.scratchpad.Scratchpad` (reads its parameters)."""

    def __init__(self, sp):
        self.sp = sp
        self.code = Secded(sp.word_bits)
        self.memory: dict[int, int] = {}  # address -> stored codeword (absent: 0)
        self.lengths = [0] * sp.sequences
        self.table = np.full((sp.sequences, sp.max_pages), -1, np.int64)
        self.corrected = self.uncorrectable = 0

    def _read(self, addr: int) -> dict:
        data, corrected, uncorrectable = self.code.decode([self.memory.get(addr, 0)])
        self.corrected += int(corrected[0])
        self.uncorrectable += int(uncorrectable[0])
        return response(int(data[0]), False, corrected=corrected[0],
                        uncorrectable=uncorrectable[0])

    def _write(self, addr: int, data: int, flip: int = 0) -> None:
        self.memory[addr] = int(self.code.encode([data])[0]) ^ flip

    def plain(self, req: dict) -> dict:
        addr, write = req["addr"], bool(req["write"])
        if addr >= self.sp.words:
            return response(0, write, bad_address=1)
        if write:
            self._write(addr, req["data"], req.get("flip", 0))
            return response(0, True)
        return self._read(addr)

    def token_address(self, page: int, slot: int, word: int) -> int:
        sp = self.sp
        return sp.kv_base + (page * sp.token_words + word) * sp.page_size + slot

    def kv(self, req: dict) -> dict:
        sp = self.sp
        op, seq, word = req["op"], req["seq"], req.get("word", 0)
        index = req.get("index", 0)
        write = op == APPEND
        seq_ok = seq < sp.sequences
        if op in (APPEND, READ):
            if not seq_ok or word >= sp.token_words:
                return response(0, write, bad_request=1)
            length = self.lengths[seq]
            token = length if op == APPEND else index
            if op == APPEND and length >= sp.capacity:
                return response(0, write, kv_full=1)
            if op == READ and index >= length:
                return response(0, write, bad_address=1)
            page = self.table[seq, token // sp.page_size]
            if page < 0:
                return response(0, write, unmapped=1)
            addr = self.token_address(int(page), token % sp.page_size, word)
            if op == READ:
                return self._read(addr)
            self._write(addr, req["data"])
            if req.get("last", 0):
                self.lengths[seq] += 1
            return response(0, True)
        if op == MAP:
            if not seq_ok or index >= sp.max_pages:
                return response(0, False, bad_request=1)
            if req.get("phys", 0) >= sp.num_pages:
                return response(0, False, bad_page=1)
            self.table[seq, index] = req["phys"]
            return response(0, False)
        if not seq_ok:  # RESET
            return response(0, False, bad_request=1)
        self.lengths[seq] = 0
        self.table[seq, :] = -1
        return response(0, False)

    def kv_image(self) -> tuple[PagedKVCache, np.ndarray, np.ndarray]:
        """The KV region as golden.kv_cache pages (page, slot, 1 head, token bytes), the
        block table and the lengths of the sequences that hold tokens."""
        sp = self.sp
        lanes = sp.word_bits // 8
        pages = np.zeros((sp.num_pages, sp.page_size, 1, sp.token_words * lanes), np.int8)
        for page in range(sp.num_pages):
            for slot in range(sp.page_size):
                for word in range(sp.token_words):
                    addr = self.token_address(page, slot, word)
                    data = int(self.code.decode([self.memory.get(addr, 0)])[0][0])
                    raw = np.frombuffer(data.to_bytes(lanes, "little"), np.int8)
                    pages[page, slot, 0, word * lanes:(word + 1) * lanes] = raw
        return PagedKVCache(pages, pages.copy()), self.table.copy(), np.array(self.lengths)


# --- traffic ----------------------------------------------------------------------------


def plain_ports(sp) -> list[str]:
    return [name for name in sp.ports if name != sp.kv_port]


def owned_addresses(sp, port: str) -> list[int]:
    """Addresses (below the KV region) that only ``port`` touches in random traffic."""
    names = plain_ports(sp)
    p = names.index(port)
    return [a for a in range(sp.kv_base) if (a // sp.banks) % len(names) == p]


def random_flip(rng: np.random.Generator, code_bits: int, p_single: float,
                p_double: float) -> int:
    u = rng.random()
    if u < p_single:
        return 1 << int(rng.integers(code_bits))
    if u < p_single + p_double:
        a, b = rng.choice(code_bits, 2, replace=False)
        return (1 << int(a)) | (1 << int(b))
    return 0


def plain_traffic(sp, rng, port: str, count: int, *, faults: bool) -> list[dict]:
    """Random reads and writes of ``port``'s addresses, some out of range, some flipped."""
    mine = owned_addresses(sp, port)
    written: list[int] = []
    code_bits = Secded(sp.word_bits).code_bits
    requests = []
    for _ in range(count):
        u = rng.random()
        if u < 0.04:
            addr = int(rng.integers(sp.words, 1 << sp.addr_bits))
            requests.append({"addr": addr, "write": int(rng.random() < 0.5),
                             "data": int(rng.integers(0, 1 << 62))})
        elif u < 0.5 or not written:
            addr = int(rng.choice(mine))
            flip = random_flip(rng, code_bits, 0.08, 0.05) if faults else 0
            requests.append({"addr": addr, "write": 1, "flip": flip,
                             "data": int.from_bytes(rng.bytes(sp.word_bits // 8 or 1), "little")
                             & ((1 << sp.word_bits) - 1)})
            written.append(addr)
        else:
            addr = int(rng.choice(written)) if rng.random() < 0.9 else int(rng.choice(mine))
            requests.append({"addr": addr, "write": 0})
    return requests


def kv_traffic(sp, rng, count: int, model: ScratchpadModel) -> list[dict]:
    """Map pages, append and read tokens, and every kind of refused request.

    Physical pages are handed out in a shuffled order and never to two sequences, as an
    allocator would; ``model`` supplies the current lengths and table (it is not changed).
    """
    table = model.table.copy()
    lengths = list(model.lengths)
    free = [int(p) for p in rng.permutation(sp.num_pages) if p not in set(table.ravel())]
    requests = []

    def word_data():
        return int.from_bytes(rng.bytes(max(1, sp.word_bits // 8)), "little") \
            & ((1 << sp.word_bits) - 1)

    while len(requests) < count:
        seq = int(rng.integers(sp.sequences))
        u = rng.random()
        if u < 0.45:  # append one token, mapping its page first when needed and possible
            page = lengths[seq] // sp.page_size
            if lengths[seq] < sp.capacity and table[seq, page] < 0 and free \
                    and rng.random() < 0.85:
                phys = free.pop()
                table[seq, page] = phys
                requests.append({"op": MAP, "seq": seq, "index": page, "phys": phys})
            mapped = lengths[seq] < sp.capacity and table[seq, page] >= 0
            for word in range(sp.token_words):
                requests.append({"op": APPEND, "seq": seq, "word": word, "data": word_data(),
                                 "last": int(word == sp.token_words - 1)})
            lengths[seq] += int(mapped)
        elif u < 0.8:  # read a token (sometimes past the length)
            limit = lengths[seq] + 2
            requests.append({"op": READ, "seq": seq, "index": int(rng.integers(limit)),
                             "word": int(rng.integers(sp.token_words))})
        elif u < 0.85:  # map to a page outside the cache
            requests.append({"op": MAP, "seq": seq, "index": int(rng.integers(sp.max_pages)),
                             "phys": int(rng.integers(sp.num_pages, 1 << _width(sp, "phys")))})
        elif u < 0.9:  # logical page past the table, or sequence out of range
            if rng.random() < 0.5:
                requests.append({"op": MAP, "seq": seq, "index": sp.max_pages, "phys": 0})
            else:
                op = int(rng.choice([APPEND, READ, MAP, RESET]))
                requests.append({"op": op, "seq": sp.sequences, "index": 0, "phys": 0,
                                 "data": word_data(), "last": 1})
        elif u < 0.93:  # a word index past the token
            requests.append({"op": int(rng.choice([APPEND, READ])), "seq": seq, "index": 0,
                             "word": sp.token_words, "data": word_data(), "last": 1})
        elif u < 0.95 and lengths[seq] > 0:  # free the sequence and its pages
            requests.append({"op": RESET, "seq": seq})
            free += [int(p) for p in table[seq] if p >= 0]
            table[seq, :] = -1
            lengths[seq] = 0
    return requests[:count]


def _width(sp, field: str) -> int:
    return dict((name, f.width) for name, f in sp.kv_request_layout)[field]


# --- the testbench ----------------------------------------------------------------------


class ScratchpadTB:
    """Loads per-port traffic into the harness, runs it and checks it against the model."""

    def __init__(self, dut, sp):
        self.harness = HarnessDriver(dut)
        self.dut, self.sp = dut, sp
        self.model = ScratchpadModel(sp)

    def set_idle_generator(self, probability: float) -> None:
        for name in self.sp.ports:
            self.harness.set_idle(f"{name}_req", probability)

    def set_backpressure_generator(self, probability: float) -> None:
        for name in self.sp.ports:
            self.harness.set_backpressure(f"{name}_resp", probability)

    async def transact(self, traffic: dict[str, list[dict]], *, seed: int,
                       idle: float = 0.0, stall: float = 0.0) -> dict:
        """Send each port's requests concurrently, check every response; return stats."""
        sp = self.sp
        self.set_idle_generator(idle)
        self.set_backpressure_generator(stall)
        expected = {}
        traffic = {name: traffic.get(name, []) for name in sp.ports}
        for name in sp.ports:
            requests = traffic[name]
            kv = name == sp.kv_port
            layout = sp.kv_request_layout if kv else sp.request_layout
            self.harness.load(f"{name}_req", [pack(layout, r) for r in requests])
            self.harness.expect(f"{name}_resp", len(requests))
            expected[name] = [self.model.kv(r) if kv else self.model.plain(r) for r in requests]
        total = sum(len(v) for v in expected.values())
        longest = max(len(v) for v in expected.values())
        timeout = int(6 * longest / ((1 - idle) * (1 - stall))) + 4 * total // len(sp.ports) \
            + 1000
        stats = await self.harness.run(seed=seed, timeout_cycles=timeout)
        assert stats.finished, f"timed out after {stats.cycles} cycles"
        await self.harness.settle(20)
        for name in sp.ports:
            want = expected[name]
            got_count = self.harness.counter(f"{name}_resp_received")
            got = [unpack_response(sp.response_layout, w) for w in
                   self.harness.read(f"{name}_resp", min(max(got_count, len(want)),
                                                         HARNESS_DEPTH))]
            requests = traffic.get(name, [])
            assert got_count == len(want), (
                f"{name}: {got_count} responses to {len(want)} requests "
                f"({self.harness.counter(f'{name}_req_sent')} sent); "
                f"first {got[:3]}, want {want[:3]}"
            )
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g == w, f"{name} response {i} to {requests[i]}: got {g}, want {w}"
            kind = "kv" if name == sp.kv_port else "plain"
            for flag in {f for g in got for f, v in g["status"].items() if v}:
                coverage.scratchpad_status(kind, flag)
            if self.harness.counter(f"{name}_conflicts"):
                coverage.scratchpad_conflict(name)
        self.check_counters()
        return {"cycles": stats.cycles, "requests": total, "wall_s": stats.wall_s}

    def check_counters(self) -> None:
        corrected = self.harness.counter("corrected_count")
        uncorrectable = self.harness.counter("uncorrectable_count")
        assert corrected == self.model.corrected, \
            f"corrected_count {corrected}, model {self.model.corrected}"
        assert uncorrectable == self.model.uncorrectable, \
            f"uncorrectable_count {uncorrectable}, model {self.model.uncorrectable}"
        assert self.harness.counter("ecc_error") == int(self.model.uncorrectable > 0)

    async def read_back_kv(self, seed: int) -> None:
        """Read every stored token through the block table; compare with golden.kv_cache."""
        sp, model = self.sp, self.model
        reads = [{"op": READ, "seq": s, "index": t, "word": w}
                 for s in range(sp.sequences) for t in range(model.lengths[s])
                 for w in range(sp.token_words)]
        if not reads:
            return
        await self.transact({sp.kv_port: reads}, seed=seed, stall=0.2)
        got = [unpack_response(sp.response_layout, w)
               for w in self.harness.read(f"{sp.kv_port}_resp", len(reads))]
        cache, table, lengths = model.kv_image()
        live = [s for s in range(sp.sequences) if lengths[s] > 0]
        table_live, lens_live = check_block_table(cache, table[live], lengths[live])
        keys, _ = gather(cache, table_live)
        lanes = sp.word_bits // 8
        index = 0
        for row, s in enumerate(live):
            for t in range(lengths[s]):
                for w in range(sp.token_words):
                    entry = got[index]
                    index += 1
                    if entry["status"]["uncorrectable"]:
                        continue  # a word the test broke on purpose
                    want = keys[row, t, 0, w * lanes:(w + 1) * lanes].tobytes()
                    assert entry["data"].to_bytes(lanes, "little") == want, \
                        f"sequence {s} token {t} word {w} differs from golden.kv_cache.gather"


def _scratchpad() -> Scratchpad:
    return scratchpad_from_params(parameters()["config"])


async def _start(dut):
    """The test's parameters, the scratchpad, its seed and rng, and a reset TB."""
    p = parameters()
    sp = _scratchpad()
    tb = ScratchpadTB(dut, sp)
    await tb.harness.reset()
    return p, sp, p["seed"], np.random.default_rng(p["seed"]), tb


@cocotb.test()
async def random_traffic(dut):
    """All ports at once, random traffic with ECC faults; with and without idle/stall."""
    p, sp, seed, rng, tb = await _start(dut)
    metrics = {}
    for phase, (idle, stall) in enumerate(p["phases"]):
        traffic = {name: plain_traffic(sp, rng, name, p["count"], faults=True)
                   for name in plain_ports(sp)}
        if sp.kv_port:
            traffic[sp.kv_port] = kv_traffic(sp, rng, p["count"], tb.model)
        stats = await tb.transact(traffic, seed=seed + phase, idle=idle, stall=stall)
        metrics[f"phase{phase}_requests_per_cycle"] = stats["requests"] / stats["cycles"]
        metrics[f"phase{phase}_cycles"] = stats["cycles"]
        metrics[f"phase{phase}_wall_s"] = stats["wall_s"]
    if sp.kv_port:
        await tb.read_back_kv(seed + 100)
    metrics["corrected"] = tb.model.corrected
    metrics["uncorrectable"] = tb.model.uncorrectable
    report(**metrics)


@cocotb.test()
async def full_rate_no_conflicts(dut):
    """Every plain port reads its own bank every cycle: one request per port per cycle."""
    p = parameters()
    sp = _scratchpad()
    tb = ScratchpadTB(dut, sp)
    await tb.harness.reset()
    names = plain_ports(sp)
    assert len(names) <= sp.banks
    count = p["count"]
    traffic = {name: [{"addr": (i * sp.banks + b) % sp.kv_base, "write": 0}
                      for i in range(count)] for b, name in enumerate(names)}
    # Each port stays in bank b: address i * banks + b.
    stats = await tb.transact(traffic, seed=p["seed"])
    first = min(tb.harness.counter(f"{n}_req_first") for n in names)
    last = max(tb.harness.counter(f"{n}_resp_last") for n in names)
    span = last - first + 1
    rate = len(names) * count / span
    assert rate >= 0.95 * len(names), f"{rate:.2f} requests/cycle on {len(names)} free banks"
    report(requests_per_cycle=rate, span_cycles=span, cycles=stats["cycles"])


@cocotb.test()
async def kv_errors_lose_nothing(dut):
    """Fill sequences, then send every refused request; the stored KV cache is unchanged."""
    p, sp, seed, rng, tb = await _start(dut)
    kv = sp.kv_port
    # Sequence 0: fill its whole block table; sequence 1: one page only.
    setup, page_order = [], [int(x) for x in rng.permutation(sp.num_pages)]
    for page in range(sp.max_pages):
        setup.append({"op": MAP, "seq": 0, "index": page, "phys": page_order.pop()})
    setup.append({"op": MAP, "seq": 1, "index": 0, "phys": page_order.pop()})
    for seq, tokens in ((0, sp.capacity), (1, sp.page_size)):
        for _ in range(tokens):
            for w in range(sp.token_words):
                setup.append({"op": APPEND, "seq": seq, "word": w,
                              "last": int(w == sp.token_words - 1),
                              "data": int(rng.integers(0, 1 << 62)) & ((1 << sp.word_bits) - 1)})
    await tb.transact({kv: setup}, seed=seed)
    assert tb.model.lengths[:2] == [sp.capacity, sp.page_size]

    bad = [
        {"op": APPEND, "seq": 0, "word": 0, "last": 1, "data": 1},          # table full
        {"op": APPEND, "seq": 1, "word": 0, "last": 1, "data": 2},          # page 1 unmapped
        {"op": MAP, "seq": 1, "index": 1, "phys": sp.num_pages},            # outside the cache
        {"op": APPEND, "seq": 1, "word": 0, "last": 1, "data": 3},          # still unmapped
        {"op": MAP, "seq": 1, "index": sp.max_pages, "phys": 0},            # past the table
        {"op": READ, "seq": 0, "index": sp.capacity, "word": 0},            # past the length
        {"op": READ, "seq": sp.sequences, "index": 0, "word": 0},           # no such sequence
        {"op": RESET, "seq": sp.sequences},                                 # no such sequence
        {"op": APPEND, "seq": 1, "word": sp.token_words, "last": 1, "data": 4},  # bad word
    ]
    flags = ["kv_full", "unmapped", "bad_page", "unmapped", "bad_request", "bad_address",
             "bad_request", "bad_request", "bad_request"]
    plain = plain_ports(sp)[0]
    bad_plain = [{"addr": sp.words, "write": 1, "data": 5},
                 {"addr": (1 << sp.addr_bits) - 1, "write": 0}]
    await tb.transact({kv: bad, plain: bad_plain}, seed=seed + 1, stall=0.3)
    got = [unpack_response(sp.response_layout, w) for w in tb.harness.read(f"{kv}_resp", len(bad))]
    for request, flag, g in zip(bad, flags, got, strict=True):
        assert g["status"][flag] == 1, f"{request}: expected {flag}, got {g['status']}"
    got = [unpack_response(sp.response_layout, w)
           for w in tb.harness.read(f"{plain}_resp", len(bad_plain))]
    assert all(g["status"]["bad_address"] for g in got)
    assert tb.model.lengths[:2] == [sp.capacity, sp.page_size]
    await tb.read_back_kv(seed + 2)
    report(refused=len(bad) + len(bad_plain))


@cocotb.test()
async def kv_ecc_faults(dut):
    """Flip one or two bits of stored tokens (via a plain port) and read them via the table."""
    p, sp, seed, rng, tb = await _start(dut)
    kv, plain = sp.kv_port, plain_ports(sp)[0]
    await tb.transact({kv: kv_traffic(sp, rng, p["count"], tb.model)}, seed=seed)
    code_bits = Secded(sp.word_bits).code_bits
    rewrites = []
    for s in range(sp.sequences):
        for t in range(tb.model.lengths[s]):
            page = tb.model.table[s, t // sp.page_size]
            addr = tb.model.token_address(int(page), t % sp.page_size, 0)
            stored = tb.model.memory.get(addr, 0)
            data = int(tb.model.code.decode([stored])[0][0])
            flip = random_flip(rng, code_bits, 0.4, 0.3)
            rewrites.append({"addr": addr, "write": 1, "data": data, "flip": flip})
    await tb.transact({plain: rewrites}, seed=seed + 1)
    await tb.read_back_kv(seed + 2)
    assert tb.model.corrected > 0 and tb.model.uncorrectable > 0, "no faults were injected"
    report(corrected=tb.model.corrected, uncorrectable=tb.model.uncorrectable)


@cocotb.test()
async def reset_clears_kv_state(dut):
    """rst empties every sequence and the block table; the SRAM contents stay."""
    p, sp, seed, rng, tb = await _start(dut)
    kv, plain = sp.kv_port, plain_ports(sp)[0]
    await tb.transact({kv: kv_traffic(sp, rng, p["count"], tb.model)}, seed=seed)
    assert any(tb.model.lengths), "no token was appended"
    await tb.harness.reset()
    assert tb.harness.counter("corrected_count") == 0
    assert tb.harness.counter("ecc_error") == 0
    tb.model.corrected = tb.model.uncorrectable = 0
    tb.model.lengths = [0] * sp.sequences
    tb.model.table[:] = -1
    reads = [{"op": READ, "seq": s, "index": 0, "word": 0} for s in range(sp.sequences)]
    stored = sorted(a for a in tb.model.memory if a >= sp.kv_base)[:8]
    await tb.transact({kv: reads, plain: [{"addr": a, "write": 0} for a in stored]},
                      seed=seed + 1)
    report(reads=len(reads) + len(stored))
