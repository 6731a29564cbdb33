"""The tensor core: an N x N output-stationary systolic array, int8 x int8 -> int32."""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from spec.numerics import NUMERICS
from spec.params import check_array_size

__all__ = ["OperandBeat", "ResultRow", "TensorCore"]

#: Array sizes the tensor core can be built at.
#: Widest A operand: a signed 17 x 8 product fits an ECP5 MULT18X18D.
MAX_A_BITS = 17


class OperandBeat(data.StructLayout):
    """One beat of an operand stream: ``n`` signed values of ``bits`` (int8 by default)
    and the end-of-tile flag.

    On the A stream a beat is one *column* of the A block (``data[i] = A[i, k]``); on the
    B stream it is one *row* of the B block (``data[j] = B[k, j]``). ``last`` marks
    ``k = K - 1`` and must be set on the same beat of both streams.
    """

    def __init__(self, n: int, bits: int = NUMERICS.operand_bits):
        super().__init__({
            "data": data.ArrayLayout(signed(bits), n),
            "last": 1,
        })


class ResultRow(data.StructLayout):
    """One beat of the result stream: row ``i`` of an N x N int32 C tile; ``last`` on row N-1."""

    def __init__(self, n: int):
        super().__init__({
            "data": data.ArrayLayout(signed(NUMERICS.acc_bits), n),
            "last": 1,
        })


class TensorCore(wiring.Component):
    """N x N output-stationary systolic array computing C = A · B one N x N tile at a time
    (B int8, A int8 or wider: ``a_bits``).

    A tile is an N x K block of A times a K x N block of B (any K >= 1). The operands
    arrive as K paired beats on ``a`` and ``b`` (see :class:`OperandBeat`); the tile's C
    leaves as N rows on ``c`` (row 0 first, ``last`` on row N-1). A block with fewer than
    N rows (M < N) is sent zero-padded; its padding rows come out as zeros and the
    consumer drops them. Larger GEMMs are sequences of tiles.

    Processing element (i, j) holds C[i, j]: A values move right along the rows, B values
    down the columns, both skewed so that PE (i, j) sees beat k at cycle k + i + j. Each
    PE copies its operands into registers that feed only its multiplier, multiplies in
    the next stage and accumulates in the one after; on the ``last`` beat it moves
    its sum to a shadow register and restarts from zero, so the next tile computes while
    the finished one drains (double buffering). Finished rows are pushed in order into a
    result FIFO; accumulation wraps modulo 2**32, exactly like :func:`golden.gemm.gemm`.

    Flow control happens only at the operand inputs, so the array itself never stalls:
    a tile's ``last`` beat is accepted only when the result FIFO has room reserved for
    its N rows and at least N cycles have passed since the previous tile's ``last`` beat.
    A stalled ``c`` therefore backs up into ``a``/``b`` and never loses or repeats a row.

    Parameters
    ----------
    n : int
        Array size, 2 to 32. Peak N² multiply-accumulates per cycle.
    a_bits : int
        Width of an A value, 8 (int8, the default) to 17: the tile's GEMM engine uses 16
        to multiply by a probability joined from two int8 limbs in one pass
        (:attr:`spec.numerics.Numerics.joined_operand_bits`). Up to 17 bits, each
        product still fits one ECP5 MULT18X18D.

    Attributes
    ----------
    a, b : stream sinks of :class:`OperandBeat`
        Consumed together: a beat is taken only when both are valid.
    c : stream source of :class:`ResultRow`
    error : Signal, out
        Sticky. Set when the two operand streams disagree on ``last`` (one ended early).
        The offending beats are not consumed, the unfinished tile is abandoned, finished
        tiles still drain on ``c``, and the core takes no more operands until reset.
    active : Signal, out
        A beat is in the array or a row in the result FIFO. While it is low and no beat
        is offered, no register of the core changes (value registers load only with a
        valid beat), so a clock gated by ``active | a.valid | b.valid`` is cycle for
        cycle the same as the free-running one.

    Latency and throughput
    ----------------------
    - One beat per cycle on ``a``/``b``; tiles follow each other without a bubble when
      K >= N (utilisation K / (K + ``latency``) for a single tile, -> 1 back to back).
      With K < N the output rate bounds it: one tile per N cycles.
    - Row 0 of a tile is valid on ``c`` ``latency`` = N + 6 cycles after its ``last``
      beat is accepted, and row i follows i cycles later when ``c`` is ready.
    """

    def __init__(self, n: int = 8, a_bits: int = NUMERICS.operand_bits):
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"tensor core size must be an integer, not {n!r}")
        check_array_size("tensor core size", n, power_of_two=False)
        if type(a_bits) is not int or not NUMERICS.operand_bits <= a_bits <= MAX_A_BITS:
            raise ValueError(f"A operand width must be {NUMERICS.operand_bits} to "
                             f"{MAX_A_BITS} bits, not {a_bits!r}")
        self.n, self.a_bits = n, a_bits
        #: Cycles from accepting a tile's ``last`` beat to its row 0 being valid on ``c``.
        self.latency = n + 6
        # Tiles whose rows are in the array or the FIFO when C is never stalled, plus the
        # one being accepted: enough reserved room that K >= N streams without a bubble.
        tiles_in_flight = -(-(self.latency + n) // n) + 1
        #: Rows the result FIFO holds (the reservation unit is one tile, N rows).
        self.result_depth = n * tiles_in_flight
        super().__init__({
            "a": In(stream.Signature(OperandBeat(n, a_bits))),
            "b": In(stream.Signature(OperandBeat(n))),
            "c": Out(stream.Signature(ResultRow(n))),
            "error": Out(1),
            "active": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.results = results = fifo.SyncFIFOBuffered(
            width=ResultRow(self.n).size, depth=self.result_depth + 1
        )
        take, take_last = self._intake(m)
        shadow, row_done = self._array(m, *self._skew(m, take, take_last))
        self._drain(m, results, shadow, row_done)
        # Quiet: no beat taken for `flush` cycles (its rows are in the FIFO by then) and
        # the FIFO empty. The value registers load only on valid beats, so no register
        # of the core changes until a beat is offered.
        flush = self.latency + self.n
        since_take = Signal(range(flush + 1), init=flush)
        with m.If(take):
            m.d.sync += since_take.eq(0)
        with m.Elif(since_take != flush):
            m.d.sync += since_take.eq(since_take + 1)
        m.d.comb += self.active.eq((since_take != flush) | (results.level != 0))
        return m

    def _intake(self, m: Module) -> tuple[Signal, Signal]:
        """Operand intake: A and B beats paired, tiles spaced N cycles apart, room for a
        tile's N result rows reserved before its last beat is taken (one extra FIFO slot
        covers the cycle an entry spends moving to its output register). Returns the
        ``take`` and ``take & last`` strobes."""
        n = self.n
        credits = Signal(range(self.result_depth + 1), init=self.result_depth)
        since_last = Signal(range(n + 1), init=n)  # cycles since the last `last` beat, max n

        both_valid = self.a.valid & self.b.valid
        mismatch = both_valid & (self.a.payload.last != self.b.payload.last)
        is_last = self.a.payload.last
        room = (credits >= n) & (since_last == n)
        take = Signal()
        m.d.comb += [
            take.eq(both_valid & ~mismatch & ~self.error & (~is_last | room)),
            self.a.ready.eq(take),
            self.b.ready.eq(take),
        ]
        with m.If(mismatch):
            m.d.sync += self.error.eq(1)

        take_last = take & is_last
        popped = self.c.valid & self.c.ready
        m.d.sync += credits.eq(credits - Mux(take_last, n, 0) + popped)
        with m.If(take_last):
            m.d.sync += since_last.eq(1)
        with m.Elif(since_last != n):
            m.d.sync += since_last.eq(since_last + 1)

        return take, take_last

    def _skew(self, m: Module, take: Signal, take_last: Signal) -> tuple[list, ...]:
        """Input skew: row i of A and column j of B enter i (resp. j) cycles late. A value
        register loads only when the beat it holds is valid (idle, the array keeps its
        values: no toggles, and nothing for a gated clock to change)."""
        n = self.n

        def delayed(value, valids, name):
            for stage, valid in enumerate(valids):
                reg = Signal.like(value, name=f"{name}_d{stage}")
                with m.If(valid):
                    m.d.sync += reg.eq(value)
                value = reg
            return value

        taken, ended = [take], [take_last]  # take, take & last delayed 0 .. n-1 cycles
        for stage in range(n - 1):
            for chain, name in ((taken, "skew_v"), (ended, "skew_l")):
                reg = Signal(name=f"{name}_d{stage}")
                m.d.sync += reg.eq(chain[-1])
                chain.append(reg)
        row_a = [delayed(self.a.payload.data[i], taken[:i], f"skew_a{i}") for i in range(n)]
        col_b = [delayed(self.b.payload.data[j], taken[:j], f"skew_b{j}") for j in range(n)]
        return row_a, taken, ended, col_b

    def _array(self, m: Module, row_a, row_valid, row_last, col_b) -> tuple[list, list]:
        """The N x N processing elements: operands pass right (A) and down (B); each PE
        multiplies in registers of its own and accumulates; the last beat moves its sum
        to a shadow register. Returns the shadows and each row's done strobe."""
        n = self.n
        acc_shape = signed(NUMERICS.acc_bits)
        operand = signed(NUMERICS.operand_bits)
        a_operand = signed(self.a_bits)
        a_reg = [[Signal(a_operand, name=f"a_{i}_{j}") for j in range(n)] for i in range(n)]
        b_reg = [[Signal(operand, name=f"b_{i}_{j}") for j in range(n)] for i in range(n)]
        v_reg = [[Signal(name=f"v_{i}_{j}") for j in range(n)] for i in range(n)]
        l_reg = [[Signal(name=f"l_{i}_{j}") for j in range(n)] for i in range(n)]
        shadow = [[Signal(acc_shape, name=f"c_{i}_{j}") for j in range(n)] for i in range(n)]
        row_done = [Signal(name=f"row_done_{i}") for i in range(n)]

        for i in range(n):
            for j in range(n):
                a_in = row_a[i] if j == 0 else a_reg[i][j - 1]
                v_in = row_valid[i] if j == 0 else v_reg[i][j - 1]
                l_in = row_last[i] if j == 0 else l_reg[i][j - 1]
                b_in = col_b[j] if i == 0 else b_reg[i - 1][j]
                with m.If(v_in):
                    m.d.sync += [a_reg[i][j].eq(a_in), b_reg[i][j].eq(b_in)]
                m.d.sync += [v_reg[i][j].eq(v_in), l_reg[i][j].eq(l_in)]
                # The multiplier gets operand registers of its own: with fanout 1 they
                # can sit next to its DSP, while a_reg/b_reg also feed the next PE. They
                # load in every cycle (they follow a_reg/b_reg, which hold still while
                # no beat is valid): the next PE's copies load only on a valid beat, so
                # the two are different cells that Yosys cannot merge into one register
                # driving both (a `keep` attribute on them does not stop it).
                mul_a = Signal(a_operand, name=f"ma_{i}_{j}")
                mul_b = Signal(operand, name=f"mb_{i}_{j}")
                mul_valid = Signal(name=f"mv_{i}_{j}")
                mul_last = Signal(name=f"ml_{i}_{j}")
                m.d.sync += [
                    mul_a.eq(a_reg[i][j]), mul_b.eq(b_reg[i][j]),
                    mul_valid.eq(v_reg[i][j]),
                    mul_last.eq(v_reg[i][j] & l_reg[i][j]),
                ]
                product = Signal(signed(self.a_bits + NUMERICS.operand_bits),
                                 name=f"p_{i}_{j}")
                p_valid = Signal(name=f"pv_{i}_{j}")
                p_last = Signal(name=f"pl_{i}_{j}")
                with m.If(mul_valid):
                    m.d.sync += product.eq(mul_a * mul_b)
                m.d.sync += [p_valid.eq(mul_valid), p_last.eq(mul_last)]
                acc = Signal(acc_shape, name=f"acc_{i}_{j}")
                total = (acc + product)[: NUMERICS.acc_bits].as_signed()
                with m.If(p_last):
                    m.d.sync += [shadow[i][j].eq(total), acc.eq(0)]
                with m.Elif(p_valid):
                    m.d.sync += acc.eq(total)
                if j == n - 1:
                    m.d.sync += row_done[i].eq(p_last)
        return shadow, row_done

    def _drain(self, m: Module, results, shadow: list, row_done: list) -> None:
        """Row i is complete the cycle after PE (i, N-1) finishes: into the result FIFO."""
        n = self.n
        push = Signal()
        push_row = Signal(ResultRow(n))
        m.d.sync += push.eq(0)
        for i in range(n):
            with m.If(row_done[i]):
                m.d.sync += [
                    push.eq(1),
                    push_row.data.eq(Cat(*shadow[i])),
                    push_row.last.eq(i == n - 1),
                ]
        m.d.comb += [
            results.w_en.eq(push),
            results.w_data.eq(push_row),
            self.c.valid.eq(results.r_rdy),
            self.c.payload.eq(results.r_data),
            results.r_en.eq(self.c.ready),
        ]

