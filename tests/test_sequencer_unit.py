"""The tile sequencer and the ISA, in the Amaranth simulator with modelled engines; its
registers, loops and WITH against the tile's functional model (golden.tile_model): the
same operations dispatched with the same fields, the same error at the same pc."""

from __future__ import annotations

from enum import Enum as PyEnum

import numpy as np
import pytest
from amaranth import Shape
from amaranth.lib import data
from amaranth.sim import Simulator

from compiler.hazards import accesses, check_synchronisation, executed_ops
from golden.tile_model import TileModel
from golden.vector_model import VectorOpcode as VOP
from rtl.accumulator import LANE_BITS
from rtl.sequencer import ErrorCode, Sequencer
from sim import coverage
from sim.runner import run_amaranth
from sim.sequencer_cases import (
    HALT,
    Sizes,
    bad_instructions,
    boundary_instructions,
    dma,
    fitting_program,
    gemm,
    high_bit_instructions,
    idma_edges,
    loaded_words,
    model_outcome,
    op,
    outcome,
    random_register_program,
    register_errors,
    register_programs,
    semaphore_overflow,
    vec,
    with_,
)
from spec.isa import (
    ARGS_OF,
    INSTRUCTION,
    WITH_FIELDS,
    Opcode,
    VecArgs,
    VecDst,
    VecPack,
    decode,
    encode,
)

WORDS = 4096
ENTRIES = 256
SLOTS = 16
CHANNELS, CHANNEL_WORDS = 2, 1000
SIZES = Sizes(WORDS, ENTRIES, SLOTS, (2, 2), CHANNELS, CHANNEL_WORDS)


async def write_program(ctx, dut, program) -> None:
    """Write ``program`` into the sequencer's instruction memory from pc 0."""
    for address, word in enumerate(program):
        ctx.set(dut.program.payload.address, address)
        ctx.set(dut.program.payload.word, word)
        ctx.set(dut.program.valid, 1)
        await ctx.tick().until(dut.program.ready)
    ctx.set(dut.program.valid, 0)


def run(program, *, depth=64, arrivals=(), engine_delay=5, ready_every=1, max_cycles=2000,
        rng=None, spad=None, bad_words=(), acc=None):
    """Run ``program``; engines take a command when the cycle count is a multiple of
    ``ready_every`` and report it done ``engine_delay`` cycles later (with ``rng``: ready
    at random, done 1 to 12 cycles later). ``arrivals``: (cycle, semaphore) network
    arrivals. A LOAD's word comes from ``spad`` (address -> word, else 0) two cycles
    after its request, uncorrectable at ``bad_words``; an accumulator LOAD's entry from
    ``acc`` (entry -> N lane values, else zeros) the cycle after its read. Returns the
    trace (``dispatched`` and ``done`` cycles, ``loads``: the addresses read,
    ``acc_reads``: (cycle, entry) of accumulator reads, ``fetches``: cycles the
    instruction memory was read) and the status."""
    dut = Sequencer(array_size=8, scratchpad_words=WORDS, acc_depth=ENTRIES, slots=SLOTS,
                    mesh=(2, 2), program_depth=depth, memory_channels=CHANNELS,
                    channel_words=CHANNEL_WORDS)
    trace = {"dispatched": [], "done": [], "halted_at": None, "loads": [], "acc_reads": [],
             "fetches": 0}
    spad, acc = spad or {}, acc or {}
    sim = Simulator(dut)
    sim.add_clock(1e-8)

    async def bench(ctx):
        await write_program(ctx, dut, program)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        pending = []  # (cycle due, engine, signal)
        reads = []  # (cycle due, address) of LOADs
        ctx.set(dut.spad_req.ready, 1)
        for cycle in range(max_cycles):
            due = [a for c, a in reads if c <= cycle][:1]
            ctx.set(dut.spad_resp.valid, bool(due))
            if due:
                ctx.set(dut.spad_resp.payload.data, 0 if due[0] in bad_words
                        else spad.get(due[0], 0))
                ctx.set(dut.spad_resp.payload.status.uncorrectable, due[0] in bad_words)
                if ctx.get(dut.spad_resp.ready):
                    reads = reads[1:]
            if ctx.get(dut.spad_req.valid):
                address = ctx.get(dut.spad_req.payload.addr)
                trace["loads"].append(address)
                reads.append((cycle + 2, address))
            trace["fetches"] += ctx.get(dut.fetching)
            if ctx.get(dut.acc_read):  # the entry arrives after this cycle's edge
                entry = ctx.get(dut.acc_addr)
                trace["acc_reads"].append((cycle, entry))
                ctx.set(dut.acc_data.as_value(), sum(
                    (lane & (1 << LANE_BITS) - 1) << (LANE_BITS * i)
                    for i, lane in enumerate(acc.get(entry, [0] * 8))))
            ready = cycle % ready_every == 0 if rng is None else rng.random() < 0.7
            for name in ("gemm", "vec", "dma"):
                ctx.set(getattr(dut, name).ready, ready)
                done = getattr(dut, f"{name}_done")
                due = [p for p in pending if p[0] == cycle and p[1] == name]
                ctx.set(done.valid, bool(due))
                if due:
                    trace["done"].append((cycle, name))
                    ctx.set(done.payload.enable, due[0][2]["enable"])
                    ctx.set(done.payload.semaphore, due[0][2]["semaphore"])
            arrival = [s for c, s in arrivals if c == cycle]
            ctx.set(dut.arrival.valid, bool(arrival))
            if arrival:
                ctx.set(dut.arrival.payload, arrival[0])
            for name in ("gemm", "vec", "dma"):
                stream = getattr(dut, name)
                if ctx.get(stream.valid) and ready:
                    args = decode_payload(ctx.get(stream.payload.as_value()), name)
                    trace["dispatched"].append((cycle, name, args))
                    # One done per cycle per engine: later commands finish later.
                    last = max([p[0] for p in pending if p[1] == name], default=cycle)
                    delay = engine_delay if rng is None else int(rng.integers(1, 13))
                    pending.append((max(cycle + delay, last + 1), name, args["signal"]))
            await ctx.tick()
            if ctx.get(dut.status.halted):
                trace["halted_at"] = cycle
                break
        trace["status"] = {
            "running": ctx.get(dut.status.running),
            "halted": ctx.get(dut.status.halted),
            "error": ErrorCode(ctx.get(dut.status.error)),
            "pc": ctx.get(dut.status.pc),
        }
        trace["semaphores"] = [ctx.get(dut.semaphores[i]) for i in range(16)]

    sim.add_testbench(bench)
    run_amaranth(sim)
    return trace


def decode_payload(raw: int, name: str) -> dict:
    """The command payload is the instruction's argument field: re-wrap and decode it."""
    opcode = {"gemm": Opcode.GEMM, "vec": Opcode.VEC, "dma": Opcode.DMA}[name]
    return decode(opcode.value | (raw << 4))[1]


def test_program_dispatches_in_order_with_exact_fields():
    program = [
        encode(Opcode.SIGNAL, semaphore=1, count=2),
        gemm(signal={"enable": 1, "semaphore": 0}, a_rows=1, accumulate=1, acc_shift=7),
        vec(signal={"enable": 1, "semaphore": 0}),
        dma(tiles=0x303, remote_signal=1, remote_semaphore=7),  # all four tiles of 2 x 2
        encode(Opcode.WAIT, semaphore=0, count=2),
        encode(Opcode.WAIT, semaphore=1, count=2),
        encode(Opcode.NOP),
        HALT,
    ]
    trace = run(program)
    assert [name for _, name, _ in trace["dispatched"]] == ["gemm", "vec", "dma"]
    for (_, _, args), word in zip(trace["dispatched"], program[1:4], strict=True):
        assert args == decode(word)[1]
    assert trace["status"] == {"running": 0, "halted": 1, "error": ErrorCode.NONE, "pc": 7}
    assert trace["semaphores"][0] == 0 and trace["semaphores"][1] == 0
    coverage.sample_program([decode(word) for word in program], 8)


#: The semaphore each engine signals in the random programs.
ENGINE_SEMAPHORE = {"GEMM": 0, "VEC": 1, "DMA": 2}


def random_program(rng, count: int) -> list:
    """``count`` random GEMM, VEC and DMA operations over small overlapping regions, each
    signalling its engine's semaphore, with a WAIT before every operation that depends
    (RAW, WAR or WAW) on an unfinished operation of another engine; then HALT."""
    def some(low, high):
        return int(rng.integers(low, high))

    ops, pending = [], {engine: [] for engine in ENGINE_SEMAPHORE}  # unwaited accesses
    for _ in range(count):
        engine = str(rng.choice(list(ENGINE_SEMAPHORE)))
        if engine == "GEMM":
            fields = {"a": some(0, 48), "b": some(0, 48), "c": some(0, 96), "m": some(1, 9),
                      "k": some(1, 17), "p": some(1, 9), "accumulate": some(0, 2)}
        elif engine == "VEC":
            fields = {"op": int(rng.choice([VOP.ADD, VOP.MAX, VOP.EXP, VOP.REQUANT])),
                      "a": some(0, 96), "b": some(0, 96), "c": some(0, 96), "dst": some(0, 48),
                      "rows": some(1, 9), "beats": some(1, 3),
                      "dst_kind": int(rng.choice(list(VecDst)).value)}
        else:
            fields = {"src": some(0, 48), "dst": some(0, 48), "length": some(1, 9), "tiles": 1}
        fields["signal"] = {"enable": 1, "semaphore": ENGINE_SEMAPHORE[engine]}
        reads, writes = accesses(Opcode[engine], fields, 8)
        for other, unwaited in pending.items():
            clash = any(reads & w or writes & r or writes & w for r, w in unwaited)
            if unwaited and (len(unwaited) == 8 or other != engine and clash):
                ops.append((Opcode.WAIT, {"semaphore": ENGINE_SEMAPHORE[other],
                                          "count": len(unwaited)}))
                unwaited.clear()
        ops.append((Opcode[engine], fields))
        pending[engine].append((reads, writes))
    for other, unwaited in pending.items():
        if unwaited:
            ops.append((Opcode.WAIT, {"semaphore": ENGINE_SEMAPHORE[other],
                                      "count": len(unwaited)}))
    ops.append((Opcode.HALT, {}))
    check_synchronisation(ops, 8)  # the generator's own check
    return ops


def test_random_programs_respect_every_wait(seed):
    """Random programs with cross-engine dependencies, engines that accept and finish at
    random: operations dispatch in program order with their exact fields, and none
    dispatches before the operations it depends on (its WAITs) have finished."""
    rng = np.random.default_rng(seed + 40)
    ops = random_program(rng, 40)
    program = [encode(op, **fields) for op, fields in ops]
    trace = run(program, depth=128, max_cycles=6000, rng=rng)
    assert trace["status"] == {"running": 0, "halted": 1, "error": ErrorCode.NONE,
                               "pc": len(program) - 1}
    engine_ops = [(i, op.name, f) for i, (op, f) in enumerate(ops)
                  if op.name in ENGINE_SEMAPHORE]
    assert [name.upper() for _, name, _ in trace["dispatched"]] == [n for _, n, _ in engine_ops]
    dispatched, done = {}, {}
    nth = {engine: 0 for engine in ENGINE_SEMAPHORE}
    finish = {e: [c for c, name in trace["done"] if name.upper() == e] for e in ENGINE_SEMAPHORE}
    for (cycle, _, args), (index, name, _) in zip(trace["dispatched"], engine_ops, strict=True):
        assert args == decode(program[index])[1]
        dispatched[index], done[index] = cycle, finish[name][nth[name]]
        nth[name] += 1
    for j, (index, name, fields) in enumerate(engine_ops):
        reads, writes = accesses(Opcode[name], fields, 8)
        for earlier, other, f in engine_ops[:j]:
            r, w = accesses(Opcode[other], f, 8)
            if other != name and (reads & w or writes & r or writes & w):
                assert done[earlier] < dispatched[index], \
                    f"op {index} ({name}) dispatched before op {earlier} ({other}) finished"
    assert trace["semaphores"][:3] == [0, 0, 0]
    coverage.sample_program(ops, 8)


def test_wait_blocks_until_a_network_arrival():
    program = [encode(Opcode.WAIT, semaphore=5, count=1), gemm(), HALT]
    trace = run(program, arrivals=[(60, 5)])
    (cycle, name, _), = trace["dispatched"]
    assert name == "gemm" and cycle > 60
    assert trace["status"]["error"] == ErrorCode.NONE


def test_halt_waits_for_dispatched_operations_to_finish():
    trace = run([gemm(), HALT], engine_delay=40)
    dispatched_at = trace["dispatched"][0][0]
    assert trace["halted_at"] >= dispatched_at + 40


def test_backpressure_delays_but_loses_nothing():
    program = [gemm(m=i + 1) for i in range(6)] + [vec(rows=i + 1) for i in range(6)] + [HALT]
    trace = run(program, ready_every=3)
    assert [args.get("m", args.get("rows")) for _, _, args in trace["dispatched"]] == [
        1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6
    ]


@pytest.mark.parametrize(("what", "bad", "error"), bad_instructions(SIZES),
                         ids=[what for what, _, _ in bad_instructions(SIZES)])
def test_bad_instruction_stops_cleanly(what, bad, error):
    program = [gemm(), bad, vec(), HALT]
    trace = run(program)
    assert [name for _, name, _ in trace["dispatched"]] == ["gemm"]  # nothing after it
    assert trace["status"] == {"running": 0, "halted": 1, "error": ErrorCode[error],
                               "pc": 1}
    coverage.sequencer_error(error)


def test_regions_that_just_fit_are_accepted():
    trace = run(fitting_program(SIZES))
    assert trace["status"]["error"] == ErrorCode.NONE


def test_semaphore_overflow_is_an_error():
    trace = run(semaphore_overflow())
    assert trace["status"]["error"] == ErrorCode.SEMAPHORE_OVERFLOW
    assert trace["semaphores"][3] == 0xFFFF  # kept, not wrapped
    coverage.sequencer_error("SEMAPHORE_OVERFLOW")


def test_a_halt_names_where_the_next_start_runs_from():
    """Each start runs from the ``next`` of the HALT that ended the run before (a tile's
    programs chained in its memory, the host writing none of them again); a HALT whose
    ``next`` is past the memory stops there with PC_OVERFLOW, and the start after a run
    that stopped with an error runs from pc 0. The tile model starts where it does."""
    depth = 8
    program = [encode(Opcode.HALT, next=2), encode(Opcode.HALT), encode(Opcode.NOP),
               encode(Opcode.HALT, next=5), encode(Opcode.NOP),
               encode(Opcode.HALT, next=depth), encode(Opcode.NOP), encode(Opcode.NOP)]
    dut = Sequencer(array_size=8, scratchpad_words=WORDS, acc_depth=ENTRIES, slots=SLOTS,
                    mesh=(2, 2), program_depth=depth)
    stops = []

    async def bench(ctx):
        await write_program(ctx, dut, program)
        for _ in range(4):
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            await ctx.tick().until(dut.status.halted)
            stops.append((ctx.get(dut.status.pc), ErrorCode(ctx.get(dut.status.error))))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    run_amaranth(sim)
    assert stops == [(0, ErrorCode.NONE), (3, ErrorCode.NONE), (5, ErrorCode.PC_OVERFLOW),
                     (0, ErrorCode.NONE)]
    model = TileModel(8)
    listing = [(opcode.name, fields) for opcode, fields in map(decode, program)]
    for pc in (0, 3):
        model.run(listing)
        assert (model.pc, model.halted) == (pc, True)
    coverage.sequencer_error("PC_OVERFLOW")


def test_running_off_the_end_of_the_program_is_an_error():
    trace = run([encode(Opcode.NOP)] * 4, depth=4)
    assert trace["status"]["error"] == ErrorCode.PC_OVERFLOW and trace["status"]["pc"] == 3
    coverage.sequencer_error("PC_OVERFLOW")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"array_size": 6}, "power of two"),
        ({"scratchpad_words": 0}, "scratchpad_words"),
        ({"mesh": (9, 1)}, "mesh"),
        ({"program_depth": 100}, "power of two"),
        ({"acc_depth": 2048}, "acc_depth"),
        ({"slots": 0}, "slots"),
        ({"acc_depth": 3}, "acc_depth must be a power of two"),
        ({"slots": 2.5}, "slots must be an integer"),
        ({"mesh": (2,)}, "mesh must be \\(columns, rows\\)"),
        ({"program_depth": 256.0}, "program_depth must be a power of two"),
    ],
)
def test_impossible_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Sequencer(**kwargs)


def test_isa_round_trip_and_refusals():
    word = gemm(acc_shift=15, accumulate=1)
    assert decode(word) == (Opcode.GEMM, decode(word)[1])
    assert decode(word)[1]["acc_shift"] == 15
    word = vec(imm=-(1 << 47), lo=-4096, hi=4095, dst_kind=VecDst.NONE)
    fields = decode(word)[1]
    assert (fields["imm"], fields["lo"], fields["hi"]) == (-(1 << 47), -4096, 4095)
    assert fields["dst_kind"] == VecDst.NONE.value
    with pytest.raises(ValueError, match="signed 48 bits"):
        vec(imm=1 << 47)
    with pytest.raises(ValueError, match="does not fit"):
        encode(Opcode.WAIT, semaphore=16, count=1)
    with pytest.raises(ValueError, match="no field"):
        encode(Opcode.DMA, destination=3)
    with pytest.raises(ValueError, match="takes no fields"):
        encode(Opcode.NOP, count=1)
    with pytest.raises(ValueError, match=r"HALT has no field\(s\) \['count'\]"):
        encode(Opcode.HALT, count=1)
    assert decode(encode(Opcode.HALT, next=(1 << 16) - 1)) == (Opcode.HALT, {"next": 65535})
    with pytest.raises(ValueError, match=r"GEMM.signal has no field\(s\) \['sem'\]"):
        encode(Opcode.GEMM, signal={"sem": 1})
    with pytest.raises(ValueError, match="VEC.pack = 3 is no member"):
        encode(Opcode.VEC, pack=3)
    assert encode(Opcode.VEC, pack=VecPack.LIMB_HI) == encode(Opcode.VEC,
                                                              pack=VecPack.LIMB_HI.value)
    with pytest.raises(ValueError, match="illegal opcode"):
        decode(0)
    pack = INSTRUCTION["args"].offset + VecArgs()["pack"].offset  # VecPack has no value 3
    with pytest.raises(ValueError, match="pack = 3 is no member"):
        decode(vec(pack=VecPack.BYTE) | 3 << pack)


def test_encode_packs_what_the_layouts_define():
    """``encode`` packs by the layouts' offsets itself: every opcode's fields, drawn at
    random in range, give the word the Amaranth layout builds."""
    rng = np.random.default_rng(3)
    for opcode, member in ARGS_OF.items():
        for _ in range(20):
            fields = _draw(INSTRUCTION["args"].shape[member].shape, rng)
            want = INSTRUCTION.const({"opcode": opcode, "args": {member: fields}})
            assert encode(opcode, **fields) == want.as_value().value, (opcode, fields)


def _draw(layout, rng) -> dict:
    """Random in-range values for the fields of ``layout`` (enumerations: a member)."""
    out = {}
    for name, field in layout:
        shape = field.shape
        if isinstance(shape, data.StructLayout):
            out[name] = _draw(shape, rng)
        elif isinstance(shape, type) and issubclass(shape, PyEnum):
            out[name] = list(shape)[rng.integers(len(shape))]
        else:
            cast = Shape.cast(shape)
            low = -(1 << (cast.width - 1)) if cast.signed else 0
            out[name] = low + int(rng.integers(0, 1 << 62)) % (1 << cast.width)
    return out


def test_instructions_at_the_edges_of_their_memories_get_the_isa_verdict():
    """Random GEMM, VEC and DMA instructions whose region ends just before, at or past
    the end of its memory: the sequencer accepts exactly those the ISA allows and stops
    the others with the error docs/isa.md names."""
    rng = np.random.default_rng(7)
    wrong = []
    for opcode, fields, word, error in (boundary_instructions(SIZES, 8, 1, rng, 120)
                                        + high_bit_instructions(SIZES, 8, 1)):
        trace = run([word, HALT])
        got = trace["status"]["error"].name
        if got != error:
            wrong.append((opcode.name, fields, got, error))
    assert not wrong, wrong[:3]


#: Program memory words of the register tests.
DEPTH = 128


def model_run(program: list[int], spad=None) -> tuple[list, str, int, TileModel]:
    """The model's engine operations (opcode name, fields), error name ("CHECK" for a
    failed region, shape or tile check) and pc; ``spad``: words it starts with."""
    model = TileModel(8, spad_words=WORDS, acc_depth=ENTRIES, slots=SLOTS, mesh=SIZES.mesh,
                      memory_channels=CHANNELS, channel_words=CHANNEL_WORDS)
    for address, word in (spad or {}).items():
        model.spad[address] = word
    error = model_outcome(model, program)
    return model.issued, error, model.pc, model


def dispatched(trace) -> list:
    return [(name.upper(), args) for _, name, args in trace["dispatched"]]


@pytest.mark.parametrize(("what", "program"), register_programs(own_index=0, n=8),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_register_programs_dispatch_what_the_model_runs(what, program):
    spad = loaded_words(8, 0)
    issued, error, pc, model = model_run(program, spad)
    assert error == "NONE" and len(model.executed) + len(model.issued) >= 5
    trace = run(program, depth=DEPTH, max_cycles=4000, spad=spad)
    assert trace["status"]["error"] == ErrorCode.NONE, what
    assert trace["status"]["pc"] == pc and program[pc] == HALT, what
    assert dispatched(trace) == issued, what
    assert trace["fetches"] == model.fetches, what
    coverage.sample_program([decode(word) for word in program], 8)


@pytest.mark.parametrize(("what", "program", "error", "pc"), register_errors(SIZES, 8, DEPTH),
                         ids=lambda x: x if isinstance(x, str) and " " in x else "")
def test_register_errors_stop_at_their_instruction(what, program, error, pc):
    """Each error: the sequencer stops at the instruction with its code, nothing after
    it is dispatched; the model stops there too (where it knows the code: it has no
    program memory, mesh or scratchpad bound here)."""
    trace = run(program, depth=DEPTH)
    status = trace["status"]
    assert (status["error"].name, status["pc"], status["halted"]) == (error, pc, 1), what
    engine_ops = [w for w in program[:pc] if decode(w)[0] in (Opcode.GEMM, Opcode.VEC,
                                                                  Opcode.DMA)]
    assert len(trace["dispatched"]) == len(engine_ops), what  # none from pc on
    if error in ("BAD_REGISTER", "LOOP_BOUND") or what.startswith("LOAD"):
        issued, model_error, model_pc, _ = model_run(program)
        assert (model_error, model_pc) == (error if error in ("BAD_REGISTER", "LOOP_BOUND")
                                           else "CHECK", pc), what
        assert dispatched(trace) == issued
    coverage.sequencer_error(error)


@pytest.mark.parametrize(("value", "error"), [(7, "NONE"), (0xFFFF, "NONE"),
                                              (-1, "BAD_REGISTER"),
                                              (1 << 16, "BAD_REGISTER")])
def test_load_from_an_accumulator_lane(value, error):
    """LOAD with ``acc`` reads lane 3 of entry 5 once the vector engine is idle (after
    the VEC dispatched before it is done) into a register a SIGNAL then adds; a lane
    outside 0 .. 2**16 - 1 stops the program at the LOAD with BAD_REGISTER."""
    lanes = [100 + i for i in range(8)]
    lanes[3] = value
    program = [vec(rows=4), op(Opcode.LOAD, rd=1, addr=5, lane=3, acc=1),
               with_((WITH_FIELDS[Opcode.SIGNAL].index("count") + 1, 1)),
               op(Opcode.SIGNAL, semaphore=6, count=0), HALT]
    trace = run(program, depth=DEPTH, engine_delay=30, acc={5: lanes})
    status = trace["status"]
    vec_done = [cycle for cycle, name in trace["done"] if name == "vec"]
    assert [entry for _, entry in trace["acc_reads"]] == [5]
    assert trace["acc_reads"][0][0] > vec_done[0]  # not while the VEC may read c
    if error == "NONE":
        assert (status["error"], status["pc"]) == (ErrorCode.NONE, 4)
        assert trace["semaphores"][6] == value
    else:
        assert (status["error"].name, status["pc"]) == (error, 1)
        assert trace["semaphores"][6] == 0


@pytest.mark.parametrize(("what", "program", "spad", "error", "pc"), idma_edges(SIZES, 8),
                         ids=lambda x: x if isinstance(x, str) and " " in x else "")
def test_idma_edges_end_where_the_model_ends(what, program, spad, error, pc):
    """A bad entry stops the IDMA after the rows before it (BAD_INDEX), a bad shape or
    region before any row, regions that just fit run; the model dispatches and ends the
    same."""
    trace = run(program, depth=DEPTH, spad=spad)
    status = trace["status"]
    assert (status["error"].name, status["pc"], status["halted"]) == (error, pc, 1), what
    issued, model_error, model_pc, _ = model_run(program, spad)
    assert (model_error, model_pc) == (outcome(error), pc), what
    assert dispatched(trace) == issued, what
    if error != "NONE":
        coverage.sequencer_error(error)


def test_an_idma_table_word_that_cannot_be_read_is_a_memory_error():
    program = [op(Opcode.IDMA, src=0, dst=256, table=100, count=6, row=2), HALT]
    trace = run(program, depth=DEPTH, bad_words=(101,))  # the second table word
    assert (trace["status"]["error"], trace["status"]["pc"]) == (ErrorCode.MEMORY_ERROR, 0)
    assert len(trace["dispatched"]) == 4  # the first word's entries


def test_random_register_programs_match_the_model(seed):
    """Random loops over WITH-modified operations: the same dispatches, fields, end and
    instructions fetched as the model, errors included."""
    rng = np.random.default_rng(seed + 70)
    outcomes = set()
    for _ in range(30):
        program = random_register_program(rng, SIZES, own_index=0)
        issued, error, pc, model = model_run(program)
        trace = run(program, depth=DEPTH, max_cycles=20_000)
        assert (outcome(trace["status"]["error"].name), trace["status"]["pc"]) == (error, pc)
        assert dispatched(trace) == issued
        assert trace["fetches"] == model.fetches
        outcomes.add(error)
    assert "NONE" in outcomes and len(outcomes) >= 2, outcomes


def test_load_reads_two_bytes_and_stops_on_an_uncorrectable_word():
    """LOAD takes lanes l and l + 1 of the word (0 past the last lane), as the model
    does; an uncorrectable word stops the program with MEMORY_ERROR at the LOAD."""
    word = 5 | 7 << 16 | 9 << 56  # lanes 0, 2 and 7 (the last)
    m = WITH_FIELDS[Opcode.GEMM].index("m") + 1
    program = [op(Opcode.LOAD, rd=1, addr=40, lane=0), with_((m, 1)), gemm(m=0),
               op(Opcode.LOAD, rd=1, addr=40, lane=2), with_((m, 1)), gemm(m=0),
               op(Opcode.LOAD, rd=1, addr=40, lane=7), with_((m, 1)), gemm(m=0), HALT]
    trace = run(program, depth=DEPTH, spad={40: word})
    assert trace["status"]["error"] == ErrorCode.NONE
    assert [args["m"] for _, _, args in trace["dispatched"]] == [5, 7, 9]
    assert [args["m"] for _, args in model_run(program, {40: word})[0]] == [5, 7, 9]
    bad = run(program, depth=DEPTH, spad={40: word}, bad_words={40})
    assert (bad["status"]["error"], bad["status"]["pc"]) == (ErrorCode.MEMORY_ERROR, 0)
    assert bad["dispatched"] == [] and bad["loads"] == [40]
    coverage.sequencer_error("MEMORY_ERROR")


def test_the_hazard_check_orders_a_load_after_the_write_of_its_word():
    s1 = {"enable": 1, "semaphore": 1}
    write = (Opcode.VEC, decode(vec(dst=300, dst_kind=VecDst.SPAD, rows=2, beats=1,
                                    signal=s1))[1])
    load = (Opcode.LOAD, {"rd": 1, "addr": 301, "lane": 0})
    wait = (Opcode.WAIT, {"semaphore": 1, "count": 1})
    check_synchronisation([write, wait, load, (Opcode.HALT, {})], 8)
    with pytest.raises(ValueError, match="LOAD after write on scratchpad word 301"):
        check_synchronisation([write, load, wait, (Opcode.HALT, {})], 8)
    # From the accumulator: entry 70 of the 8 a GEMM writes from 64.
    s0 = {"enable": 1, "semaphore": 0}
    write = (Opcode.GEMM, decode(gemm(signal=s0))[1])
    load = (Opcode.LOAD, {"rd": 1, "addr": 70, "lane": 3, "acc": 1})
    wait = (Opcode.WAIT, {"semaphore": 0, "count": 1})
    check_synchronisation([write, wait, load, (Opcode.HALT, {})], 8)
    check_synchronisation([write, (Opcode.LOAD, load[1] | {"acc": 0}), wait,
                           (Opcode.HALT, {})], 8)  # scratchpad word 70: not written
    with pytest.raises(ValueError, match="LOAD after write on accumulator entry 70"):
        check_synchronisation([write, load, wait, (Opcode.HALT, {})], 8)


@pytest.mark.parametrize("waits", [True, False])
def test_the_hazard_check_reads_what_a_register_program_runs(waits):
    """A loop whose VEC reads the accumulator entries its GEMM wrote, both moved by a
    register: the checker refuses the program itself (its path depends on registers),
    and on the instructions the model executed finds the missing WAIT, or none."""
    s0, s1 = {"enable": 1, "semaphore": 0}, {"enable": 1, "semaphore": 1}
    wait = [op(Opcode.WAIT, semaphore=0, count=1)]
    program = [op(Opcode.SET, rd=1, value=2),
               with_((3, 3)), gemm(c=64, signal=s0), *(wait if waits else []),
               with_((1, 3)), vec(a=64, beats=1, signal=s1), *([] if waits else wait),
               op(Opcode.WAIT, semaphore=1, count=1), op(Opcode.ADD, rd=3, ra=3, imm=16),
               op(Opcode.LOOP, counter=2, limit=1, target=1, bound=2), HALT]
    with pytest.raises(ValueError, match="SET makes the program's path depend"):
        check_synchronisation([decode(word) for word in program], 8)
    _, error, _, model = model_run(program)
    assert error == "NONE"
    ops = executed_ops(model.executed)
    assert [o.name for o, _ in ops].count("GEMM") == 2
    if waits:
        check_synchronisation(ops, 8)
    else:
        with pytest.raises(ValueError, match="read after write on accumulator entry 64"):
            check_synchronisation(ops, 8)


def test_the_hazard_check_refuses_an_idma():
    program = [op(Opcode.IDMA, src=0, dst=256, table=92, count=2, row=2), HALT]
    with pytest.raises(ValueError, match="IDMA's rows come from its index table"):
        check_synchronisation([decode(word) for word in program], 8)
