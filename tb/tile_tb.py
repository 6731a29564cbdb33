"""cocotb tests of a tile in a StreamHarness (see tests/test_tile.py and sim/tile_run.py).

``tile_attention`` walks :func:`sim.attention_scenario.attention_steps`: before each
program the host issues its KV requests (MAPs for new pages, one APPEND per word of
each new token), writes the program's scratchpad words, pulses ``go``, waits for the
halt, reads the output words back and compares them with golden, bit for bit.
"""

from __future__ import annotations

import cocotb
import numpy as np
from cocotb.triggers import ClockCycles

from golden.tile_model import TileModel
from golden.workloads import get_workload
from rtl.scratchpad import KvOp
from rtl.sequencer import ErrorCode
from sim import coverage
from sim.attention_scenario import attention_steps
from sim.harness_driver import MAX_PROBABILITY
from sim.runner import parameters, report
from sim.sequencer_cases import (
    HALT,
    Sizes,
    acc_load_programs,
    bad_instructions,
    boundary_instructions,
    coincident_overflow,
    dma,
    fitting_program,
    gemm,
    high_bit_instructions,
    idma_edges,
    loaded_words,
    model_outcome,
    outcome,
    random_register_program,
    register_errors,
    register_programs,
    semaphore_overflow,
    semaphore_programs,
    vec,
)
from sim.tile_driver import TileDriver
from sim.tile_run import harness_depths, sim_tile
from spec.config import TileConfig
from spec.isa import (
    SEMAPHORES,
    DmaTarget,
    Opcode,
    VecDst,
    decode,
    encode,
    index_entry,
    tile_bit,
    tile_index,
)
from spec.memory import MemRead

#: Cycles a program may take per instruction before the run is declared hung.
CYCLES_PER_INSTRUCTION = 400


@cocotb.test()
async def tile_attention(dut):
    p = parameters()
    config = TileConfig(**p["config"])
    steps = attention_steps(config, p["workload"], p["layer"], prefill=p["prefill"],
                            context=p["context"], steps=p["steps"], seed=p["seed"],
                            loops=p.get("loops"))
    driver = TileDriver(dut, sim_tile(config), harness_depths(config))
    driver.set_traffic(p["idle"], p["stall"], p["seed"])
    await driver.reset()
    phases = []
    for index, step in enumerate(steps):
        program = step.program
        await driver.load(program.instructions, program.spad_writes, step.kv_requests)
        run = await driver.execute(CYCLES_PER_INSTRUCTION * program.summary.notes["unrolled"]
                                   + 10_000)
        assert run.error == ErrorCode.NONE, f"step {index}: {run.error.name} at pc {run.pc}"
        assert run.engine_error == 0, f"step {index}: engine error flags {run.engine_error:#b}"
        got = (run.counters["acc_reads"], run.counters["acc_writes"])
        assert got == (program.summary.acc_reads, program.summary.acc_writes), (
            f"step {index}: the tile counted {got} accumulator reads and writes, the "
            f"program's operations make {(program.summary.acc_reads, program.summary.acc_writes)}")
        words, _ = await driver.read(program.output_words)
        got = program.read_output(dict(zip(program.output_words, words, strict=True)).__getitem__)
        wrong = np.argwhere(got != step.expected)
        assert wrong.size == 0, (
            f"step {index} ({step.phase}, context {step.context}): {len(wrong)} of "
            f"{got.size} outputs differ from golden, first at {tuple(wrong[0])}: "
            f"{int(got[tuple(wrong[0])])} != {int(step.expected[tuple(wrong[0])])}")
        coverage.sample_program([decode(w) for w in program.instructions], config.n)
        coverage.attention_context(step.phase, step.context, config.page_size)
        phases.append({"phase": step.phase, "context": step.context,
                       "instructions": len(program.instructions),
                       "outputs": int(np.prod(program.output_shape)),
                       "summary": program.summary.as_dict(), "counters": run.counters,
                       "cycles_per_s": run.cycles / run.wall_s if run.wall_s else 0.0})
    workload = get_workload(p["workload"])
    coverage.attention_gqa(workload.heads, workload.kv_heads)
    report(passed=True, phases=phases)


@cocotb.test()
async def tile_faults(dut):
    """ECC faults injected through the host port, a bad instruction, a full KV cache:
    each is corrected or reported, never silently wrong."""
    p = parameters()
    config = TileConfig(**p["config"])
    step = attention_steps(config, "tiny", 1, prefill=5, steps=0)[0]
    program = step.program
    driver = TileDriver(dut, sim_tile(config), harness_depths(config))
    await driver.reset()
    timeout = CYCLES_PER_INSTRUCTION * len(program.instructions) + 10_000
    queries = sorted(program.spad_writes)

    # 1. One flipped bit in every query word: corrected on every read, output exact.
    flips = {a: 1 << (a % 64) for a in queries}
    await driver.load(program.instructions, program.spad_writes, step.kv_requests,
                      flips=flips)
    run = await driver.execute(timeout)
    assert run.error == ErrorCode.NONE and run.engine_error == 0
    words, responses = await driver.read(program.output_words)
    got = program.read_output(dict(zip(program.output_words, words, strict=True)).__getitem__)
    assert (got == step.expected).all(), "single-bit errors changed the output"
    corrected = int(dut.corrected_count.value)
    assert corrected >= len(queries), f"{corrected} corrections for {len(queries)} bad words"
    assert int(dut.uncorrectable_count.value) == 0

    # 2. Two flipped bits in one query word: the GEMM engine gets an uncorrectable
    #    status (data 0) and raises its error flag; the host read says so too.
    bad = queries[0]
    await driver.load(program.instructions, {bad: program.spad_writes[bad]}, [],
                      flips={bad: 0b11})
    run = await driver.execute(timeout)
    assert run.engine_error & 1, "an uncorrectable operand did not raise the GEMM error"
    assert int(dut.uncorrectable_count.value) >= 1
    _, responses = await driver.read([bad])
    assert responses[0].status.uncorrectable and int(responses[0].data) == 0
    #    The DMA engine raises its own flag when it copies such a word.
    await driver.reset()
    await driver.load([encode(Opcode.DMA, src=bad, dst=bad + 1, length=1, tiles=1),
                       encode(Opcode.HALT)], {bad: program.spad_writes[bad]}, [],
                      flips={bad: 0b11})
    run = await driver.execute(10_000)
    assert run.engine_error == 0b100, f"engine error flags {run.engine_error:#05b}"
    #    A LOAD of it stops the program with MEMORY_ERROR at the LOAD.
    await driver.load([encode(Opcode.NOP), encode(Opcode.LOAD, rd=1, addr=bad, lane=0),
                       encode(Opcode.HALT)], {bad: program.spad_writes[bad]}, [],
                      flips={bad: 0b11})
    run = await driver.execute(10_000)
    assert (run.error, run.pc) == (ErrorCode.MEMORY_ERROR, 1), (run.error, run.pc)
    coverage.sequencer_error(run.error.name)

    # 3. A region past the end of the scratchpad: the program stops with BAD_ADDRESS at
    #    that instruction, nothing after it runs.
    bad_program = [encode(Opcode.NOP),
                   encode(Opcode.GEMM, a=config.spad_words - 1, b=0, c=0, m=1, k=16, p=1),
                   encode(Opcode.HALT)]
    await driver.load(bad_program, {}, [])
    run = await driver.execute(10_000)
    assert (run.error, run.pc) == (ErrorCode.BAD_ADDRESS, 1), (run.error, run.pc)
    coverage.sequencer_error(run.error.name)
    assert run.counters["tc_beats"] == run.counters["macs"] == 0

    # 4. A host write past the end of the scratchpad fails the load with its response's
    #    status (the harness counts the error; only then are the responses read).
    try:
        await driver.load([encode(Opcode.HALT)], {0: 5, config.spad_words: 1}, [])
    except AssertionError as error:
        assert "host_resp reported errors: ['#1: bad_address']" in str(error), error
    else:
        raise AssertionError("a host write past the scratchpad was not reported")

    # 4. A full sequence: the append past max_pages x page_size is refused with
    #    kv_full and the tokens already stored read back unchanged.
    seq, capacity = config.kv_sequences - 1, config.max_pages * config.page_size
    requests = [{"op": KvOp.RESET, "seq": seq}]
    requests += [{"op": KvOp.MAP, "seq": seq, "index": i, "phys": i}
                 for i in range(config.max_pages)]
    requests += [{"op": KvOp.APPEND, "seq": seq, "word": 0, "data": t + 1, "last": 1}
                 for t in range(capacity + 1)]
    responses = await driver.kv(requests)
    flags = [r.status.kv_full for r in responses]
    assert flags.count(1) == 1 and flags[-1] == 1, "the append past capacity was not refused"
    back = await driver.kv([{"op": KvOp.READ, "seq": seq, "index": t, "word": 0}
                            for t in (0, capacity - 1)])
    assert [int(r.data) for r in back] == [1, capacity]
    report(passed=True, corrected=corrected)


@cocotb.test()
async def tile_network(dut):
    """Words from the network land in the scratchpad and their signal releases a WAIT;
    a local DMA copies them and signals both its own and the arrival semaphore; a DMA
    to this tile and another writes here and sends every word on ``net_out`` (the
    receiver counts the signal on the last), each word bound for tiles, not a memory
    channel; a DMA raises only the semaphores it asks for; a long one under
    backpressure reads and writes each word once; STOREs and LOADs through the memory
    channels."""
    p = parameters()
    config = TileConfig(**p["config"])
    driver = TileDriver(dut, sim_tile(config), harness_depths(config))
    await driver.reset()
    own = 1  # tile (0, 0)
    src, dst, count = 100, 200, 5
    program = [
        encode(Opcode.WAIT, semaphore=3, count=1),  # the network words have arrived
        encode(Opcode.DMA, src=src, dst=dst, length=count, tiles=own,
               signal={"enable": 1, "semaphore": 2}, remote_signal=1, remote_semaphore=4),
        encode(Opcode.WAIT, semaphore=2, count=1),
        encode(Opcode.WAIT, semaphore=4, count=1),
        encode(Opcode.HALT),
    ]
    await driver.load(program, {}, [])
    await driver.go()
    words = [0x0102030405060708 * (i + 1) & ((1 << 64) - 1) for i in range(count)]
    await driver.send([{"tiles": own, "addr": src + i, "data": w, "write": 1,
                        "last": int(i == count - 1), "signal": 1, "semaphore": 3}
                       for i, w in enumerate(words)])
    run = await driver.wait_halt(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    # Held by its first WAIT, no engine busy, until the words arrive: counted as waiting.
    assert 0 < run.counters["wait"] <= run.counters["stall"], run.counters
    got, _ = await driver.read([src + i for i in range(count)] + [dst + i for i in range(count)])
    assert got == words + words, [hex(w) for w in got]
    assert run.counters["dma"] > 0

    other, far = tile_bit(1, 0), 300
    await driver.load(_dma_and_wait(src, far, count, own | other, 5), {}, [])
    sent = await driver.go_and_receive(count)
    run = await driver.wait_halt(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    fields = [_fields(w) for w in sent]
    assert fields == [{"tiles": other, "addr": far + i, "data": words[i], "write": 1,
                       "last": int(i == count - 1), "signal": 1, "semaphore": 5}
                      for i in range(count)], fields
    assert driver.words_sent() == count, f"{driver.words_sent()} words sent, not {count}"
    got, _ = await driver.read([far + i for i in range(count)])
    assert got == words, [hex(w) for w in got]
    await _signal_only_dmas(driver, own, other)
    await _dmas_signal_only_where_asked(driver, own, other)
    await _long_dma_under_backpressure(driver, own, other)
    await _longest_local_dma(driver, own)
    await _dmas_at_alternating_address_bits(driver, own, config.spad_words)
    await _dma_beside_a_gemm(driver, own, other)
    await _dma_behind_a_dma(driver, own)
    await _idma_rows_to_both_tiles(driver, own, other)
    await _four_increments_in_one_cycle(driver, own)
    await _stores_and_loads_through_channels(driver, own)
    report(passed=True)


async def _stores_and_loads_through_channels(driver: TileDriver, own: int) -> None:
    """A STORE of 37 words under backpressure sends each to its channel (``tiles`` 0,
    the memory address counting up, no signal) and writes nothing here; one of length 0
    sends nothing. A LOAD sends one request word (its :class:`spec.memory.MemRead`:
    the scratchpad address, this tile, the length) and reads nothing; answered as the
    channel would (the words it holds, the signal on the last), its WAIT passes and the
    words land; a LOAD of length 0 asks for the signal alone. The network takes a word
    in one cycle of 256 while the requests wait to leave, and the memory addresses are of
    alternating bits (0x5A5A55 and 0x25A5AA, within the channel's 0xA5A5A5 words)."""
    count, src, dst, base = 37, 0x155, 0x2A8, 0x5A5A55
    rng = np.random.default_rng(12)
    words = [int(w) for w in rng.integers(0, 1 << 62, count)]
    store = {"target": DmaTarget.STORE, "channel": 4, "tiles": 0,
             "signal": {"enable": 1, "semaphore": 2}}
    await driver.load([dma(src=src, dst=dst, length=count, mem_addr=base, **store),
                       dma(src=src, dst=dst, length=0, mem_addr=base, **store),
                       encode(Opcode.WAIT, semaphore=2, count=2), HALT],
                      {src + i: w for i, w in enumerate(words)} | {dst: 0x77}, [])
    driver.set_traffic(0.0, 0.5, 9)
    sent = await driver.go_and_receive(count)
    run = await driver.wait_halt(10_000)
    driver.set_traffic(0.0, 0.0, 1)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    fields = [_word(w, "target", "channel", "tiles", "addr", "data", "write", "last", "signal")
              for w in sent]
    assert fields == [{"target": DmaTarget.STORE, "channel": 4, "tiles": 0,
                       "addr": base + i, "data": words[i], "write": 1,
                       "last": int(i == count - 1), "signal": 0} for i in range(count)], fields
    assert driver.words_sent() == count, f"{driver.words_sent()} words sent, not {count}"
    assert run.counters["spad"] == count, run.counters  # each word read once, none written
    got, _ = await driver.read([dst])
    assert got == [0x77], "a STORE wrote into the scratchpad"

    far = 0x25A5AA
    memory = {far + i: int(w) for i, w in enumerate(rng.integers(0, 1 << 62, count))}
    for length, semaphore in ((count - 5, 7), (0, 8)):
        await driver.load([
            dma(dst=dst, length=length, mem_addr=far, target=DmaTarget.LOAD, channel=3,
                tiles=0, remote_signal=1, remote_semaphore=semaphore,
                signal={"enable": 1, "semaphore": 2}),
            encode(Opcode.WAIT, semaphore=2, count=1),
            encode(Opcode.WAIT, semaphore=semaphore, count=1), HALT], {}, [])
        driver.set_traffic(0.0, MAX_PROBABILITY, 10 + length)
        (request,) = await driver.go_and_receive(1)
        driver.set_traffic(0.0, 0.0, 1)
        got = _word(request, "target", "channel", "tiles", "addr", "write", "last", "signal",
                    "semaphore")
        assert got == {"target": DmaTarget.LOAD, "channel": 3, "tiles": 0, "addr": far,
                       "write": 0, "last": 1, "signal": 1, "semaphore": semaphore}, got
        asked = MemRead(driver.tile.n).const({"spad_addr": dst, "x": 0, "y": 0,
                                              "length": length}).as_value().value
        assert int(request["data"]) == asked, f"request {int(request['data']):#x}"
        assert driver.words_sent() == 1, f"{driver.words_sent()} words sent, not 1"
        reply = [{"tiles": own, "addr": dst + i, "data": memory[far + i], "write": 1,
                  "last": int(i == length - 1), "signal": int(i == length - 1),
                  "semaphore": semaphore} for i in range(length)]
        await driver.send(reply or [{"tiles": own, "addr": 0, "data": 0, "write": 0,
                                     "last": 1, "signal": 1, "semaphore": semaphore}])
        run = await driver.wait_halt(10_000)
        assert run.error == ErrorCode.NONE and run.engine_error == 0, run
        assert run.counters["spad"] == length, run.counters  # the reply's writes alone
        if length:
            got, _ = await driver.read([dst + i for i in range(length)])
            assert got == [memory[far + i] for i in range(length)], "the loaded words differ"


async def _four_increments_in_one_cycle(driver: TileDriver, own: int) -> None:
    """On each semaphore, in one cycle: a local DMA's, a GEMM's and a VEC's completions
    and a word arriving from the network with its signal; a WAIT for the four then
    passes. On the tiny tile, nothing held back, a DMA of 18 words, a GEMM of k = 8, a
    VEC of 19 beats writing nothing and a word sent 46 cycles after ``go`` all land in
    the cycle the WAIT nine instructions in would subtract: found by moving each one a
    cycle at a time against that WAIT's subtraction from a full semaphore, which
    overflows exactly when the increment comes first; together, with a WAIT of 4 there,
    no overflow, and one cycle earlier for any of them, an overflow."""
    for s in range(SEMAPHORES):
        signal = {"signal": {"enable": 1, "semaphore": s}}
        await driver.load([
            encode(Opcode.SIGNAL, semaphore=s, count=0),  # the probes' SIGNAL of 65 535
            dma(src=1000, dst=1100, length=18, tiles=own, **signal),
            gemm(k=8, **signal),
            vec(rows=1, beats=19, a=0, b=0, c=0, dst=0, dst_kind=VecDst.NONE.value, **signal),
            *[encode(Opcode.NOP)] * 6,
            encode(Opcode.WAIT, semaphore=s, count=4), HALT], {}, [])
        await driver.go()
        await ClockCycles(driver.dut.clk, 46)
        await driver.send([{"tiles": own, "addr": 900, "data": 0, "write": 1, "last": 1,
                            "signal": 1, "semaphore": s}])
        run = await driver.wait_halt(2_000)
        assert run.error == ErrorCode.NONE and run.engine_error == 0, (s, run)


async def _idma_rows_to_both_tiles(driver: TileDriver, own: int, other: int) -> None:
    """An IDMA gathering rows of two words for the other tile, this one, then the other
    again: the other's rows leave on ``net_out`` (each a packet asking for an arrival),
    this one's is copied here."""
    src, dst, table = 700, 800, 760
    here, there = own.bit_length() - 1, other.bit_length() - 1
    words = [0x1111111111111111 * (i + 1) for i in range(6)]
    entries = [index_entry(2, there), index_entry(0, here), index_entry(1, there)]
    table_word = sum(e << 16 * i for i, e in enumerate(entries))
    await driver.load([
        encode(Opcode.IDMA, src=src, dst=dst, table=table, count=3, row=2, remote_signal=1,
               remote_semaphore=6, signal={"enable": 1, "semaphore": 2}),
        encode(Opcode.WAIT, semaphore=2, count=1),
        encode(Opcode.WAIT, semaphore=6, count=1),  # this tile's row
        encode(Opcode.HALT),
    ], {table: table_word} | {src + i: w for i, w in enumerate(words)}, [])
    sent = [_fields(w) for w in await driver.go_and_receive(4)]
    run = await driver.wait_halt(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert sent == [{"tiles": other, "addr": dst + i, "data": words[4 + i], "write": 1,
                     "last": i, "signal": 1, "semaphore": 6} for i in range(2)] + [
                    {"tiles": other, "addr": dst + 4 + i, "data": words[2 + i], "write": 1,
                     "last": i, "signal": 1, "semaphore": 6} for i in range(2)], sent
    assert driver.words_sent() == 4, f"{driver.words_sent()} words sent, not 4"
    got, _ = await driver.read([dst + 2, dst + 3])
    assert got == words[:2], [hex(w) for w in got]


async def _dma_behind_a_dma(driver: TileDriver, own: int) -> None:
    """A short DMA dispatched right behind a long one (no WAIT between): the engine takes
    it only when the long one is done, and both copies are whole."""
    rng = np.random.default_rng(11)
    words = [int(w) for w in rng.integers(0, 1 << 62, 64)]
    signal = {"enable": 1, "semaphore": 2}
    await driver.load([encode(Opcode.DMA, src=500, dst=600, length=64, tiles=own,
                              signal=signal),
                       encode(Opcode.DMA, src=500, dst=700, length=3, tiles=own,
                              signal=signal),
                       encode(Opcode.WAIT, semaphore=2, count=2), encode(Opcode.HALT)],
                      {500 + i: w for i, w in enumerate(words)}, [])
    run = await driver.execute(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    got, _ = await driver.read([600 + i for i in range(64)] + [700, 701, 702])
    assert got == words + words[:3], "a DMA behind another lost words"


def _dma_and_wait(src: int, dst: int, count: int, tiles: int, arrival: int) -> list[int]:
    """A DMA signalling semaphore 2 here and ``arrival`` where it lands, then WAITs for
    both and HALT."""
    return [encode(Opcode.DMA, src=src, dst=dst, length=count, tiles=tiles,
                   signal={"enable": 1, "semaphore": 2}, remote_signal=1,
                   remote_semaphore=arrival),
            encode(Opcode.WAIT, semaphore=2, count=1),
            encode(Opcode.WAIT, semaphore=arrival, count=1),
            encode(Opcode.HALT)]


def _word(word, *names: str) -> dict:
    """The named fields of a network word (``target`` a :class:`DmaTarget`)."""
    return {name: word[name] if name == "target" else int(word[name]) for name in names}


def _fields(word) -> dict:
    """The fields of a word a DMA sent to tiles, which names no memory channel."""
    bound = _word(word, "target", "channel")
    assert bound == {"target": DmaTarget.TILES, "channel": 0}, f"a word to tiles bound for {bound}"
    return _word(word, "tiles", "addr", "data", "write", "last", "signal", "semaphore")


async def _signal_only_dmas(driver: TileDriver, own: int, other: int) -> None:
    """Length 0: to this tile, only the arrival; to another, one bare word (no write,
    last, the signal). Length 1 to another tile alone: one data word, not a bare one."""
    await driver.load([
        encode(Opcode.DMA, src=0, dst=0, length=0, tiles=own,
               signal={"enable": 1, "semaphore": 1}, remote_signal=1, remote_semaphore=6),
        encode(Opcode.WAIT, semaphore=6, count=1),
        encode(Opcode.DMA, src=0, dst=77, length=0, tiles=other,
               signal={"enable": 1, "semaphore": 1}, remote_signal=1, remote_semaphore=9),
        encode(Opcode.DMA, src=40, dst=78, length=1, tiles=other,
               signal={"enable": 1, "semaphore": 1}, remote_signal=1, remote_semaphore=8),
        encode(Opcode.WAIT, semaphore=1, count=3),
        encode(Opcode.HALT),
    ], {40: 0x5A5A}, [])
    sent = [_fields(w) for w in await driver.go_and_receive(2)]
    run = await driver.wait_halt(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert sent == [{"tiles": other, "addr": 77, "data": 0, "write": 0, "last": 1,
                     "signal": 1, "semaphore": 9},
                    {"tiles": other, "addr": 78, "data": 0x5A5A, "write": 1, "last": 1,
                     "signal": 1, "semaphore": 8}], sent
    assert driver.words_sent() == 2, f"{driver.words_sent()} words sent, not 2"


async def _dmas_signal_only_where_asked(driver: TileDriver, own: int, other: int) -> None:
    """A DMA without a completion signal raises no semaphore, and one to another tile
    alone raises no arrival here, whatever semaphores their fields name: both full
    (65 535), any increment would overflow. A local DMA behind them signals when both
    are done."""
    quiet, remote = 9, 10
    await driver.load([
        encode(Opcode.SIGNAL, semaphore=quiet, count=0xFFFF),
        encode(Opcode.SIGNAL, semaphore=remote, count=0xFFFF),
        encode(Opcode.DMA, src=0, dst=40, length=2, tiles=other,
               signal={"enable": 0, "semaphore": quiet}, remote_signal=1,
               remote_semaphore=remote),
        encode(Opcode.DMA, src=0, dst=40, length=2, tiles=own,
               signal={"enable": 0, "semaphore": remote}),
        encode(Opcode.DMA, src=0, dst=0, length=0, tiles=own,
               signal={"enable": 1, "semaphore": 2}),
        encode(Opcode.WAIT, semaphore=2, count=1),
        encode(Opcode.WAIT, semaphore=quiet, count=0xFFFF),
        encode(Opcode.WAIT, semaphore=remote, count=0xFFFF),
        encode(Opcode.HALT)], {}, [])
    sent = [_fields(w) for w in await driver.go_and_receive(2)]
    run = await driver.wait_halt(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert [w["tiles"] for w in sent] == [other, other], sent


async def _long_dma_under_backpressure(driver: TileDriver, own: int, other: int) -> None:
    """300 words (a length past 8 bits) to this tile and another, the network stalling
    half the time: every word written here and sent there, in order."""
    count, src, dst = 300, 1000, 2000
    rng = np.random.default_rng(5)
    words = [int(w) for w in rng.integers(0, 1 << 62, count)]
    await driver.load(_dma_and_wait(src, dst, count, own | other, 3),
                      {src + i: w for i, w in enumerate(words)}, [])
    driver.set_traffic(0.0, 0.5, 7)
    sent = [_fields(w) for w in await driver.go_and_receive(count)]
    run = await driver.wait_halt(20_000)
    driver.set_traffic(0.0, 0.0, 1)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert sent == [{"tiles": other, "addr": dst + i, "data": words[i], "write": 1,
                     "last": int(i == count - 1), "signal": 1, "semaphore": 3}
                    for i in range(count)], "the network words differ"
    assert driver.words_sent() == count, f"{driver.words_sent()} words sent, not {count}"
    # Each word read once and written here once, however long the network held it.
    assert run.counters["spad"] == 2 * count, run.counters
    got, _ = await driver.read([dst + i for i in range(count)])
    assert got == words, "the local copy differs"


async def _dmas_at_alternating_address_bits(driver: TileDriver, own: int,
                                            words: int) -> None:
    """Two local DMAs of three words between addresses of alternating bits (0x1555…
    and 0x2AAA… within the scratchpad), one each way: a wrong bit of a source or
    destination address moves the wrong words."""
    mask = (1 << (words - 1).bit_length()) - 1
    low, high = 0x5555 & mask & ~7, 0xAAAA & mask & ~7  # room for three words
    low, high = min(low, words - 3), min(high, words - 3)
    rng = np.random.default_rng(8)
    source = {a + i: int(rng.integers(0, 1 << 62)) for a in (low, high) for i in range(3)}
    await driver.load([  # (the words at ``high`` are written again before the second)
        encode(Opcode.DMA, src=low, dst=high, length=3, tiles=own,
               signal={"enable": 1, "semaphore": 2}),
        encode(Opcode.WAIT, semaphore=2, count=1),
        encode(Opcode.HALT)], source, [])
    run = await driver.execute(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    got, _ = await driver.read([high + i for i in range(3)])
    assert got == [source[low + i] for i in range(3)], "0x1555... to 0x2AAA... differs"
    await driver.load([
        encode(Opcode.DMA, src=high, dst=low, length=3, tiles=own,
               signal={"enable": 1, "semaphore": 2}),
        encode(Opcode.WAIT, semaphore=2, count=1),
        encode(Opcode.HALT)], {high + i: source[high + i] for i in range(3)}, [])
    run = await driver.execute(10_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    got, _ = await driver.read([low + i for i in range(3)])
    assert got == [source[high + i] for i in range(3)], "0x2AAA... to 0x1555... differs"


async def _longest_local_dma(driver: TileDriver, own: int) -> None:
    """4,095 words (the longest DMA: every bit of its counters) to this tile: each
    word copied, read back in pieces the host port's memories hold."""
    count, src, dst = 4095, 1000, 6000
    rng = np.random.default_rng(6)
    words = [int(w) for w in rng.integers(0, 1 << 62, count)]
    await driver.load(_dma_and_wait(src, dst, count, own, 3),
                      {src + i: w for i, w in enumerate(words)}, [])
    run = await driver.execute(40_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert run.counters["spad"] == 2 * count, run.counters  # each word read and written
    for start in range(0, count, 256):
        got, _ = await driver.read([dst + i for i in range(start, min(count, start + 256))])
        assert got == words[start:start + 256], f"the copy differs from word {start} on"


async def _dma_beside_a_gemm(driver: TileDriver, own: int, other: int) -> None:
    """A DMA to this tile and another while a GEMM streams its operands from the same
    banks: the DMA's reads and writes wait their turns at the banks (a word may leave on
    the network before its local write gets in, or after), and every word still lands
    here and leaves once, in order."""
    count, src, dst = 256, 0, 3000
    rng = np.random.default_rng(9)
    words = {a: int(w) for a, w in enumerate(rng.integers(0, 1 << 62, 1024 + 256))}
    await driver.load([
        gemm(a=0, b=1024, c=0, m=8, k=256, p=8, signal={"enable": 1, "semaphore": 0}),
        encode(Opcode.DMA, src=src, dst=dst, length=count, tiles=own | other,
               signal={"enable": 1, "semaphore": 1}),
        encode(Opcode.WAIT, semaphore=0, count=1),
        encode(Opcode.WAIT, semaphore=1, count=1),
        encode(Opcode.HALT),
    ], words, [])
    sent = [_fields(w) for w in await driver.go_and_receive(count)]
    run = await driver.wait_halt(20_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert run.counters["gemm"] + run.counters["gemm_vec"] > 0
    assert [(w["tiles"], w["addr"], w["data"]) for w in sent] == [
        (other, dst + i, words[src + i]) for i in range(count)], "the DMA's network words differ"
    assert driver.words_sent() == count, f"{driver.words_sent()} words sent, not {count}"
    got, _ = await driver.read([dst + i for i in range(count)])
    assert got == [words[src + i] for i in range(count)], "the DMA's copy differs"


async def _halt_waits_for_every_engine_operation(driver: TileDriver) -> None:
    """Five GEMMs dispatched (one running, the others queued: up to five outstanding)
    and a HALT with no WAIT: the tile reports halted only once all of them are done,
    so its counters hold every GEMM's beats. Five VECs the same way: the program with
    no WAIT takes as long as the one that WAITs for all five, less the WAIT's own few
    cycles (one VEC takes about 35)."""
    gemms, k = 5, 256
    await driver.load([gemm(a=0, b=1024, c=8 * i, m=8, k=k, p=8) for i in range(gemms)]
                      + [HALT], {}, [])
    run = await driver.execute(40_000)
    assert run.error == ErrorCode.NONE and run.engine_error == 0, run
    assert run.counters["tc_beats"] == gemms * k, run.counters
    assert run.counters["macs"] == gemms * 8 * k * 8, run.counters  # m·k·p each
    # Each GEMM writes its 8 result rows, reading none (it does not accumulate).
    assert (run.counters["acc_reads"], run.counters["acc_writes"]) == (0, gemms * 8), \
        run.counters
    vecs = [vec(beats=4, signal={"enable": 1, "semaphore": 2})] * 5
    cycles = []
    for ending in ([HALT], [encode(Opcode.WAIT, semaphore=2, count=len(vecs)), HALT]):
        await driver.load(vecs + ending, {}, [])
        run = await driver.execute(40_000)
        assert run.error == ErrorCode.NONE and run.engine_error == 0, run
        cycles.append(run.counters["cycles"])
        # 8 rows x 4 beats each, into accumulator entries (TILE): LOGIT reads a and c,
        # not b, and writes one entry a beat.
        beats = len(vecs) * 8 * 4
        assert (run.counters["acc_reads"], run.counters["acc_writes"]) == (2 * beats, beats), \
            run.counters
    assert cycles[0] >= cycles[1] - 10, f"HALT after {len(vecs)} VECs: {cycles}"


def _assert_acc_accesses(run, model: TileModel, what: str) -> None:
    """The tile counted the accumulator entries the model reads and writes."""
    got = (run.counters["acc_reads"], run.counters["acc_writes"])
    assert got == (model.acc_reads, model.acc_writes), (
        f"{what}: the tile counted {got} accumulator reads and writes, the model "
        f"{(model.acc_reads, model.acc_writes)}")


async def _register_programs(driver: TileDriver, config: TileConfig, sizes: Sizes) -> None:
    """The register programs of sim.sequencer_cases on the RTL tile: each halts where the
    tile model does, having fetched as many instructions (loops and skips taken at run
    time), with the scratchpad the model ends with (the DMAs' register-stepped
    copies of random words); each register error stops at its instruction; the
    accumulator LOADs read what the model reads (or stop where it stops); random
    register programs end as the model does (the same error, or none, at the same pc,
    after as many fetches) with the same copies."""
    x, y = driver.tile.position
    rng = np.random.default_rng(7)
    words = {a: int(rng.integers(0, 1 << 62)) for a in range(96)}
    words |= {a: 0 for a in range(256, 320)}  # where the DMAs copy them
    words |= loaded_words(config.n, tile_index(x, y))
    for what, program in register_programs(tile_index(x, y), config.n):
        model = TileModel(config.n, spad_words=config.spad_words, acc_depth=config.acc_depth,
                          slots=config.slots, position=(x, y))
        for address, word in words.items():
            model.spad[address] = word
        assert model_outcome(model, program) == "NONE", what
        await driver.load(program, words, [])
        run = await driver.execute(40_000)
        assert (run.error, run.pc) == (ErrorCode.NONE, model.pc), f"{what}: {run}"
        assert run.counters["fetches"] == model.fetches, f"{what}: {run.counters}"
        _assert_acc_accesses(run, model, what)
        back, _ = await driver.read(list(range(256, 320)))
        assert back == model.spad[256:320], f"{what}: the DMAs' copies differ"
    for what, program, error, pc in register_errors(sizes, config.n, config.program_depth):
        await driver.load(program, {}, [])
        run = await driver.execute(20_000)
        assert (run.error.name, run.pc) == (error, pc), f"{what}: {run.error.name} at {run.pc}"
    for what, program, error, pc in acc_load_programs(config.n):
        model = TileModel(config.n, spad_words=config.spad_words, acc_depth=config.acc_depth,
                          slots=config.slots, position=(x, y))
        for address, word in words.items():
            model.spad[address] = word
        assert (model_outcome(model, program), model.pc) == (error, pc), what
        await driver.load(program, words, [])
        run = await driver.execute(20_000)
        assert (run.error.name, run.pc) == (error, pc), f"{what}: {run.error.name} at {run.pc}"
        if error == "NONE":
            _assert_acc_accesses(run, model, what)
    for what, program, spad, error, pc in idma_edges(sizes, config.n):
        model = TileModel(config.n, spad_words=config.spad_words, acc_depth=config.acc_depth,
                          slots=config.slots, position=(x, y), mesh=sizes.mesh)
        ends = [*range(64), *range(config.spad_words - 64, config.spad_words)]
        start = {a: int(rng.integers(0, 1 << 62)) for a in ends} | spad
        start |= {a: 0 for a in range(256, 320)}
        for address, word in start.items():
            model.spad[address] = word
        assert outcome(error) == model_outcome(model, program), what
        await driver.load(program, start, [])
        run = await driver.execute(20_000)
        assert (run.error.name, run.pc) == (error, pc), f"{what}: {run.error.name} at {run.pc}"
        back, _ = await driver.read(list(range(256, 320)))
        assert back == model.spad[256:320], f"{what}: the rows moved differ"
    outcomes = set()
    for index in range(40):
        program = random_register_program(rng, sizes, tile_index(x, y))
        model = TileModel(config.n, spad_words=config.spad_words, acc_depth=config.acc_depth,
                          slots=config.slots, position=(x, y))
        for address, word in words.items():
            model.spad[address] = word
        error = model_outcome(model, program)
        await driver.load(program, words, [])
        run = await driver.execute(400_000)
        assert (outcome(run.error.name), run.pc) == (error, model.pc), \
            f"random program {index}: {run}"
        assert run.counters["fetches"] == model.fetches, \
            f"random program {index}: {run.counters['fetches']} fetches, the model "\
            f"{model.fetches}"
        if error == "NONE":
            _assert_acc_accesses(run, model, f"random program {index}")
        back, _ = await driver.read(list(range(256, 320)))
        assert back == model.spad[256:320], f"random program {index}: the DMAs' copies differ"
        outcomes.add(error)
    assert "NONE" in outcomes and len(outcomes) > 1, outcomes


@cocotb.test()
async def tile_programs(dut):
    """The sequencer's checks on the RTL tile: every bad instruction stops the program
    at its pc with its error and nothing after it runs; regions that end exactly at the
    end of their memory are accepted; a semaphore overflow and running off the end of
    the program memory are errors; every semaphore counts each source of increments
    exactly; register programs end as the tile model does; random instructions at the
    edges of their memories get the verdict the ISA gives them; a HALT's ``next`` is
    where the next go runs from."""
    p = parameters()
    config = TileConfig(**p["config"])
    tile = sim_tile(config)
    driver = TileDriver(dut, tile, harness_depths(config))
    await driver.reset()
    sizes = Sizes(config.spad_words, config.acc_depth, config.slots, tile.mesh,
                  tile.sequencer.memory_channels, tile.sequencer.channel_words)
    for what, bad, error in bad_instructions(sizes):
        await driver.load([gemm(), bad, vec(), HALT], {}, [])
        run = await driver.execute(10_000)
        assert (run.error.name, run.pc) == (error, 1), f"{what}: {run.error.name} at {run.pc}"
        busy = run.counters["vec"] + run.counters["gemm_vec"]
        assert busy == 0, f"{what}: the VEC after it ran"
        coverage.sequencer_error(error)
    cases = [("regions that just fit", fitting_program(sizes), "NONE", None),
             # (the pc of the instruction executing the cycle after, rtl.sequencer)
             *((f"semaphore {s} overflowing", semaphore_overflow(s), "SEMAPHORE_OVERFLOW",
                None) for s in range(SEMAPHORES)),
             *((f"semaphore {s}: three additions in one cycle", coincident_overflow(s),
                "SEMAPHORE_OVERFLOW", None) for s in range(SEMAPHORES)),
             ("off the end", [encode(Opcode.NOP)] * config.program_depth, "PC_OVERFLOW",
              config.program_depth - 1)]
    for what, program, error, pc in cases:
        await driver.load(program, {}, [])
        run = await driver.execute(CYCLES_PER_INSTRUCTION * len(program))
        assert run.error.name == error, f"{what}: {run.error.name} at {run.pc}"
        assert pc is None or run.pc == pc, f"{what}: stopped at {run.pc}, not {pc}"
        assert run.engine_error == 0, f"{what}: engine error flags {run.engine_error:#b}"
    for s, program, halts in semaphore_programs(own=1):
        await driver.load(program, {}, [])
        if halts:
            run = await driver.execute(20_000)
            assert run.error == ErrorCode.NONE, f"semaphore {s}: {run.error.name}"
        else:  # the WAIT for one more than the total blocks; a reset ends the program
            await driver.go()
            await ClockCycles(dut.clk, 3_000)
            assert not driver.halted(), f"semaphore {s} passed a WAIT for more than it has"
            await driver.reset()
    await _halt_waits_for_every_engine_operation(driver)
    await _register_programs(driver, config, sizes)
    rng = np.random.default_rng(p.get("seed", 1))
    for opcode, fields, word, error in (boundary_instructions(sizes, config.n, 1, rng, 400)
                                        + high_bit_instructions(sizes, config.n, 1)):
        await driver.load([word, HALT], {}, [])
        run = await driver.execute(20_000)
        got = (run.error.name, run.pc if error != "NONE" else 0)
        assert got == (error, 0), f"{opcode.name} {fields}: {run.error.name} at {run.pc}"
        assert run.engine_error == 0, f"{opcode.name} {fields}: engine error flags"
    await _halts_chain_programs(driver, config.program_depth)
    report(passed=True)


async def _halts_chain_programs(driver: TileDriver, depth: int) -> None:
    """Each go runs from the ``next`` of the HALT that ended the run before: two
    programs chained in one memory; a ``next`` past the memory stops at its HALT with
    PC_OVERFLOW, and the go after that error runs from pc 0."""
    await driver.load([encode(Opcode.HALT, next=2), HALT, vec(), encode(Opcode.HALT, next=5),
                       HALT, encode(Opcode.HALT, next=depth)], {}, [])
    for pc, error, vec_ran in ((0, "NONE", False), (3, "NONE", True), (5, "PC_OVERFLOW", False),
                               (0, "NONE", False)):
        run = await driver.execute(20_000)
        got = (run.pc, run.error.name, run.counters["vec"] + run.counters["gemm_vec"] > 0)
        assert got == (pc, error, vec_ran), f"chained programs: {got}, not {(pc, error, vec_ran)}"


