"""The tile sequencer: fetches, checks and dispatches the tile's instruction stream."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, signed, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from rtl.accumulator import Entry
from rtl.scratchpad import Response, failed
from spec.isa import (
    ACC_ADDR_BITS,
    ADDR_BITS,
    ARGS_OF,
    CHANNEL_BITS,
    COUNT_BITS,
    DIM_BITS,
    EMPTY_ENTRY,
    ENTRY_BITS,
    ENTRY_ROW_BITS,
    INSTRUCTION,
    INSTRUCTION_BITS,
    MASK_COLUMNS,
    MEM_ADDR_BITS,
    REG_BITS,
    REGISTERS,
    SEMAPHORES,
    SIGNAL,
    TILE_MASK_BITS,
    WITH_FIELDS,
    WITH_SLOTS,
    DmaArgs,
    DmaTarget,
    GemmArgs,
    Opcode,
    VecArgs,
    VecDst,
    entries_per_word,
    mesh_mask,
    tile_index,
)
from spec.params import check_array_size, check_grid, check_int

__all__ = ["ErrorCode", "Sequencer", "SequencerStatus"]


class ErrorCode(enum.Enum, shape=4):
    """Why the sequencer stopped early (``NONE`` after a clean HALT)."""

    NONE = 0
    ILLEGAL_OPCODE = 1  # opcode 0 or 15
    BAD_ADDRESS = 2  # a region runs past the end of the scratchpad (or of a memory channel)
    BAD_SHAPE = 3  # a GEMM with m, k or p = 0; a VEC with no rows or beats, or past the slots
    BAD_TILE = 4  # a DMA to no tile, a tile outside the mesh or a memory channel not there
    SEMAPHORE_OVERFLOW = 5  # a semaphore counter would pass 2**16 - 1
    PC_OVERFLOW = 6  # the program ran off the end of its memory, or branched past it
    BAD_REGISTER = 7  # a register value that does not fit where it goes (ADD, LOOP, WITH)
    LOOP_BOUND = 8  # a LOOP's limit register above the LOOP's bound
    MEMORY_ERROR = 9  # a LOAD or an IDMA read an uncorrectable scratchpad word
    BAD_INDEX = 10  # an IDMA entry's row past the scratchpad or its tile outside the mesh


class SequencerStatus(data.StructLayout):
    def __init__(self, pc_bits: int):
        super().__init__({
            "running": 1,  # between `start` and the end of the program
            "halted": 1,  # stopped, with every dispatched operation finished
            "error": ErrorCode,
            "pc": unsigned(pc_bits),  # the instruction executing (or that failed)
        })


class ProgramWrite(data.StructLayout):
    def __init__(self, pc_bits: int):
        super().__init__({"address": unsigned(pc_bits), "word": unsigned(INSTRUCTION_BITS)})


class Sequencer(wiring.Component):
    """Runs a tile program: one instruction after another, engines working in parallel.

    GEMM, VEC and DMA instructions are checked (shape, scratchpad bounds, destination
    tiles), then dispatched in program order on the ``gemm``, ``vec`` and ``dma`` command
    streams; the engines run them and report each finished operation on their ``*_done``
    stream, echoing the operation's ``signal`` field. A finished operation with an
    enabled signal, an arrival from the network (``arrival``) and a SIGNAL instruction
    each add to a semaphore; WAIT blocks until its semaphore reaches the count and then
    subtracts it. HALT waits until every dispatched operation has finished; its
    ``next`` is where the following ``start`` runs from (a tile's programs chained in
    its instruction memory without the host writing between them).

    A bad instruction stops the sequencer cleanly: nothing after it is dispatched,
    operations already dispatched finish, and ``status`` shows ``halted`` with the
    :class:`ErrorCode` and the instruction's ``pc`` (for ``SEMAPHORE_OVERFLOW``, the
    instruction executing the cycle after a counter would have overflowed — the counter
    keeps its value, and an operation dispatched in that cycle still runs). ``start`` is
    ignored until the sequencer is halted.

    Parameters
    ----------
    array_size : int
        N of the tensor core, a power of two (a scratchpad word holds N int8 values).
    scratchpad_words : int
        Words of the tile's scratchpad; every region must lie below this.
    acc_depth : int
        Entries of the accumulator memory; every GEMM C and VEC operand region must lie
        below this.
    slots : int
        Vector-unit slots; a VEC's rows use slots ``slot`` .. ``slot + rows - 1``.
    mesh : (int, int)
        Mesh columns and rows, for checking DMA destinations.
    memory_channels, channel_words : int
        Memory channels a DMA may name (``channel`` below this) and the words of each,
        for checking memory DMAs (none by default: every STORE or LOAD is ``BAD_TILE``).
    program_depth : int
        Instruction words, a power of two.

    Ports
    -----
    program : stream in of ``ProgramWrite``
        Writes the instruction memory; held off (not ready) while running.
    start : in
        Pulse: begin at the ``next`` of the HALT that ended the last run (pc 0 after
        reset, a run that stopped with an error or a HALT whose ``next`` is 0), clear
        the status, the registers and the semaphores.
    status : out, :class:`SequencerStatus`

    Timing: five cycles per instruction (fetch, latch, measure the regions, check them,
    execute), so that no path runs from the instruction memory through the bound checks;
    longer when an engine's command stream is not ready or a WAIT blocks.
    """

    def __init__(self, *, array_size: int = 8, scratchpad_words: int = 16384,
                 acc_depth: int = 256, slots: int = 8,
                 mesh: tuple[int, int] = (2, 2), program_depth: int = 256,
                 memory_channels: int = 0, channel_words: int = 0):
        check_array_size("array size", array_size)
        check_int("scratchpad_words", scratchpad_words, 1, 1 << 16)
        # The engines' accumulator memory is a power of two deep (rtl.accumulator).
        check_int("acc_depth", acc_depth, 2, 1 << ACC_ADDR_BITS, power_of_two=True)
        check_int("slots", slots, 1, 64)
        columns, rows = check_grid("mesh", mesh, 8)
        check_int("program_depth", program_depth, 2, 1 << 16, power_of_two=True)
        self.memory_channels = check_int("memory_channels", memory_channels, 0,
                                         1 << CHANNEL_BITS)
        self.channel_words = check_int("channel_words", channel_words,
                                       1 if memory_channels else 0, 1 << MEM_ADDR_BITS)
        self.array_size = array_size
        self.scratchpad_words = scratchpad_words
        self.acc_depth, self.slots = acc_depth, slots
        self.mesh = (columns, rows)
        self.program_depth = program_depth
        pc_bits = ceil_log2(program_depth)
        done = In(stream.Signature(SIGNAL))
        super().__init__({
            "program": In(stream.Signature(ProgramWrite(pc_bits))),
            "start": In(1),
            "status": Out(SequencerStatus(pc_bits)),
            "gemm": Out(stream.Signature(GemmArgs())),
            "vec": Out(stream.Signature(VecArgs())),
            "dma": Out(stream.Signature(DmaArgs())),
            "gemm_done": done,
            "vec_done": done,
            "dma_done": done,
            "arrival": In(stream.Signature(unsigned(4))),
            "semaphores": Out(data.ArrayLayout(unsigned(COUNT_BITS), SEMAPHORES)),
            # A WAIT is held this cycle: its semaphore is short of its count.
            "waiting": Out(1),
            # The instruction memory is read this cycle (an instruction fetched).
            "fetching": Out(1),
            # LOAD's word reads (an address only: the tile ties write and data to 0).
            "spad_req": Out(stream.Signature(data.StructLayout({"addr": ADDR_BITS}))),
            "spad_resp": In(stream.Signature(Response(8 * array_size))),
            # A LOAD's accumulator entry: ``acc_addr`` while ``acc_read`` is high (the
            # vector engine idle: the tile lends the sequencer that engine's c port),
            # the entry on ``acc_data`` the cycle after.
            "acc_read": Out(1),
            "acc_addr": Out(range(acc_depth)),
            "acc_data": In(Entry(array_size)),
        })

    @property
    def valid_tiles(self) -> int:
        """The tile mask bits that name tiles of the mesh (``spec.isa.tile_bit``)."""
        return mesh_mask(self.mesh)

    def elaborate(self, platform):
        m = Module()
        fetch, instruction = self._program_memory(m)
        idle = self._outstanding(m)
        sem = self._semaphores(m, instruction.args.wait)
        checks = _Checks(self, m, instruction.args)
        regs = Array(Signal(REG_BITS, name=f"r{i}") for i in range(REGISTERS))
        args = instruction.args
        m.d.comb += [  # (an IDMA's rows override the DMA's in _control)
            self.gemm.payload.eq(args.gemm),
            self.vec.payload.eq(args.vec),
            self.dma.payload.eq(args.dma),
        ]
        self._control(m, fetch, instruction, idle, sem, checks, regs)
        # A semaphore that would overflow keeps its value and stops the program (after
        # the control's assignments, so this error wins).
        with m.If(sem.overflowed):
            m.d.sync += [self.status.error.eq(ErrorCode.SEMAPHORE_OVERFLOW),
                         self.status.running.eq(0)]
        return m

    def _program_memory(self, m: Module):
        """The instruction memory, written from ``program`` while not running; its read
        port and the instruction being executed (registered out of the memory). It keeps
        the bits an instruction uses (``INSTRUCTION.size``); a word's reserved high bits
        are not stored."""
        m.submodules.imem = imem = memory.Memory(
            shape=INSTRUCTION.size, depth=self.program_depth, init=[]
        )
        write = imem.write_port()
        fetch = imem.read_port()
        m.d.comb += [
            self.program.ready.eq(~self.status.running),
            write.addr.eq(self.program.payload.address),
            write.data.eq(self.program.payload.word[:INSTRUCTION.size]),
            write.en.eq(self.program.valid & self.program.ready),
        ]
        return fetch, Signal(INSTRUCTION)

    def _outstanding(self, m: Module) -> Signal:
        """Operations dispatched and not yet done, per engine; whether none is (``all``)
        and whether the vector engine has none (``vec``)."""
        outstanding = []
        for name in ("gemm", "vec", "dma"):
            command, done = getattr(self, name), getattr(self, f"{name}_done")
            count = Signal(range(1 << 8), name=f"{name}_outstanding")
            m.d.comb += done.ready.eq(1)
            issued = command.valid & command.ready
            finished = done.valid
            m.d.sync += count.eq(count + issued - finished)
            outstanding.append(count)
        idle = SimpleNamespace(all=Signal(), vec=Signal())
        m.d.comb += [idle.all.eq(~(outstanding[0].any() | outstanding[1].any()
                                   | outstanding[2].any())),
                     idle.vec.eq(~outstanding[1].any())]
        return idle

    def _semaphores(self, m: Module, wait) -> SimpleNamespace:
        """The semaphore counters: engine completions, network arrivals, SIGNAL's
        addition and WAIT's subtraction; a counter that would pass its width keeps its
        value and raises ``overflowed`` (the program stops on the next cycle); WAIT's
        verdict."""
        m.d.comb += self.arrival.ready.eq(1)
        sem = SimpleNamespace(
            wait_done=Signal(),  # this cycle, WAIT completes: wait.count is subtracted
            signal_now=Signal(),  # this cycle, SIGNAL executes: wait.count is added
            overflowed=Signal(),
            # WAIT's verdict, registered. Only the WAIT itself lowers a semaphore, so a
            # verdict from the previous cycle still holds when it is used.
            wait_ready=Signal(),
        )
        # Per semaphore, registered: it would have passed 2**16 - 1 (and held instead).
        overflow = Signal(SEMAPHORES)
        m.d.comb += sem.overflowed.eq(overflow.any())
        # SIGNAL's addition and WAIT's subtraction, registered and applied a cycle later.
        adjust_semaphore = Signal(SEMAPHORES)  # one-hot
        adjust_add, adjust_sub = Signal(COUNT_BITS), Signal(COUNT_BITS)
        m.d.sync += [
            adjust_semaphore.eq(1 << wait.semaphore),
            adjust_add.eq(Mux(sem.signal_now, wait.count, 0)),
            adjust_sub.eq(Mux(sem.wait_done, wait.count, 0)),
        ]
        for index in range(SEMAPHORES):
            total = Signal(COUNT_BITS + 3, name=f"sem{index}_next")
            increments = [
                (done.valid & done.payload.enable & (done.payload.semaphore == index))
                for done in (self.gemm_done, self.vec_done, self.dma_done)
            ]
            increments.append(self.arrival.valid & (self.arrival.payload == index))
            # Counted in pairs, so no adder has a bit that can never be set.
            counted = Signal(range(len(increments) + 1), name=f"sem{index}_increments")
            m.d.comb += counted.eq((increments[0] + increments[1])
                                   + (increments[2] + increments[3]))
            here = adjust_semaphore[index]
            m.d.comb += total.eq(
                self.semaphores[index]
                + counted
                + Mux(here, adjust_add, 0)
                - Mux(here, adjust_sub, 0)
            )
            m.d.sync += overflow[index].eq((total >> COUNT_BITS).any())
            with m.If(~(total >> COUNT_BITS).any() & ~self.start):
                m.d.sync += self.semaphores[index].eq(total)
            with m.If(self.start):
                m.d.sync += self.semaphores[index].eq(0)
        m.d.sync += sem.wait_ready.eq(self.semaphores[wait.semaphore] >= wait.count)
        return sem

    def _control(self, m: Module, fetch, instruction, idle, sem, checks, regs) -> None:
        """FETCH, LATCH (adding a WITH's registers to the instruction's fields), MEASURE,
        CHECK, EXECUTE (dispatch, or stop with an error), and DRAIN until every
        dispatched operation has finished."""
        status, opcode = self.status, instruction.opcode
        last_pc = self.program_depth - 1
        # The last WITH's slots for the next instruction: field numbers and the values of
        # their registers, read when the WITH executes (nothing runs in between), so
        # that no register read lies on the path from the instruction memory.
        with_args = Signal(data.ArrayLayout(_WITH_SLOT, WITH_SLOTS))
        with_bad = Signal()  # those slots do not apply to the latched instruction

        def fail(code):
            m.d.sync += [status.error.eq(code), status.running.eq(0)]
            m.next = "DRAIN"

        resume = Signal(range(self.program_depth))  # where the next start runs from

        def halt():
            """Stop (DRAIN waits for the engines); the next start runs from ``next``."""
            target = instruction.args.halt.next
            with m.If(target > last_pc):
                fail(ErrorCode.PC_OVERFLOW)
            with m.Else():
                m.d.sync += [status.running.eq(0), resume.eq(target)]
                m.next = "DRAIN"

        def advance():
            with m.If(status.pc == last_pc):
                m.d.sync += status.error.eq(ErrorCode.PC_OVERFLOW)
                m.d.sync += status.running.eq(0)
                m.next = "DRAIN"
            with m.Else():
                m.d.sync += status.pc.eq(status.pc + 1)
                m.next = "FETCH"

        def jump(target):
            with m.If(target > last_pc):
                fail(ErrorCode.PC_OVERFLOW)
            with m.Else():
                m.d.sync += status.pc.eq(target)
                m.next = "FETCH"

        def load():
            """LOAD's checked read: a scratchpad word (its response comes in the state
            LOAD) or, once the vector engine is idle, an accumulator entry (LOAD_ACC)."""
            load = instruction.args.load
            with m.If(~checks.load_ok):
                fail(ErrorCode.BAD_ADDRESS)
            with m.Elif(load.acc):
                with m.If(idle.vec):
                    m.d.comb += [self.acc_read.eq(1), self.acc_addr.eq(load.addr)]
                    m.next = "LOAD_ACC"
            with m.Else():
                m.d.comb += [self.spad_req.valid.eq(1),
                             self.spad_req.payload.addr.eq(instruction.args.load.addr)]
                with m.If(self.spad_req.ready):
                    m.next = "LOAD"

        rows = self._idma_state(m)

        def stop_on_overflow():  # last in every running state, so it wins
            with m.If(sem.overflowed):
                m.next = "DRAIN"

        def dispatch(engine, *verdicts):
            """An engine operation: the first failed verdict's error, else hand it on."""
            for index, (ok, code) in enumerate(verdicts):
                with m.If(~ok) if index == 0 else m.Elif(~ok):
                    fail(code)
            with m.Else():
                m.d.comb += engine.valid.eq(1)
                with m.If(engine.ready):
                    advance()

        m.d.comb += fetch.addr.eq(status.pc)

        with m.FSM(init="IDLE"):
            with m.State("IDLE"):
                with m.If(self.start):
                    # From the pc the last HALT named, unless the last run failed.
                    m.d.sync += [status.pc.eq(Mux(status.error == ErrorCode.NONE, resume, 0)),
                                 status.running.eq(1), status.halted.eq(0),
                                 status.error.eq(ErrorCode.NONE), with_args.eq(0),
                                 *(r.eq(0) for r in regs)]
                    m.next = "FETCH"
            with m.State("FETCH"):  # the memory reads status.pc
                m.d.comb += self.fetching.eq(1)
                m.next = "LATCH"
                stop_on_overflow()
            with m.State("LATCH"):
                patched, bad = _with_registers(m, fetch.data, with_args, self.mesh)
                m.d.sync += [instruction.eq(patched), with_bad.eq(bad), with_args.eq(0)]
                m.next = "MEASURE"
                stop_on_overflow()
            with m.State("MEASURE"):
                checks.measure()
                m.next = "CHECK"
                stop_on_overflow()
            with m.State("CHECK"):
                checks.check()
                m.next = "EXECUTE"
                stop_on_overflow()
            with m.State("EXECUTE"):
                with m.If(with_bad):
                    fail(ErrorCode.BAD_REGISTER)
                with m.Else():
                    self._execute(m, opcode, sem, checks, fail, advance, dispatch, halt,
                                  lambda: _scalar_cases(m, instruction.args, regs, with_args,
                                                        fail, advance, jump, load),
                                  lambda: self._idma_start(m, instruction.args.idma, rows,
                                                           checks, fail, advance))
                stop_on_overflow()
            with m.State("LOAD"):  # the word's response
                self._load_response(m, instruction.args.load, regs, fail, advance)
                stop_on_overflow()
            with m.State("LOAD_ACC"):  # the entry read in the cycle before
                load = instruction.args.load
                lane = self.acc_data[load.lane]
                with m.If((lane < 0) | (lane >= (1 << REG_BITS))):
                    fail(ErrorCode.BAD_REGISTER)
                with m.Else():
                    m.d.sync += regs[load.rd].eq(lane[:REG_BITS])
                    advance()
                stop_on_overflow()
            self._idma_rows(m, instruction.args.idma, rows, fail, advance, stop_on_overflow)
            with m.State("DRAIN"):
                with m.If(idle.all):
                    m.d.sync += status.halted.eq(1)
                    m.next = "IDLE"


    def _idma_state(self, m: Module) -> SimpleNamespace:
        """An IDMA's progress: the entry being moved, the next row of its consecutive
        side, the entry read from the table, and that row's DMA command with its check."""
        rows = SimpleNamespace(index=Signal(DIM_BITS, name="idma_index"),
                               step=Signal(ADDR_BITS, name="idma_step"),
                               entry=Signal(ENTRY_BITS, name="idma_entry"),
                               command=Signal(DmaArgs(), name="idma_command"),
                               indexed=Signal(ADDR_BITS + ENTRY_ROW_BITS, name="idma_indexed"),
                               in_mesh=Signal(name="idma_in_mesh"),
                               ok=Signal(name="idma_ok"), last=Signal(name="idma_last"),
                               empty=Signal(name="idma_empty"))
        rows.per_word = entries_per_word(self.array_size)
        return rows

    def _idma_start(self, m: Module, idma, rows, checks, fail, advance) -> None:
        """EXECUTE of an IDMA: its checks; no rows: a DMA of no words to no tile that
        carries the signal alone; else on to its first entry."""
        with m.If(~checks.idma_ok_shape):
            fail(ErrorCode.BAD_SHAPE)
        with m.Elif(~checks.idma_ok_bounds):
            fail(ErrorCode.BAD_ADDRESS)
        with m.Elif(idma.count == 0):
            m.d.comb += [self.dma.valid.eq(1), self.dma.payload.eq(0),
                         self.dma.payload.signal.eq(idma.signal)]
            with m.If(self.dma.ready):
                advance()
        with m.Else():
            m.d.sync += [rows.index.eq(0), rows.step.eq(Mux(idma.scatter, idma.src, idma.dst))]
            m.next = "IDMA_READ"

    def _idma_rows(self, m: Module, idma, rows, fail, advance, stop_on_overflow) -> None:
        """The states of an IDMA's rows: read the entry's table word, take the entry,
        make the row's DMA, check it, then hand it to the DMA engine (BAD_INDEX for a
        row past the scratchpad or a tile outside the mesh)."""
        shift = ceil_log2(rows.per_word)
        with m.State("IDMA_READ"):
            m.d.comb += [self.spad_req.valid.eq(1),
                         self.spad_req.payload.addr.eq(idma.table + (rows.index >> shift))]
            with m.If(self.spad_req.ready):
                m.next = "IDMA_ENTRY"
            stop_on_overflow()
        with m.State("IDMA_ENTRY"):
            with self._spad_word(m, fail) as data:
                lane = rows.index[:shift] if shift else 0
                entry = data.word_select(lane, ENTRY_BITS)
                m.d.sync += rows.entry.eq(entry)
                # An empty entry before the last moves nothing: on to the next one at
                # once (two cycles an entry); the last goes on to carry the signal.
                with m.If((entry == EMPTY_ENTRY) & (rows.index != idma.count - 1)):
                    m.d.sync += rows.index.eq(rows.index + 1)
                    m.next = "IDMA_READ"
                with m.Else():
                    m.next = "IDMA_ROW"
            stop_on_overflow()
        with m.State("IDMA_ROW"):
            self._idma_command(m, idma, rows)
            m.next = "IDMA_CHECK"
            stop_on_overflow()
        with m.State("IDMA_CHECK"):
            self._idma_check(m, idma, rows)
            m.next = "IDMA_SEND"
            stop_on_overflow()
        with m.State("IDMA_SEND"):
            with m.If(~rows.ok):
                fail(ErrorCode.BAD_INDEX)
            with m.Else():  # a row, or the last entry's signal on a DMA of no words
                m.d.comb += [self.dma.valid.eq(1), self.dma.payload.eq(rows.command)]
                with m.If(self.dma.ready):
                    m.d.sync += [rows.index.eq(rows.index + 1),
                                 rows.step.eq(rows.step + idma.row)]
                    with m.If(rows.last):
                        advance()
                    with m.Else():
                        m.next = "IDMA_READ"
            stop_on_overflow()

    def _idma_command(self, m: Module, idma, rows) -> None:
        """IDMA_ROW: the DMA of entry ``rows.index`` (registered), ``row`` words to the
        entry's tile, and the first word of the entry's row (its product registered
        before IDMA_CHECK adds and compares it)."""
        columns, mesh_rows = self.mesh
        row = rows.entry[:ENTRY_ROW_BITS]
        tile = Signal(ENTRY_BITS - ENTRY_ROW_BITS + 1, name="idma_tile")
        x_bits = ceil_log2(MASK_COLUMNS)
        last = rows.index == idma.count - 1
        empty = rows.entry == EMPTY_ENTRY
        command = rows.command
        m.d.comb += tile.eq(rows.entry[ENTRY_ROW_BITS:] + idma.tile_base)
        m.d.sync += [
            rows.indexed.eq(Mux(idma.scatter, idma.dst, idma.src) + row * idma.row),
            # (a sum past tile 63 has y >= 8: outside every mesh)
            rows.in_mesh.eq((tile[:x_bits] < columns) & (tile[x_bits:] < mesh_rows)),
            rows.last.eq(last),
            rows.empty.eq(empty),
            command.length.eq(Mux(empty, 0, idma.row)),
            command.tiles.eq(Mux(empty, 0,
                                 Cat(*(tile == index for index in range(TILE_MASK_BITS)))
                                 & self.valid_tiles)),
            command.remote_signal.eq(idma.remote_signal & ~empty),
            command.remote_semaphore.eq(Mux(empty, 0, idma.remote_semaphore)),
            command.signal.eq(Mux(last, idma.signal, 0)),
        ]

    def _idma_check(self, m: Module, idma, rows) -> None:
        """IDMA_CHECK: the row's addresses, and whether it fits the scratchpad and its
        tile is in the mesh."""
        m.d.sync += [
            rows.ok.eq(rows.empty
                       | rows.in_mesh & ((rows.indexed + idma.row) <= self.scratchpad_words)),
            rows.command.src.eq(Mux(rows.empty, 0, Mux(idma.scatter, rows.step, rows.indexed))),
            rows.command.dst.eq(Mux(rows.empty, 0, Mux(idma.scatter, rows.indexed, rows.step))),
        ]

    @contextmanager
    def _spad_word(self, m: Module, fail):
        """The body runs on the cycle the word read on the ``seq`` port arrives, with its
        data; an uncorrectable word stops the program instead (MEMORY_ERROR)."""
        resp = self.spad_resp
        m.d.comb += resp.ready.eq(1)
        with m.If(resp.valid):
            with m.If(failed(resp.payload.status)):
                fail(ErrorCode.MEMORY_ERROR)
            with m.Else():
                yield resp.payload.data

    def _load_response(self, m: Module, load, regs, fail, advance) -> None:
        """LOAD's response: bytes ``lane`` and ``lane + 1`` of the word into ``rd``, or
        MEMORY_ERROR for an uncorrectable word."""
        with self._spad_word(m, fail) as data:
            word = Cat(data, Const(0, 8))
            m.d.sync += regs[load.rd].eq(word.bit_select(load.lane * 8, REG_BITS))
            advance()

    def _execute(self, m: Module, opcode, sem, checks, fail, advance, dispatch, halt,
                 scalar_cases, idma_start) -> None:
        """EXECUTE: per opcode, advance, stop (``halt``), dispatch to an engine (or stop
        with the first failed check's error), start an IDMA's rows, wait for or add to a
        semaphore, or work on the registers (``scalar_cases``)."""
        with m.Switch(opcode):
            with m.Case(Opcode.NOP):
                advance()
            with m.Case(Opcode.HALT):
                halt()
            with m.Case(Opcode.GEMM):
                dispatch(self.gemm, (checks.gemm_ok_shape, ErrorCode.BAD_SHAPE),
                         (checks.gemm_ok_bounds, ErrorCode.BAD_ADDRESS))
            with m.Case(Opcode.VEC):
                dispatch(self.vec, (checks.vec_ok_shape, ErrorCode.BAD_SHAPE),
                         (checks.vec_ok_bounds, ErrorCode.BAD_ADDRESS))
            with m.Case(Opcode.DMA):
                dispatch(self.dma, (checks.dma_ok_bounds, ErrorCode.BAD_ADDRESS),
                         (checks.dma_ok_tiles, ErrorCode.BAD_TILE))
            with m.Case(Opcode.IDMA):
                idma_start()
            with m.Case(Opcode.WAIT):
                with m.If(sem.wait_ready):
                    m.d.comb += sem.wait_done.eq(1)
                    advance()
                with m.Else():
                    m.d.comb += self.waiting.eq(1)
            with m.Case(Opcode.SIGNAL):
                m.d.comb += sem.signal_now.eq(1)
                advance()
            scalar_cases()
            with m.Default():
                fail(ErrorCode.ILLEGAL_OPCODE)


def _scalar_cases(m: Module, args, regs, with_args, fail, advance, jump, load) -> None:
    """EXECUTE's cases of the register instructions (``spec.isa``: SET, ADD, LOOP,
    SKIP, WITH, LOAD: ``load`` issues its read); a register keeps its value when its
    instruction fails."""
    top = 1 << REG_BITS
    with m.Case(Opcode.SET):
        m.d.sync += regs[args.set.rd].eq(args.set.value)
        advance()
    with m.Case(Opcode.ADD):
        total = Signal(signed(REG_BITS + 2), name="add_total")
        m.d.comb += total.eq(regs[args.add.ra] + args.add.imm)
        with m.If(total.as_unsigned()[REG_BITS:].any()):  # below 0 or past 2**16 - 1
            fail(ErrorCode.BAD_REGISTER)
        with m.Else():
            m.d.sync += regs[args.add.rd].eq(total)
            advance()
    with m.Case(Opcode.LOOP):
        loop = args.loop
        count, limit = Signal(REG_BITS + 1, name="loop_count"), Signal(REG_BITS, name="loop_limit")
        m.d.comb += [count.eq(regs[loop.counter] + 1), limit.eq(regs[loop.limit])]
        with m.If(limit > loop.bound):
            fail(ErrorCode.LOOP_BOUND)
        with m.Elif(count >= top):
            fail(ErrorCode.BAD_REGISTER)
        with m.Else():
            m.d.sync += regs[loop.counter].eq(count)
            with m.If(count < limit):
                jump(loop.target)
            with m.Else():
                advance()
    with m.Case(Opcode.SKIP):
        with m.If(regs[args.skip.ra] >= regs[args.skip.rb]):
            jump(args.skip.target)
        with m.Else():
            advance()
    with m.Case(Opcode.WITH):
        m.d.sync += [with_args[i].eq(Cat(args.with_[f"field{i}"],
                                          regs[args.with_[f"reg{i}"]]))
                     for i in range(WITH_SLOTS)]
        advance()
    with m.Case(Opcode.LOAD):
        load()


#: One WITH slot as the sequencer keeps it: the field number and the register's value.
_WITH_SLOT = data.StructLayout({"field": 4, "value": REG_BITS})


def _with_registers(m: Module, word, with_args, mesh) -> tuple[Signal, Signal]:
    """The instruction in ``word`` with the register values of ``with_args`` added to its
    fields (``spec.isa.WithArgs``), and whether they do not apply: a field code the
    opcode lacks, a sum past its field, a tile index past the mask, or an opcode WITH
    cannot change. A tile index sets its tile's bit when the tile is in ``mesh``; an
    index of the mask outside it sets the mask's lowest bit outside the mesh instead,
    which the DMA's tile check refuses (BAD_TILE) as it would the index's own bit."""
    raw = Signal(INSTRUCTION, name="raw_instruction")
    patched = Signal(INSTRUCTION, name="patched_instruction")
    bad = Signal(name="with_bad_now")
    m.d.comb += [raw.eq(word), patched.eq(raw)]
    slots = [(with_args[i].field, with_args[i].value) for i in range(WITH_SLOTS)]
    used = Signal(name="with_used")
    m.d.comb += used.eq(Cat(*(code != 0 for code, _ in slots)).any())
    with m.Switch(raw.opcode):
        for opcode, names in WITH_FIELDS.items():
            with m.Case(opcode):
                fields = raw.args[ARGS_OF[opcode]]
                out = patched.args[ARGS_OF[opcode]]
                problems = [code > len(names) for code, _ in slots]
                for number, name in enumerate(names, 1):
                    field = Value.cast(fields[name])
                    width = len(field)
                    hits = [Mux(code == number, value, 0) for code, value in slots]
                    if name == "tiles":  # a tile index: its bit joins the mask
                        m.d.comb += out[name].eq(field | _tile_bits(slots, number, mesh))
                        problems += [(code == number) & (value >= TILE_MASK_BITS)
                                     for code, value in slots]
                        continue
                    total = Signal(max(width, REG_BITS) + 2, name=f"with_{ARGS_OF[opcode]}_{name}")
                    m.d.comb += [total.eq(field + sum(hits)),
                                 out[name].eq(total[:width])]
                    problems.append(total >> width != 0)
                m.d.comb += bad.eq(Cat(*problems).any())
        with m.Default():
            m.d.comb += bad.eq(used)
    return patched, bad


def _tile_bits(slots, number, mesh) -> Value:
    """The tile-mask bits that the slots naming field ``number`` add (see
    :func:`_with_registers`): only the mesh's bits and one bit outside it are built."""
    columns, rows = mesh
    inside = [tile_index(x, y) for y in range(rows) for x in range(columns)]
    outside = [i for i in range(TILE_MASK_BITS) if i not in inside]
    bits = [Const(0)] * TILE_MASK_BITS
    for code, value in slots:
        hit = code == number
        for i in inside:
            bits[i] = bits[i] | (hit & (value == i))
        if outside:
            x_bits, mask_bits = ceil_log2(MASK_COLUMNS), ceil_log2(TILE_MASK_BITS)
            in_mesh = (value[:x_bits] < columns) & (value[x_bits:mask_bits] < rows)
            # (An index past the mask is BAD_REGISTER whatever its bits here.)
            bits[outside[0]] = bits[outside[0]] | (hit & ~in_mesh)
    return Cat(*bits)


class _Checks:
    """An instruction's checks, pipelined over two cycles: :meth:`measure` registers the
    sizes of its regions (GEMM: A and B in words, block or row layout, C in accumulator
    entries, N rows per output tile; VEC: operand regions in entries, a tile of rows x
    beats or one entry per N rows of scalars, the scratchpad destination in words),
    :meth:`check` the verdicts EXECUTE uses."""

    def __init__(self, sequencer: Sequencer, m: Module, args):
        self.m, self.args = m, args
        self.n, self.words, self.entries = (sequencer.array_size, sequencer.scratchpad_words,
                                            sequencer.acc_depth)
        self.slots = sequencer.slots
        self.channels, self.channel_words = sequencer.memory_channels, sequencer.channel_words
        self.a_words, self.b_words, self.c_entries = Signal(24), Signal(24), Signal(24)
        self.tile_entries, self.scalar_entries = Signal(20), Signal(8)
        self.spad_words = Signal(14)
        self.gemm_ok_shape, self.gemm_ok_bounds = Signal(), Signal()
        self.vec_ok_shape, self.vec_ok_bounds = Signal(), Signal()
        self.dma_ok_bounds, self.dma_ok_tiles = Signal(), Signal()
        self.idma_ok_shape, self.idma_ok_bounds = Signal(), Signal()
        self.idma_words, self.table_words = Signal(DIM_BITS + 8), Signal(DIM_BITS)
        self.per_word = entries_per_word(self.n)
        self.load_ok = Signal()
        self.outside = ((1 << TILE_MASK_BITS) - 1) ^ sequencer.valid_tiles
        self.dst_ok = Signal()
        vec, entries = args.vec, self.entries
        with m.Switch(vec.dst_kind):
            with m.Case(VecDst.TILE):
                m.d.comb += self.dst_ok.eq(self.fits(vec.dst, self.tile_entries, entries))
            with m.Case(VecDst.SCALAR):
                m.d.comb += self.dst_ok.eq(self.fits(vec.dst, self.scalar_entries, entries))
            with m.Case(VecDst.SPAD):
                m.d.comb += self.dst_ok.eq(self.fits(vec.dst, self.spad_words))
            with m.Default():
                m.d.comb += self.dst_ok.eq(1)

    def blocks(self, size):  # ceil(size / N)
        return (size + (self.n - 1)) >> ceil_log2(self.n)

    def fits(self, base, length, limit=None):
        return (base + length) <= (self.words if limit is None else limit)

    def memory_ok(self, dma):
        """A memory DMA names a target and a channel the chip has (no comparison that
        is constant is built: Verilator's lint refuses them)."""
        if not self.channels:
            return Const(0)
        known = (dma.target == DmaTarget.STORE) | (dma.target == DmaTarget.LOAD)
        if self.channels == 1 << CHANNEL_BITS:  # every channel index names one
            return known
        return known & (dma.channel < self.channels)

    def vec_region(self, base, scalar):
        return self.fits(base, Mux(scalar, self.scalar_entries, self.tile_entries),
                         self.entries)

    def measure(self) -> None:
        gemm, vec, blocks = self.args.gemm, self.args.vec, self.blocks
        self.m.d.sync += [
            self.a_words.eq(Mux(gemm.a_rows, blocks(gemm.k) * gemm.m, blocks(gemm.m) * gemm.k)),
            self.b_words.eq(Mux(gemm.b_rows, blocks(gemm.k) * gemm.p,
                                Mux(gemm.b_stride != 0,
                                    (gemm.k - 1)[:DIM_BITS] * gemm.b_stride + blocks(gemm.p),
                                    blocks(gemm.p) * gemm.k))),
            self.c_entries.eq((blocks(gemm.m) * blocks(gemm.p)) << ceil_log2(self.n)),
            self.tile_entries.eq((blocks(vec.rows) * vec.beats) << ceil_log2(self.n)),
            self.scalar_entries.eq(blocks(vec.rows)),
            self.spad_words.eq(Mux(vec.dst_stride != 0,
                                   (vec.rows - 1)[:7] * vec.dst_stride + vec.beats,
                                   vec.rows * vec.beats)),
            self.idma_words.eq(self.args.idma.count * self.args.idma.row),
            self.table_words.eq((self.args.idma.count + (self.per_word - 1))
                                >> ceil_log2(self.per_word)),
        ]

    def check(self) -> None:
        gemm, vec, dma = self.args.gemm, self.args.vec, self.args.dma
        fits, entries = self.fits, self.entries
        self.m.d.sync += [
            self.gemm_ok_shape.eq((gemm.m != 0) & (gemm.k != 0) & (gemm.p != 0)),
            self.gemm_ok_bounds.eq(fits(gemm.a, self.a_words) & fits(gemm.b, self.b_words)
                                   & (~gemm.a_limbs | fits(gemm.a_lo, self.a_words))
                                   & fits(gemm.c, self.c_entries, entries)),
            self.vec_ok_shape.eq((vec.rows != 0) & (vec.beats != 0)
                                 & ((vec.slot + vec.rows) <= self.slots)),
            self.vec_ok_bounds.eq(self.vec_region(vec.a, vec.a_scalar)
                                  & self.vec_region(vec.b, vec.b_scalar)
                                  & (vec.c_imm | fits(vec.c, self.scalar_entries, entries))
                                  & (~vec.total_write
                                     | fits(vec.total, self.scalar_entries, entries))
                                  & self.dst_ok),
            self.dma_ok_bounds.eq(fits(dma.src, dma.length) & fits(dma.dst, dma.length)
                                  & ((dma.target == DmaTarget.TILES)
                                     | (dma.mem_addr + dma.length <= self.channel_words
                                        if self.channels else Const(0)))),
            self.dma_ok_tiles.eq(Mux(dma.target == DmaTarget.TILES,
                                     (dma.tiles != 0) & ((dma.tiles & self.outside) == 0),
                                     self.memory_ok(dma))),
            self.load_ok.eq((self.args.load.addr < Mux(self.args.load.acc, self.entries,
                                                       self.words))
                            & (self.args.load.lane < self.n)),
            self.idma_ok_shape.eq(self.args.idma.row != 0),
            self.idma_ok_bounds.eq(
                fits(self.args.idma.table, self.table_words)
                & fits(Mux(self.args.idma.scatter, self.args.idma.src, self.args.idma.dst),
                       self.idma_words)),
        ]
