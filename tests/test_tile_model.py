"""The tile's functional model (golden/tile_model.py) against golden and the ISA layouts."""

from __future__ import annotations

import numpy as np
import pytest

from golden.gemm import gemm, wrap
from golden.tile_model import (
    ACC_ADDR_BITS,
    COUNT_BITS,
    FIELDS,
    SEMAPHORES,
    ProgramError,
    TileModel,
    VecDst,
    VecPack,
    lanes_word,
    word_lanes,
)
from golden.vector_model import VectorOpcode as VOP
from spec import isa
from spec.isa import ENTRY_BITS, entries_per_word, index_entry


def decode_program(words: list[int]) -> list[tuple[str, dict]]:
    """Instruction words -> the model's (opcode name, fields) tuples."""
    return [(opcode.name, fields) for opcode, fields in map(isa.decode, words)]


def test_fields_and_constants_match_the_isa():
    assert ACC_ADDR_BITS == isa.ACC_ADDR_BITS
    assert (SEMAPHORES, COUNT_BITS) == (isa.SEMAPHORES, isa.COUNT_BITS)
    for opcode in isa.Opcode:
        member = isa.ARGS_OF.get(opcode)
        names = () if member is None else tuple(
            name for name, _ in isa.INSTRUCTION["args"].shape[member].shape)
        assert FIELDS[opcode.name] == names, opcode
    assert {k: getattr(VecDst, k) for k in ("TILE", "SCALAR", "SPAD", "NONE")} == {
        d.name: d.value for d in isa.VecDst}
    assert {k: getattr(VecPack, k) for k in ("BYTE", "LIMB_LO", "LIMB_HI")} == {
        d.name: d.value for d in isa.VecPack}


def test_word_lanes_round_trip():
    values = [-128, -1, 0, 1, 127, 5, -7, 9]
    assert word_lanes(lanes_word(values, 8), 8).tolist() == values


def _store_a(model, base, a, rows_layout):
    n = model.n
    m, k = a.shape
    if rows_layout:
        for c in range(-(-k // n)):
            for i in range(m):
                chunk = np.zeros(n, np.int64)
                part = a[i, c * n:(c + 1) * n]
                chunk[:part.size] = part
                model.spad[base + c * m + i] = lanes_word(chunk, n)
    else:
        padded = np.zeros((-(-m // n) * n, k), np.int64)
        padded[:m] = a
        for t in range(padded.shape[0] // n):
            for kk in range(k):
                model.spad[base + t * k + kk] = lanes_word(padded[t * n:(t + 1) * n, kk], n)


@pytest.mark.parametrize(("a_rows", "b_rows"), [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize(("m", "k", "p"), [(4, 4, 4), (5, 7, 3), (9, 13, 6), (1, 1, 1)])
def test_gemm_layouts_against_golden(a_rows, b_rows, m, k, p):
    n = 4
    rng = np.random.default_rng(m * 100 + k * 10 + p)
    a = rng.integers(-128, 128, (m, k))
    b = rng.integers(-128, 128, (k, p))
    model = TileModel(n, spad_words=512, acc_depth=256)
    _store_a(model, 0, a, a_rows)
    _store_a(model, 200, b.T, b_rows)  # B's column blocks are Bᵀ's row blocks
    c0 = 16
    program = [isa.encode(isa.Opcode.GEMM, a=0, b=200, c=c0, m=m, k=k, p=p, a_rows=a_rows,
                          b_rows=b_rows, signal={"enable": 1, "semaphore": 3}),
               isa.encode(isa.Opcode.WAIT, semaphore=3, count=1),
               isa.encode(isa.Opcode.HALT), isa.encode(isa.Opcode.NOP)]
    assert model.run(decode_program(program)) == 3 and model.halted
    want = gemm(a, b)
    tp = -(-p // n)
    got = np.array([[model.acc[c0 + ((i // n) * tp + j // n) * n + i % n, j % n]
                     for j in range(p)] for i in range(m)])
    assert (got == want).all()
    assert model.semaphores[3] == 0 and model.done["GEMM"] == [{"enable": 1, "semaphore": 3}]


@pytest.mark.parametrize("accumulate", [0, 1])
def test_gemm_writes_its_rows_up_to_m(accumulate):
    """A GEMM of m = N + 2 rows writes every row of its first row tile and two of its
    last; the padding rows keep their entries (accumulating or not), and the tile's
    counters count the rows written (an accumulating GEMM reads every row)."""
    n, m, k, p = 4, 6, 5, 7
    rng = np.random.default_rng(9 + accumulate)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, p))
    model = TileModel(n, spad_words=512, acc_depth=256)
    _store_a(model, 0, a, 1)
    _store_a(model, 200, b.T, 0)
    before = rng.integers(-(1 << 40), 1 << 40, model.acc.shape)
    model.acc[:] = before
    model.step("GEMM", {"a": 0, "b": 200, "c": 8, "m": m, "k": k, "p": p, "a_rows": 1,
                        "accumulate": accumulate, "acc_shift": 3})
    tp = -(-p // n)
    for t in range(2 * tp):  # row tile t // tp, column tile t % tp
        for r in range(n):
            entry, row = 8 + t * n + r, (t // tp) * n + r
            if row >= m:
                assert (model.acc[entry] == before[entry]).all(), (t, r)
                continue
            cols = gemm(a, b)[row]
            want = np.zeros(n, np.int64)
            width = min(n, p - (t % tp) * n)
            want[:width] = cols[(t % tp) * n:(t % tp) * n + width]
            if accumulate:
                want = wrap((before[entry] << 3) + want, 48)
            assert (model.acc[entry] == want).all(), (t, r)
    written = m * tp
    assert (model.acc_reads, model.acc_writes) == (2 * tp * n if accumulate else 0, written)


@pytest.mark.parametrize("a_rows", [0, 1])
def test_gemm_joins_a_from_two_limb_regions(a_rows):
    """``a_limbs``: A = hi·2⁷ + lo from two regions of the same layout, any int8 limbs."""
    n, m, k, p = 4, 6, 9, 5
    rng = np.random.default_rng(5 + a_rows)
    hi, lo = rng.integers(-128, 128, (2, m, k))
    hi[0], lo[0] = -128, -128  # row 0 joins to -16512, the smallest joined value
    b = rng.integers(-128, 128, (k, p))
    model = TileModel(n, spad_words=512, acc_depth=256)
    _store_a(model, 0, hi, a_rows)
    _store_a(model, 100, lo, a_rows)
    _store_a(model, 200, b.T, 0)
    model.step("GEMM", {"a": 0, "a_lo": 100, "a_limbs": 1, "b": 200, "c": 0, "m": m, "k": k,
                        "p": p, "a_rows": a_rows})
    want = wrap(((hi << 7) + lo) @ b, 32)
    tp = -(-p // n)
    got = np.array([[model.acc[((i // n) * tp + j // n) * n + i % n, j % n]
                     for j in range(p)] for i in range(m)])
    assert (got == want).all()


def test_gemm_reads_a_and_b_row_major():
    """``a_row_major``: row i of A in words a + i·⌈k⌉ …; ``b_stride`` s: row kk of B in
    words b + kk·s … (lanes past the row unused)."""
    n, m, k, p = 4, 6, 9, 5
    rng = np.random.default_rng(8)
    a, b = rng.integers(-128, 128, (m, k)), rng.integers(-128, 128, (k, p))
    model = TileModel(n, spad_words=512, acc_depth=256)
    tk = -(-k // n)
    for i in range(m):
        for c in range(tk):
            part = np.zeros(n, np.int64)
            part[:len(a[i, c * n:(c + 1) * n])] = a[i, c * n:(c + 1) * n]
            model.spad[10 + i * tk + c] = lanes_word(part, n)
    tp = -(-p // n)
    for kk in range(k):  # B row after row too, rows 3 words apart: word b + kk·3 + t
        for t in range(tp):
            part = np.zeros(n, np.int64)
            part[:len(b[kk, t * n:(t + 1) * n])] = b[kk, t * n:(t + 1) * n]
            model.spad[200 + kk * 3 + t] = lanes_word(part, n)
    model.step("GEMM", {"a": 10, "b": 200, "c": 0, "m": m, "k": k, "p": p, "a_rows": 1,
                        "a_row_major": 1, "b_stride": 3})
    got = np.array([[model.acc[((i // n) * tp + j // n) * n + i % n, j % n]
                     for j in range(p)] for i in range(m)])
    assert (got == gemm(a, b)).all()


def test_gemm_accumulate_with_shift_wraps_at_48_bits():
    n = 2
    model = TileModel(n, spad_words=16, acc_depth=8)
    model.spad[0] = lanes_word([1, 2], n)  # A column: A = [[1], [2]]
    model.spad[1] = lanes_word([3, -4], n)  # B row: B = [[3, -4]]
    model.acc[0] = [(1 << 47) - 1, -5]
    model.acc[1] = [7, 0]
    model.step("GEMM", {"a": 0, "b": 1, "c": 0, "m": 2, "k": 1, "p": 2, "accumulate": 1,
                        "acc_shift": 1})
    assert model.acc[:2].tolist() == [[int(wrap(((1 << 47) - 1) * 2 + 3, 48)), -14],
                                      [20, -8]]


def test_vec_add_tile_scalar_and_spad_pack():
    n = 4
    model = TileModel(n, spad_words=64, acc_depth=64, slots=8)
    rng = np.random.default_rng(1)
    model.acc[:16] = rng.integers(-(1 << 20), 1 << 20, (16, n))
    rows, beats = 6, 2  # two row blocks: entries 0..15 (block 0: 0..7, block 1: 8..15)
    model.step("VEC", {"op": VOP.ADD, "a": 0, "b": 0, "dst": 16, "dst_kind": VecDst.TILE,
                       "rows": rows, "beats": beats, "lo": 0, "hi": 6})
    for r in range(rows):
        for j in range(beats):
            e = (r // n) * beats * n + j * n + r % n
            want = [2 * model.acc[e, i] if j * n + i < 6 else 0 for i in range(n)]
            assert model.acc[16 + e].tolist() == want
    # SCALAR: lane 0 of each row's result into lane r % N of entry dst + r // N.
    model.step("VEC", {"op": VOP.MAX, "a": 0, "a_scalar": 1, "dst": 40,
                       "dst_kind": VecDst.SCALAR, "rows": 6, "beats": 1, "hi": 1,
                       "c_imm": 1, "imm": -(1 << 40)})
    assert [model.acc[40 + r // n, r % n] for r in range(6)] == [
        model.acc[r // n, r % n] for r in range(6)]
    # SPAD: word dst + j*rows + r, limbs of lanes.
    model.acc[48] = [0x3FFF, 0x1234, 5, 0]
    for pack, want in ((VecPack.LIMB_LO, [0x7F, 0x34, 5, 0]),
                       (VecPack.LIMB_HI, [0x7F, 0x24, 0, 0]),
                       (VecPack.BYTE, [-1, 0x34, 5, 0])):
        model.step("VEC", {"op": VOP.SUM, "a": 48, "dst": 10, "dst_kind": VecDst.SPAD,
                           "pack": pack, "rows": 1, "beats": 1, "hi": n})
        assert word_lanes(model.spad[10], n).tolist() == want


def test_vec_spad_rows_a_stride_apart():
    """``dst_stride`` s: word dst + r·s + j; the region is (rows - 1)·s + beats words."""
    n = 4
    model = TileModel(n, spad_words=64, acc_depth=64, slots=8)
    model.acc[:24] = np.arange(24 * n).reshape(24, n) % 100
    model.step("VEC", {"op": VOP.SUM, "a": 0, "dst": 20, "dst_kind": VecDst.SPAD,
                       "rows": 5, "beats": 3, "hi": 3 * n, "dst_stride": 4})
    for r in range(5):
        for j in range(3):
            e = (r // n) * 3 * n + j * n + r % n
            assert word_lanes(model.spad[20 + 4 * r + j], n).tolist() == model.acc[e].tolist()
        assert model.spad[20 + 4 * r + 3] == 0  # the gap between rows is not written
    model.step("VEC", {"op": VOP.SUM, "a": 0, "dst": 64 - 13, "dst_kind": VecDst.SPAD,
                       "rows": 3, "beats": 3, "hi": 3 * n, "dst_stride": 5})  # ends last
    with pytest.raises(ValueError, match="VEC dst"):
        model.step("VEC", {"op": VOP.SUM, "a": 0, "dst": 64 - 12, "dst_kind": VecDst.SPAD,
                           "rows": 3, "beats": 3, "hi": 3 * n, "dst_stride": 5})


def test_vec_row_max_with_total_write_and_causal_mask():
    n, rows, beats = 4, 5, 3
    model = TileModel(n, spad_words=16, acc_depth=128, slots=8)
    rng = np.random.default_rng(2)
    scores = rng.integers(-1000, 1000, (rows, beats * n))
    for r in range(rows):
        for j in range(beats):
            model.acc[(r // n) * beats * n + j * n + r % n] = scores[r, j * n:(j + 1) * n]
    model.step("VEC", {"op": VOP.MAX, "a": 0, "c_imm": 1, "imm": -(1 << 30),
                       "dst_kind": VecDst.NONE, "total": 100, "total_write": 1,
                       "rows": rows, "beats": beats, "lo": -100, "hi": 3, "causal": 1})
    for r in range(rows):
        assert model.acc[100 + r // n, r % n] == scores[r, :3 + r].max()


def test_dma_local_copy_and_remote_refused():
    model = TileModel(2, spad_words=32, acc_depth=4, position=(1, 1))
    model.spad[:4] = [1, 2, 3, 4]
    here = 1 << 9
    model.step("DMA", {"src": 0, "dst": 10, "length": 4, "tiles": here, "remote_signal": 1,
                       "remote_semaphore": 2, "signal": {"enable": 1, "semaphore": 5}})
    assert model.spad[10:14] == [1, 2, 3, 4] and model.semaphores[2] == 1
    assert model.semaphores[5] == 1
    with pytest.raises(NotImplementedError, match="NoC"):
        model.step("DMA", {"src": 0, "dst": 10, "length": 4, "tiles": here | 1})


def _table(model: TileModel, at: int, entries: list[tuple[int, int]]) -> None:
    """Write the IDMA index table of (row, tile index) ``entries`` at word ``at``."""
    per_word = entries_per_word(model.n)
    for i, (row, tile) in enumerate(entries):
        model.spad[at + i // per_word] |= index_entry(row, tile) << ENTRY_BITS * (i % per_word)


def test_idma_gathers_listed_rows_and_scatters_into_them():
    model = TileModel(4, spad_words=128, acc_depth=4, position=(1, 0), mesh=(2, 2))
    model.spad[:12] = list(range(100, 112))  # six rows of two words
    _table(model, 40, [(4, 1), (0, 1), (4, 1)])  # tile index 1 is (1, 0): this tile
    signal = {"enable": 1, "semaphore": 3}
    model.step("IDMA", {"src": 0, "dst": 60, "table": 40, "count": 3, "row": 2,
                        "remote_signal": 1, "remote_semaphore": 7, "signal": signal})
    assert model.spad[60:66] == [108, 109, 100, 101, 108, 109]
    assert model.semaphores[7] == 3 and model.semaphores[3] == 1  # rows; the last row
    assert [f["src"] for _, f in model.issued] == [8, 0, 8]
    assert [f["signal"]["enable"] for _, f in model.issued] == [0, 0, 1]
    model.step("IDMA", {"src": 60, "dst": 80, "table": 40, "count": 2, "row": 2,
                        "scatter": 1})  # row i to row entry i: 80 + 4·2, then 80 + 0
    assert model.spad[88:90] == [108, 109] and model.spad[80:82] == [100, 101]


def test_idma_passes_over_empty_entries_to_tiles_from_a_base():
    """Empty entries move nothing and leave no gap on the packed side; tiles are relative
    to ``tile_base``; an empty last entry still raises the signal (a DMA of no words)."""
    model = TileModel(4, spad_words=128, acc_depth=4, position=(1, 1), mesh=(2, 2))
    model.spad[:12] = list(range(100, 112))  # six rows of two words
    per_word = entries_per_word(model.n)
    entries = [isa.EMPTY_ENTRY, index_entry(4, 0), isa.EMPTY_ENTRY, index_entry(1, 0),
               isa.EMPTY_ENTRY]
    for i, entry in enumerate(entries):
        model.spad[40 + i // per_word] |= entry << ENTRY_BITS * (i % per_word)
    signal = {"enable": 1, "semaphore": 3}
    model.step("IDMA", {"src": 0, "dst": 60, "table": 40, "count": 5, "row": 2,
                        "remote_signal": 1, "remote_semaphore": 7, "signal": signal,
                        "tile_base": 9})  # tile index 9 is (1, 1): this tile
    assert model.spad[60:66] == [108, 109, 102, 103, 0, 0]
    assert model.semaphores[7] == 2 and model.semaphores[3] == 1
    assert [(f["length"], f["signal"]["enable"]) for _, f in model.issued] == [
        (2, 0), (2, 0), (0, 1)]
    model.step("IDMA", {"src": 60, "dst": 80, "table": 40, "count": 4, "row": 2,
                        "scatter": 1, "tile_base": 9})  # packed rows back to rows 4 and 1
    assert model.spad[88:90] == [108, 109] and model.spad[82:84] == [102, 103]
    with pytest.raises(ProgramError) as stopped:
        model.step("IDMA", {"src": 0, "dst": 60, "table": 40, "count": 2, "row": 2,
                            "tile_base": 4})  # tile index 4 is (4, 0): outside the mesh
    assert stopped.value.code == "BAD_INDEX"


def test_idma_of_no_rows_raises_its_signal_alone():
    model = TileModel(4, spad_words=64, acc_depth=4)
    model.step("IDMA", {"table": 63, "row": 4, "signal": {"enable": 1, "semaphore": 2}})
    assert model.semaphores[2] == 1
    assert model.issued == [("DMA", {"signal": {"enable": 1, "semaphore": 2}, "src": 0,
                                     "dst": 0, "length": 0, "tiles": 0, "remote_signal": 0,
                                     "remote_semaphore": 0, "target": 0, "channel": 0,
                                     "mem_addr": 0})]


@pytest.mark.parametrize(("entry", "what"), [((32, 0), "past the scratchpad"),
                                             ((0, 2), "a column outside"),
                                             ((0, 8), "a row outside")])
def test_idma_stops_at_a_bad_entry_with_the_rows_before_it_moved(entry, what):
    model = TileModel(4, spad_words=64, acc_depth=4, mesh=(2, 1))
    model.spad[:4] = [1, 2, 3, 4]
    _table(model, 50, [(1, 0), entry, (0, 0)])
    with pytest.raises(ProgramError) as stopped:
        model.step("IDMA", {"src": 0, "dst": 20, "table": 50, "count": 3, "row": 2})
    assert stopped.value.code == "BAD_INDEX", what
    assert model.spad[20:26] == [3, 4, 0, 0, 0, 0] and len(model.issued) == 1


@pytest.mark.parametrize(("fields", "message"), [
    ({"row": 0, "count": 1}, "rows of 0 words"),
    ({"row": 1, "count": 9, "table": 62}, "IDMA table"),  # 9 entries: three words
    ({"row": 8, "count": 3, "dst": 41}, "IDMA dst"),
    ({"row": 8, "count": 3, "src": 41, "scatter": 1}, "IDMA src"),
])
def test_idma_checks_the_table_and_the_consecutive_rows_first(fields, message):
    model = TileModel(4, spad_words=64, acc_depth=4)
    with pytest.raises(ValueError, match=message):
        model.step("IDMA", fields)
    assert model.issued == []


@pytest.mark.parametrize(("instruction", "message"), [
    (("WAIT", {"semaphore": 1, "count": 1}), "block forever"),
    (("GEMM", {"m": 0, "k": 1, "p": 1}), "must be >= 1"),
    (("GEMM", {"a": 60, "m": 4, "k": 8, "p": 4}), "GEMM A"),
    (("GEMM", {"c": 61, "m": 4, "k": 1, "p": 4}), "GEMM C"),
    (("GEMM", {"a_limbs": 1, "a_lo": 60, "m": 4, "k": 8, "p": 4}), "GEMM A low limb"),
    (("VEC", {"rows": 0, "beats": 1}), "rows=0"),
    (("VEC", {"rows": 3, "beats": 1, "slot": 2}), "slots"),
    (("VEC", {"op": 15, "rows": 1, "beats": 1}), "not a vector opcode"),
    (("VEC", {"a": 60, "rows": 1, "beats": 2}), "VEC a"),
    (("VEC", {"dst": 63, "dst_kind": VecDst.SPAD, "rows": 1, "beats": 2}), "VEC dst"),
    (("VEC", {"total": 64, "total_write": 1, "rows": 1, "beats": 1}), "VEC total"),
    (("VEC", {"dst": 8, "dst_kind": VecDst.TILE, "total": 15, "total_write": 1,
              "rows": 1, "beats": 2}), "overlap"),
    (("DMA", {"tiles": 0}), "no tile"),
    (("DMA", {"src": 60, "length": 8, "tiles": 1}), "DMA src"),
    (("SIGNAL", {"semaphore": 16, "count": 1}), "semaphore 16"),
    (("VEC", {"bogus": 1}), "no field"),
    (("JUMP", {}), "unknown opcode"),
])
def test_bad_instructions_are_refused(instruction, message):
    model = TileModel(4, spad_words=64, acc_depth=64, slots=4)
    before = model.acc.copy()
    with pytest.raises(ValueError, match=message):
        model.step(*instruction)
    assert (model.acc == before).all()


def test_semaphore_overflow_and_read_after_write_hazard():
    model = TileModel(4, spad_words=8, acc_depth=64)
    model.step("SIGNAL", {"semaphore": 0, "count": (1 << 16) - 1})
    with pytest.raises(ValueError, match="would pass"):
        model.step("SIGNAL", {"semaphore": 0, "count": 1})
    # A tile dst over a's later beats is a hazard: beat 1 reads entry 4, which beat 0
    # wrote (the engine reads long before it writes, so it would see the old value).
    with pytest.raises(ValueError, match="after an earlier beat"):
        model.step("VEC", {"op": VOP.SUM, "a": 0, "dst": 4, "dst_kind": VecDst.TILE,
                           "rows": 1, "beats": 2})
    # In place (each beat writes only what it read) is fine.
    model.step("VEC", {"op": VOP.SUM, "a": 0, "dst": 0, "dst_kind": VecDst.TILE,
                       "rows": 1, "beats": 2})
