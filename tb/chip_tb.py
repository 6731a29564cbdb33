"""cocotb tests of a chip in a StreamHarness (see tests/test_chip.py and sim/chip_run.py)."""

from __future__ import annotations

import math
import pickle
from functools import partial
from pathlib import Path

import cocotb
import numpy as np

from compiler.chip import HeldWords, changed, first_memory, first_programs
from rtl.scratchpad import KvOp
from rtl.sequencer import ErrorCode
from sim import coverage
from sim.chip_driver import ChipDriver
from sim.chip_run import chip_from_config, chip_from_json, harness_depths
from sim.faults import FaultInjector, FaultPlan
from sim.runner import parameters, report
from spec.isa import DmaTarget, Opcode, decode, encode

#: Cycles a program may take per instruction before the run is declared hung.
CYCLES_PER_INSTRUCTION = 400


async def _driver(dut) -> tuple[ChipDriver, object]:
    p = parameters()
    config = chip_from_json(p["chip"])
    chip = chip_from_config(config, shared_tile=True,
                            fault_injection=p.get("fault_injection", False))
    driver = ChipDriver(dut, chip, harness_depths(config))
    await driver.reset()
    return driver, config


@cocotb.test()
async def chip_network(dut):
    """DMAs between tiles over the mesh: a unicast there and back, a multicast to three
    tiles; semaphores released by arrivals; the words land where they were sent."""
    driver, config = await _driver(dut)
    last = config.tiles - 1
    others = [t for t in range(1, config.tiles)]
    words = [(0x1111111111111111 * (i + 1)) & ((1 << 64) - 1) for i in range(5)]
    dma = dict(remote_signal=1)
    programs = {
        0: [encode(Opcode.DMA, src=100, dst=200, length=5, tiles=config.mask(last),
                   remote_semaphore=3, **dma),
            encode(Opcode.DMA, src=100, dst=300, length=1,
                   tiles=sum(config.mask(t) for t in others), remote_semaphore=4, **dma),
            encode(Opcode.WAIT, semaphore=5, count=1),
            encode(Opcode.HALT)],
        last: [encode(Opcode.WAIT, semaphore=3, count=1),
               encode(Opcode.WAIT, semaphore=4, count=1),
               encode(Opcode.DMA, src=200, dst=400, length=5, tiles=config.mask(0),
                      remote_semaphore=5, **dma),
               encode(Opcode.HALT)],
    }
    for t in others[:-1]:
        programs[t] = [encode(Opcode.WAIT, semaphore=4, count=1), encode(Opcode.HALT)]
    writes = {0: {100 + i: w for i, w in enumerate(words)}}
    await driver.load_tiles({t: (dict(enumerate(p)), writes.get(t, {}), [])
                             for t, p in programs.items()})
    run = await driver.run_tiles(sorted(programs), 20_000)
    for t, e in run.tiles.items():
        assert e.error == ErrorCode.NONE and e.engine_error == 0, (t, e)
    got = await driver.read_tiles({0: [400 + i for i in range(5)],
                                   **{t: [300] for t in others[:-1]},
                                   last: [200 + i for i in range(5)] + [300]})
    assert got[0] == words and got[last] == words + words[:1], got
    assert all(got[t] == words[:1] for t in others[:-1]), got
    net = driver.net_counters()
    assert sum(c["dropped_in"] + c["dropped_out"] for c in net) == 0, net
    assert int(dut.error.value) == 0
    report(passed=True, cycles=run.cycles, net=net)


@cocotb.test()
async def chip_memory(dut):
    """STORE and LOAD DMAs through the memory channels: a tile stores words in both
    channels, fences, tells another tile, and both read the words back; the tile beside
    channel 0 stores and loads through its own node; a STORE to a channel the chip lacks
    stops its tile with BAD_TILE. The host writes words into channel 1's store
    beforehand (the memory image) and tile 0 loads them; a host word for a channel the
    chip lacks raises the chip's error."""
    driver, config = await _driver(dut)
    assert len(config.memory_nodes) == 2 and config.tiles == 4
    mask = 1 << (8 * config.tile.n) - 1
    words = [(0x0123456789ABCDEF * (i + 3)) & mask for i in range(20)]
    store, load = dict(target=DmaTarget.STORE), dict(target=DmaTarget.LOAD, remote_signal=1)
    dma, wait = partial(encode, Opcode.DMA), partial(encode, Opcode.WAIT)
    programs = {
        1: [dma(src=100, length=20, channel=0, mem_addr=1000, **store),
            dma(src=105, length=5, channel=1, mem_addr=50, **store),
            dma(channel=0, remote_semaphore=2, **load),  # fences: the words are stored
            dma(channel=1, remote_semaphore=2, **load),
            wait(semaphore=2, count=2),
            dma(tiles=config.mask(3), remote_signal=1, remote_semaphore=3),
            dma(dst=300, length=20, channel=0, mem_addr=1000, remote_semaphore=4, **load),
            wait(semaphore=4, count=1), encode(Opcode.HALT)],
        3: [wait(semaphore=3, count=1),
            dma(dst=200, length=5, channel=1, mem_addr=50, remote_semaphore=5, **load),
            dma(dst=400, length=20, channel=0, mem_addr=1000, remote_semaphore=5, **load),
            wait(semaphore=5, count=2), encode(Opcode.HALT)],
        0: [dma(src=100, length=3, channel=0, mem_addr=3000, **store),
            dma(dst=500, length=3, channel=0, mem_addr=3000, remote_semaphore=6, **load),
            dma(dst=600, length=12, channel=1, mem_addr=2000, remote_semaphore=6, **load),
            wait(semaphore=6, count=2), encode(Opcode.HALT)],
        2: [dma(src=100, length=1, channel=2, **store), encode(Opcode.HALT)],
    }
    writes = {t: {100 + i: w for i, w in enumerate(words)} for t in (0, 1)}
    image = [(w * 7 + 1) & mask for w in words[:12]]
    await driver.write_memory({1: dict(enumerate(image, 2000))})
    await driver.load_tiles({t: (dict(enumerate(p)), writes.get(t, {}), [])
                             for t, p in programs.items()})
    run = await driver.run_tiles(sorted(programs), 20_000)
    assert run.tiles[2].error == ErrorCode.BAD_TILE and run.tiles[2].pc == 0, run.tiles[2]
    for t in (0, 1, 3):
        assert run.tiles[t].error == ErrorCode.NONE and run.tiles[t].engine_error == 0, t
    got = await driver.read_tiles({1: [300 + i for i in range(20)],
                                   3: [200 + i for i in range(5)] + [400 + i for i in range(20)],
                                   0: [500 + i for i in range(3)] + [600 + i for i in range(12)]})
    assert got[1] == words and got[3] == words[5:10] + words, got
    assert got[0] == words[:3] + image, got
    memory = driver.memory_counters()
    assert memory == [{"reads": 20 + 20 + 3, "writes": 20 + 3, "requests": 2 + 1 + 1,
                       "dropped": 0},
                      {"reads": 5 + 12, "writes": 5, "requests": 2 + 1, "dropped": 0}], memory
    assert int(dut.error.value) == 0
    await driver.memory_beats([{"channel": 2, "addr": 0, "data": 1}])
    assert int(dut.error.value) == 1 and driver.memory_counters() == memory
    report(passed=True, cycles=run.cycles, memory=memory)


@cocotb.test()
async def chip_stream(dut):
    """``words`` scratchpad words from each tile of ``senders`` to the tile in
    ``receivers`` at the same index, in DMAs of at most ``chunk`` words, every pair at
    once (each receiver WAITs for its DMAs' signals): the words land in order, and the
    report has the cycles from go to the last halt (what moving a KV cache costs)."""
    driver, config = await _driver(dut)
    p = parameters()
    words, chunk = p["words"], p["chunk"]
    pairs = list(zip(p["senders"], p["receivers"], strict=True))
    base, mask = 1000, (1 << 8 * config.tile.n) - 1
    dmas = math.ceil(words / chunk)
    programs, writes, sent = {}, {}, {}
    for src, dst in pairs:
        data = [(0x9E3779B97F4A7C15 * (src * words + i + 1)) & mask for i in range(words)]
        sent[dst] = data
        writes[src] = {base + i: w for i, w in enumerate(data)}
        programs[src] = [encode(Opcode.DMA, src=base + s, dst=base + s,
                                length=min(chunk, words - s), tiles=config.mask(dst),
                                remote_signal=1, remote_semaphore=3)
                         for s in range(0, words, chunk)] + [encode(Opcode.HALT)]
        programs[dst] = [encode(Opcode.WAIT, semaphore=3, count=dmas), encode(Opcode.HALT)]
    await driver.load_tiles({t: (dict(enumerate(prog)), writes.get(t, {}), [])
                             for t, prog in programs.items()})
    run = await driver.run_tiles(sorted(programs), 100 * words + 1_000)
    for t, e in run.tiles.items():
        assert e.error == ErrorCode.NONE and e.engine_error == 0, (t, e)
    got = await driver.read_tiles({dst: [base + i for i in range(words)] for dst in sent})
    assert got == sent
    report(passed=True, cycles=run.cycles)


def _sample_coverage(rnd, workload, config) -> None:
    """Functional coverage of a round whose outputs were all bit-exact."""
    from golden.workloads import get_workload

    for load in rnd.loads.values():
        coverage.sample_program([decode(w) for w in load.instructions], config.tile.n)
    if rnd.phase.endswith("proj"):
        return
    if rnd.phase.endswith("moe"):
        coverage.moe_load(rnd.summaries[0]["expert_load"])
        coverage.moe_ties(rnd.summaries[0]["tied"])
        return
    cfg = get_workload(workload) if isinstance(workload, str) else workload
    coverage.attention_gqa(cfg.heads, cfg.kv_heads)
    phase = "decode" if rnd.phase == "decode" else "prefill"  # an extend is a prefill too
    for context in rnd.contexts:
        coverage.attention_context(phase, context, cfg.page_size)


@cocotb.test()
async def chip_layer(dut):
    """A decoder layer (attention, then MoE unless ``moe`` is off) for a batch on the
    chip (the rounds ``sim.chip_run.simulate_layer`` compiled, from the file it names):
    every output bit-exact with golden; per round the cycles, counters and network
    traffic. With ``faults`` (a :class:`sim.faults.FaultPlan`), bits of stored words
    flip before each round (:class:`sim.faults.FaultInjector`); a double-bit fault read
    back stops the run, reported as ``faults["stopped"]``."""
    p = parameters()
    driver, config = await _driver(dut)
    from golden.workloads import WorkloadConfig

    workload = p["workload"]
    if isinstance(workload, dict):
        workload = WorkloadConfig.from_json(workload)
    progress = open(p["progress"], "a") if p.get("progress") else None  # noqa: SIM115
    dumped: dict[str, tuple] = {}  # --dump: group -> (workload, expected, RTL outputs)
    with open(p["rounds"], "rb") as file:
        rounds = pickle.load(file)
    faults = (FaultInjector(FaultPlan(**p["faults"]), config.k, config.tile.n)
              if p.get("faults") else None)
    out = []
    # A word's cycles at one channel's bandwidth (the timeout if every load is one's).
    memory_cycles = (math.ceil(config.tile.n * len(config.memory_nodes)
                               / config.memory_bytes_per_cycle)
                     if config.memory_nodes else 0)
    # Every round's program, where compiler.chip.place_programs put it, once before the
    # first round (outside the rounds and the phases, like the memory image); each
    # round then writes the words it changes.
    resident = first_programs(rounds)
    began = driver.host_cycles
    await driver.load_tiles({t: (words, {}, []) for t, words in resident.items()})
    programs_once = {"words": sum(map(len, resident.values())),
                     "host_cycles": driver.host_cycles - began}
    # The memory image (the MoE layer's weights), once before the first round too.
    written = first_memory(rounds)  # what the channels hold
    began = driver.host_cycles
    if any(written.values()):
        await driver.write_memory(written)
    memory_once = {"words": sum(map(len, written.values())),
                   "host_cycles": driver.host_cycles - began}
    # The scratchpad words each tile still holds from the host: it writes the others.
    # Under faults it writes every word (a held word may carry an injected flip).
    holding = None if faults else HeldWords(config)
    for index, rnd in enumerate(rounds):
        # Far placement's KV pages: the words that changed since the round before (the
        # step's KV appends, a context the run starts from), through the memory port.
        pages = changed(written, rnd.kv_image)
        began = driver.host_cycles
        if any(pages.values()):
            await driver.write_memory(pages)
        host_cycles = {"kv_image": driver.host_cycles - began}
        # The instruction words that differ from what the tile holds.
        programs = changed(resident, {t: ld.image() for t, ld in rnd.loads.items()})
        spad = (holding.load(rnd) if holding
                else {t: ld.spad_writes for t, ld in rnd.loads.items()})
        began = driver.host_cycles
        await driver.load_tiles({t: (programs[t], spad[t], ld.kv_requests)
                                 for t, ld in rnd.loads.items()})
        host_cycles["load"] = driver.host_cycles - began
        if faults:
            await faults.inject(driver, index, rnd.loads)
        before, memory_before = driver.net_counters(), driver.memory_counters()
        longest = max(len(ld.instructions) + ld.looped + 1 for ld in rnd.loads.values())
        run = await driver.run_tiles(sorted(rnd.loads), CYCLES_PER_INSTRUCTION * longest
                                     + memory_cycles * (rnd.memory_words + rnd.stored_words)
                                     + 20_000,
                                     sample=p.get("profile") or 0)
        if faults and faults.check_round(driver, index):
            report(passed=False, rounds=out, programs_once=programs_once,
                   memory_once=memory_once,
                   faults=faults.summary())
            return
        if holding:
            holding.ran(rnd)
        for t, e in run.tiles.items():
            assert e.error == ErrorCode.NONE, f"round {index}: tile {t} {e.error.name} at pc {e.pc}"
            assert e.engine_error == 0, f"round {index}: tile {t} engine errors {e.engine_error:#b}"
        # The tiles' MAC counters (32 bits each) add up to what the programs dispatch.
        counted = sum(e.counters["macs"] for e in run.tiles.values())
        assert counted % (1 << 32) == rnd.macs % (1 << 32), (
            f"round {index} ({rnd.phase}): the tiles counted {counted} MACs, the programs "
            f"dispatch {rnd.macs}")
        # And their accumulator accesses (the access model's energy) to the operations'.
        for name, expected in (("acc_reads", rnd.acc_reads), ("acc_writes", rnd.acc_writes)):
            counted = sum(e.counters[name] for e in run.tiles.values())
            assert counted % (1 << 32) == expected % (1 << 32), (
                f"round {index} ({rnd.phase}): the tiles counted {counted} {name}, the "
                f"programs' operations make {expected}")
        began = driver.host_cycles
        try:
            await _check_outputs(driver, index, rnd, dumped if p.get("dump") else None)
        except AssertionError as wrong:
            if not faults:
                raise
            faults.stop(f"under single-bit faults, {wrong}")
        host_cycles["read"] = driver.host_cycles - began
        if faults and (faults.stopped or await faults.scrub(driver, index)):
            report(passed=False, rounds=out, programs_once=programs_once,
                   memory_once=memory_once,
                   faults=faults.summary())
            return
        _sample_coverage(rnd, workload, config)
        after = driver.net_counters()
        flits = sum(a["sent"] - b["sent"] for a, b in zip(after, before, strict=True))
        router_links = [(a["links"] - b["links"]) % (1 << 32)
                        for a, b in zip(after, before, strict=True)]
        assert sum(a["dropped_in"] + a["dropped_out"] for a in after) == 0, after
        channels = [{name: a[name] - b[name] for name in ("reads", "writes", "dropped")}
                    for a, b in zip(driver.memory_counters(), memory_before, strict=True)]
        memory = {name: sum(c[name] for c in channels) for name in ("reads", "writes", "dropped")}
        assert memory == {"reads": rnd.memory_words, "writes": rnd.stored_words,
                          "dropped": 0}, (
            f"round {index} ({rnd.phase}): the memory channels counted {memory}, the "
            f"programs load {rnd.memory_words} words and store {rnd.stored_words}")
        out.append(_round_record(rnd, run, flits, programs, spad, pages, host_cycles) | {
            "link_flits": sum(router_links), "router_link_flits": router_links,
            "channel_reads": [c["reads"] for c in channels],
            "channel_writes": [c["writes"] for c in channels],
            **({"pc_samples": {t: sorted(c.items()) for t, c in run.pcs.items()}}
               if run.pcs else {})})
        if progress:
            progress.write(f"round {index + 1}/{len(rounds)} {rnd.phase} at contexts "
                           f"{list(rnd.contexts)}: {run.cycles} cycles, outputs bit-exact "
                           f"({run.wall_s:.1f} s)\n")
            progress.flush()
    assert int(dut.error.value) == 0
    if p.get("dump"):
        _dump(Path(p["dump"]), dumped)
    report(passed=True, rounds=out, programs_once=programs_once, memory_once=memory_once,
           **({"faults": faults.summary()} if faults else {}))


async def _check_outputs(driver: ChipDriver, index: int, rnd, dumped: dict | None) -> None:
    """Read every job's output words back and compare them with golden, bit for bit;
    with ``dumped`` (``--dump``), keep each job's golden and RTL outputs there."""
    words = await driver.read_tiles(
        {t: [a for job in rnd.jobs if job.tile == t for a in job.program.output_words]
         for t in {job.tile for job in rnd.jobs}})
    for job in rnd.jobs:
        got_words = dict(zip([a for j in rnd.jobs if j.tile == job.tile
                              for a in j.program.output_words], words[job.tile],
                             strict=True))
        got = job.program.read_output(got_words.__getitem__)
        wrong = np.argwhere(got != job.expected)
        what = ("the MoE output" if job.sequence < 0 else
                f"sequence {job.sequence} KV head {job.kv_head}")
        assert wrong.size == 0, (
            f"round {index} ({rnd.phase}, contexts {rnd.contexts}): {what} on tile "
            f"{job.tile}: {len(wrong)} of {got.size} outputs differ from golden, first "
            f"at {tuple(wrong[0])}")
        if dumped is not None:
            group, name = _dump_name(index, rnd, job)
            _, expected, actual = dumped.setdefault(group, (job.inputs, {}, {}))
            expected[name], actual[name] = job.expected, got


def _round_record(rnd, run, flits: int, programs: dict[int, dict[int, int]],
                  spad: dict[int, dict[int, int]], pages: dict[int, dict[int, int]],
                  host_cycles: dict[str, int]) -> dict:
    """What the result says of a round: cycles, per-tile counters, work and traffic;
    ``programs`` and ``spad``, the instruction and scratchpad words the host wrote for
    it, ``pages`` the far KV page words it wrote into the memory channels (KV appends,
    as local placement's through the tiles' KV ports); ``host_cycles``, the cycles the
    host took to write the pages (``kv_image``), load the round (``load``) and read its
    outputs back (``read``), measured by the harness."""
    older = sum(a in rnd.kv_image_older.get(c, ()) for c, words in pages.items()
                for a in words)
    return {"phase": rnd.phase, "contexts": list(rnd.contexts), "cycles": run.cycles,
            "tiles": {t: e.counters for t, e in run.tiles.items()},
            "outputs": sum(int(j.expected.size) for j in rnd.jobs),
            "jobs": len(rnd.jobs), "macs": rnd.macs, "kv_bytes": rnd.kv_bytes,
            "tokens": rnd.tokens * len(rnd.contexts),
            "network_words": rnd.network_words, "flits": flits, "wall_s": run.wall_s,
            # What the host wrote into the tiles before the round and read back after
            # it, outside the round's cycles, and the host port's cycles for each.
            "host_words": {
                "program": sum(map(len, programs.values())),
                "scratchpad": sum(map(len, spad.values())),
                "kv": sum(r["op"] == KvOp.APPEND for ld in rnd.loads.values()
                          for r in ld.kv_requests) + sum(map(len, pages.values())),
                "kv_setup": sum(ld.kv_setup for ld in rnd.loads.values()) + older,
                "attention": sum(a in rnd.loads[t].attention_words
                                 for t, words in spad.items() for a in words),
                "output": sum(len(job.program.output_words) for job in rnd.jobs)},
            "host_cycles": host_cycles,
            **({key: rnd.summaries[0][key] for key in ("dispatch", "macs_sparse",
                                                       "executed_over_sparse", "tokens",
                                                       "expert_load")
                if key in rnd.summaries[0]}
               if rnd.phase.endswith(("moe", "proj")) else {})}


def _dump_name(index: int, rnd, job) -> tuple[str, str]:
    """Where ``--dump`` files a job's output: (directory, output name). Attention jobs go
    with their sequence's workload, each projection and MoE round with its own (its
    token count): ``proj-rNN``, ``moe-rNN``."""
    if job.sequence < 0:
        return f"{rnd.phase.partition('-')[2]}-r{index:02d}", f"r{index:02d}.{rnd.phase}.out"
    return (f"seq{job.sequence}", f"r{index:02d}.{rnd.phase}.ctx{rnd.contexts[job.sequence]}"
                                  f".kvhead{job.kv_head}.out")


def _dump(root: Path, dumped: dict[str, tuple]) -> None:
    """Every group as a golden workload directory (golden.io: inputs, weights, scales;
    golden outputs under expected/) plus the RTL's outputs under rtl/."""
    from golden.io import save_expected, save_outputs, save_workload

    for group, (workload, expected, actual) in dumped.items():
        save_workload(workload, root / group)
        save_expected(root / group, expected)
        save_outputs(root / group / "rtl", actual)
