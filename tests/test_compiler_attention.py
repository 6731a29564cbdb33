"""The attention compiler (compiler/) on the functional tile model, bit-exact with golden.

Every program is encoded to 256-bit words, decoded with ``spec.isa.decode`` and run on
``golden.tile_model.TileModel`` (``compiler.run_on_model``); its output must equal
``golden.attention.attention_prefill(block_keys=page_size)`` / ``attention_decode``
exactly. The model runs one instruction at a time, so the engines' concurrency is
checked separately by ``compiler.check_synchronisation`` on every program.
"""

from __future__ import annotations

import numpy as np
import pytest

from compiler import (
    AttentionLayer,
    PageAllocator,
    TileConfig,
    build_decode,
    build_extend,
    build_prefill,
    check_synchronisation,
    decode_from_workload,
    prefill_from_workload,
    run_on_model,
)
from compiler.emit import ENGINE_SEMAPHORES
from compiler.hazards import accesses, executed_ops
from compiler.program import encode_ops
from golden.attention import AttentionScales, _multipliers, attention_decode, attention_prefill
from golden.exp import quantize_log2_logit
from golden.kv_cache import PagedKVCache, build_cache
from golden.vector_model import VectorOpcode as VOP
from golden.workloads import generate
from spec.isa import Opcode, VecDst
from spec.numerics import NUMERICS

TINY_CONTEXTS = (1, 4, 5, 13)
GPT_OSS_CONTEXTS = (77, 1030)


@pytest.fixture(scope="module")
def tiny():
    return generate("tiny", decode_context_lens=TINY_CONTEXTS)


@pytest.fixture(scope="module")
def gpt_oss():
    return generate("gpt-oss", decode_context_lens=GPT_OSS_CONTEXTS, prefill_tokens=24,
                    moe_tokens=2)


def _config(workload, **overrides) -> TileConfig:
    c = workload.config
    return TileConfig.for_attention(c.head_dim, c.v_head_dim, c.page_size, **overrides)


def _expected_decode(workload, layer: int) -> np.ndarray:
    t, p = workload.tensors, f"attn{layer}."
    cache = PagedKVCache(t[p + "k_pages"], t[p + "v_pages"])
    return attention_decode(t[p + "q_decode"], cache, t[p + "block_table"],
                            t[p + "context_lens"], workload.attention_scales(layer),
                            window=workload.config.windows[layer], sinks=workload.sinks(layer))


def _expected_prefill(workload, layer: int) -> np.ndarray:
    t, p = workload.tensors, f"attn{layer}."
    return attention_prefill(t[p + "q_prefill"], t[p + "k_prefill"], t[p + "v_prefill"],
                             workload.attention_scales(layer),
                             window=workload.config.windows[layer],
                             sinks=workload.sinks(layer), block_keys=workload.config.page_size)


def _run(program):
    check_synchronisation(program.ops, program.config.n)
    output, _ = run_on_model(program)
    return output


# --- the workloads --------------------------------------------------------------------------

@pytest.mark.parametrize("layer", [0, 1], ids=["window5", "full"])
def test_tiny_decode(tiny, layer):
    cfg = _config(tiny, spad_words=4096, num_pages=64)
    expected = _expected_decode(tiny, layer)
    for sequence, context in enumerate(TINY_CONTEXTS):
        program = decode_from_workload(cfg, tiny, layer, sequence,
                                       allocator=PageAllocator(cfg, seed=sequence))
        assert program.kv.tokens == context
        np.testing.assert_array_equal(_run(program)[0], expected[sequence],
                                      err_msg=f"context {context}")


@pytest.mark.parametrize("layer", [0, 1], ids=["window5", "full"])
def test_tiny_prefill(tiny, layer):
    cfg = _config(tiny, spad_words=4096, num_pages=64)
    program = prefill_from_workload(cfg, tiny, layer)
    np.testing.assert_array_equal(_run(program), _expected_prefill(tiny, layer))
    notes = program.summary.notes
    # 4-key pages < N = 8 lanes: the window's masks need one position per chunk (a
    # group's heads); the full layer runs consecutive tokens with causal bounds.
    if layer == 0:
        assert notes["causal_chunks"] == 0 and notes["rows_per_chunk"] == tiny.config.heads // 2
    else:
        assert notes["causal_chunks"] == notes["chunks"]


@pytest.mark.parametrize("layer", [0, 1], ids=["window128", "full"])
@pytest.mark.parametrize("sequence", [0, 1], ids=[f"ctx{c}" for c in GPT_OSS_CONTEXTS])
def test_gpt_oss_decode(gpt_oss, layer, sequence):
    cfg = _config(gpt_oss)
    program = decode_from_workload(cfg, gpt_oss, layer, sequence,
                                   allocator=PageAllocator(cfg, seed=7))
    np.testing.assert_array_equal(_run(program)[0], _expected_decode(gpt_oss, layer)[sequence])
    context = GPT_OSS_CONTEXTS[sequence]
    window = gpt_oss.config.windows[layer]
    ps = cfg.page_size
    first = 0 if window is None else max(0, context - window) // ps
    blocks = (context - 1) // ps + 1 - first
    assert program.summary.notes["key_blocks"] == blocks * gpt_oss.config.kv_heads


@pytest.mark.parametrize("layer", [0, 1], ids=["window128", "full"])
def test_gpt_oss_prefill(gpt_oss, layer):
    program = prefill_from_workload(_config(gpt_oss), gpt_oss, layer)
    np.testing.assert_array_equal(_run(program), _expected_prefill(gpt_oss, layer))
    assert program.summary.notes["causal_chunks"] == program.summary.notes["chunks"]


# --- other shapes ------------------------------------------------------------------------------

SHAPES = {
    # n, heads, kv_heads, head_dim, v_head_dim, page_size, window, sinks, tokens, slots
    "mqa-rows>N": (8, 12, 1, 40, 32, 8, None, True, 19, 16),
    "group>slots": (8, 16, 1, 40, 32, 16, 7, True, 20, 3),
    "window-causal-pages": (8, 4, 2, 12, 20, 16, 20, True, 40, 8),
    "n4-window": (4, 8, 2, 32, 32, 16, 5, True, 30, 8),
    "n16-tiny-pages": (16, 6, 2, 12, 12, 4, 5, True, 11, 8),
    "mha-page1": (8, 4, 4, 12, 12, 1, 2, False, 6, 8),
}


def _layer(rng, heads: int, kvh: int, d: int, dv: int, ps: int, window: int | None,
           sinks: bool) -> tuple[AttentionLayer, AttentionScales, np.ndarray | None]:
    """A layer of that shape with fixed scales and (``sinks``) random sink logits; the
    layer, its scales and the sink logits."""
    scales = AttentionScales(0.02, 0.03, 0.05, 0.03)
    sink_logits = rng.normal(1.0, 3.0, heads) if sinks else None
    (lm, ls), (om, osh) = _multipliers(scales, d, NUMERICS)
    layer = AttentionLayer(heads, kvh, d, dv, ps, window,
                           None if sink_logits is None else
                           tuple(int(x) for x in quantize_log2_logit(sink_logits)),
                           lm, ls, om, osh)
    return layer, scales, sink_logits


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_shapes_against_golden(shape):
    n, heads, kvh, d, dv, ps, window, sinks, tokens, slots = shape
    rng = np.random.default_rng(sum(shape[:6]))
    q, k, v = (rng.integers(-128, 128, s).astype(np.int8)
               for s in ((tokens, heads, d), (tokens, kvh, d), (tokens, kvh, dv)))
    layer, scales, sink_logits = _layer(rng, heads, kvh, d, dv, ps, window, sinks)
    cfg = TileConfig.for_attention(d, dv, ps, n=n, slots=slots, spad_words=65536,
                                   num_pages=256, max_pages=64, kv_sequences=16,
                                   acc_depth=1024)
    program = build_prefill(cfg, layer, q, k, v, allocator=PageAllocator(cfg, seed=1))
    expected = attention_prefill(q, k, v, scales, window=window, sinks=sink_logits,
                                 block_keys=ps)
    np.testing.assert_array_equal(_run(program), expected)
    notes = program.summary.notes
    assert notes["rows_per_chunk"] <= slots
    assert (notes["lanes"], notes["pv_double"]) == (min(2, notes["chunks"]), 1)
    for first in (1, tokens // 2, tokens - 1):  # a chunk over a cached context
        program = build_extend(cfg, layer, q[first:], k, v)
        np.testing.assert_array_equal(_run(program), expected[first:],
                                      err_msg=f"extend from {first}")
        assert program.kind == "extend"
    for context in (1, tokens):
        cache, table = build_cache([k[:context]], [v[:context]], ps, rng=rng)
        expected = attention_decode(q[context - 1:context], cache, table, np.array([context]),
                                    scales, window=window, sinks=sink_logits)
        program = build_decode(cfg, layer, q[context - 1], k[:context], v[:context])
        np.testing.assert_array_equal(_run(program), expected, err_msg=f"context {context}")


@pytest.mark.parametrize("window", [None, 96], ids=["full", "window96"])
def test_compact_programs_run_what_the_straight_ones_do(window):
    """Loops over key blocks (``loops=True``): the same output, and the tile model
    executes exactly the straight program's instructions (page addresses from the page
    table, LOADs aside), which are synchronised; the length does not grow with the
    context."""
    rng = np.random.default_rng(7)
    layer, scales, sinks = _layer(rng, 4, 2, 16, 16, 8, window, True)
    cfg = TileConfig.for_attention(16, 16, 8, spad_words=32768, num_pages=256, max_pages=64,
                                   kv_sequences=16, acc_depth=1024)
    lengths = []
    for context in (150, 230):
        q, k, v = (rng.integers(-128, 128, (context, *s)).astype(np.int8)
                   for s in ((4, 16), (2, 16), (2, 16)))
        expected = attention_prefill(q, k, v, scales, window=window, sinks=sinks,
                                     block_keys=8)[-16:]
        straight, compact = (build_extend(cfg, layer, q[-16:], k, v, loops=loops,
                                          allocator=PageAllocator(cfg, seed=context))
                             for loops in (False, True))
        assert straight.summary.notes["loops"] == 0 < compact.summary.notes["loops"]
        assert len(compact.ops) < len(straight.ops)
        assert compact.summary.macs == straight.summary.macs
        output, model = run_on_model(compact)
        np.testing.assert_array_equal(output, expected)
        ran = [(op, f) for op, f in executed_ops(model.executed) if op != Opcode.LOAD]
        assert encode_ops(ran) == straight.instructions[:-1]  # the model logs no HALT
        check_synchronisation(executed_ops(model.executed), cfg.n)
        lengths.append(len(compact.ops))
    assert lengths[0] == lengths[1]


def test_a_long_program_is_made_compact():
    """Without ``loops``, a program is made compact only when the straight one does not
    fit the program memory; with ``loops=False`` that is refused."""
    rng = np.random.default_rng(8)
    layer, scales, _ = _layer(rng, 2, 1, 8, 8, 8, None, False)
    q, k, v = (rng.integers(-128, 128, (400, *s)).astype(np.int8)
               for s in ((2, 8), (1, 8), (1, 8)))
    cfg = TileConfig.for_attention(8, 8, 8, spad_words=16384, num_pages=128, max_pages=64,
                                   kv_sequences=2, program_depth=512)
    program = build_decode(cfg, layer, q[-1], k, v)
    assert program.summary.notes["loops"] == 1 and len(program.ops) <= 512
    assert program.summary.notes["key_blocks"] == 50
    np.testing.assert_array_equal(run_on_model(program)[0][0], attention_decode(
        q[-1:], *build_cache([k], [v], 8, rng=rng), np.array([400]), scales)[0])
    with pytest.raises(ValueError, match="needs .* instructions .* program_depth = 512"):
        build_decode(cfg, layer, q[-1], k, v, loops=False)


def test_chunks_shrink_to_fit_the_accumulator():
    wl = generate("deepseek-r1", decode_context_lens=(40,), prefill_tokens=4, moe_tokens=2)
    big = _config(wl, slots=16, acc_depth=1024, num_pages=64)
    small = _config(wl, slots=16, acc_depth=256, num_pages=64)
    expected = _expected_decode(wl, 0)[0]
    rows = []
    for cfg in (big, small):
        program = decode_from_workload(cfg, wl, 0)
        np.testing.assert_array_equal(_run(program)[0], expected)
        assert program.summary.acc_entries <= cfg.acc_depth
        rows.append(program.summary.notes["rows_per_chunk"])
    assert rows == [16, 8]


# --- the host side: KV pages, summary, synchronisation ----------------------------------------

def test_kv_appends_fill_the_pages_the_program_reads(tiny):
    """A KV port model (docs/scratchpad.md: MAP, then APPEND word w of token len[seq],
    ``last`` commits) fed with kv_map and kv_appends leaves exactly kv_words."""
    cfg = _config(tiny, spad_words=4096, num_pages=64)
    program = decode_from_workload(cfg, tiny, 1, 3, allocator=PageAllocator(cfg, seed=3))
    table: dict[tuple[int, int], int] = {}
    for seq, index, phys in program.kv_map:
        assert (seq, index) not in table and 0 <= phys < cfg.num_pages
        table[seq, index] = phys
    assert len(set(table.values())) == len(table)  # no page aliased
    lengths: dict[int, int] = {}
    memory: dict[int, int] = {}
    for seq, word, data, last in program.kv_appends:
        t = lengths.get(seq, 0)
        assert 0 <= word < cfg.token_words
        base = cfg.kv_start + (table[seq, t // cfg.page_size] * cfg.token_words + word) \
            * cfg.page_size
        memory[base + t % cfg.page_size] = data
        lengths[seq] = t + int(last)
    assert set(lengths.values()) == {TINY_CONTEXTS[3]}
    assert len(lengths) == 2 * tiny.config.kv_heads
    assert memory == program.kv_words
    # The token-level function gives the same requests.
    k = np.zeros((tiny.config.kv_heads, tiny.config.head_dim), np.int8)
    v = np.ones((tiny.config.kv_heads, tiny.config.v_head_dim), np.int8)
    appends = program.kv.token_appends(k, v)
    assert [a[0] for a in appends if a[3]] == list(range(2 * tiny.config.kv_heads))


def test_summary_counts(tiny, gpt_oss):
    cfg = _config(gpt_oss)
    program = decode_from_workload(cfg, gpt_oss, 1, 1)
    s = program.summary
    steps, kvh = s.notes["key_blocks"], gpt_oss.config.kv_heads
    assert steps == 2 * 65
    digits = s.instructions["GEMM"] - 2 * steps  # the sink constants' GEMMs
    assert 1 <= digits <= 3
    # The two KV heads' chunks run as two lanes, block by block; the emitter waits for
    # each block's own producers: its scores GEMM (before LOGIT), its P (before its P·V
    # GEMM) and its P·V (before RESCALE). Their P·V buffers are one per lane (two per
    # lane would not fit 256 accumulator entries).
    assert (s.notes["lanes"], s.notes["pv_double"]) == (2, 0)
    assert s.instructions["WAIT"] == 3 * steps
    assert s.vec_ops["LOGIT"] == steps and s.vec_ops["EXP"] == 3 * steps
    assert s.vec_ops["RECIP"] == s.vec_ops["REQUANT"] == kvh
    assert s.length == len(program.instructions) <= cfg.program_depth
    page = cfg.page_size * cfg.n  # bytes of one 8-channel chunk of a page
    assert s.kv_bytes_read == s.kv_bytes_unique == steps * 2 * 4 * page  # K and V once
    heads, d = gpt_oss.config.heads, gpt_oss.config.head_dim
    # Q·Kᵀ and a one-pass P·V per page and head, plus the small constant GEMMs.
    macs = steps * heads // kvh * 16 * (d + d)
    assert macs <= s.macs < macs + 3 * 64 * 64 * cfg.n
    tiny_program = decode_from_workload(_config(tiny, spad_words=4096, num_pages=64), tiny, 1, 3)
    assert tiny_program.summary.notes["key_blocks"] == 2 * 4
    assert tiny_program.summary.as_dict()["length"] == len(tiny_program.instructions)


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_every_wait_is_needed(tiny, kind):
    """Dropping any WAIT together with the signals it consumes leaves a cross-engine
    hazard that check_synchronisation reports; the program itself passes. The WAITs
    are the emitter's (compiler.emit): on the GEMM and VEC engines' semaphores."""
    cfg = _config(tiny, spad_words=4096, num_pages=64)
    build = decode_from_workload if kind == "decode" else prefill_from_workload
    ops = build(cfg, tiny, 1, 3).ops
    check_synchronisation(ops, cfg.n)
    waits = [j for j, (op, _) in enumerate(ops) if op == Opcode.WAIT]
    assert {ops[j][1]["semaphore"] for j in waits} == {ENGINE_SEMAPHORES[Opcode.GEMM],
                                                       ENGINE_SEMAPHORES[Opcode.VEC]}
    for j in waits:
        sem, count = ops[j][1]["semaphore"], ops[j][1]["count"]
        before = sum(ops[i][1]["count"] for i in waits if i < j and ops[i][1]["semaphore"] == sem)
        signallers = [i for i, (op, f) in enumerate(ops)
                      if op != Opcode.WAIT and (f.get("signal") or {}).get("enable")
                      and f["signal"]["semaphore"] == sem]
        broken = [(op, dict(f)) for op, f in ops]
        for s in signallers[before:before + count]:
            broken[s][1]["signal"] = {"enable": 0, "semaphore": 0}
        del broken[j]
        with pytest.raises(ValueError, match="no WAIT orders them"):
            check_synchronisation(broken, cfg.n)


def test_consecutive_vec_instructions_are_independent(gpt_oss):
    """Two lanes interleaved: no VEC instruction reads what the VEC instruction just
    before it writes (the VEC engine would wait for its whole pipeline), in decode and
    in prefill."""
    cfg = _config(gpt_oss)
    for program in (decode_from_workload(cfg, gpt_oss, 1, 0),
                    prefill_from_workload(cfg, gpt_oss, 1)):
        vecs = [accesses(op, f, cfg.n) for op, f in program.ops if op == Opcode.VEC]
        assert len(vecs) > 60
        assert not [j for j in range(1, len(vecs)) if vecs[j][0] & vecs[j - 1][1]]


@pytest.mark.parametrize("kind", list(VecDst))
def test_vec_destinations_are_accesses(kind):
    """A VEC's destination counts as written whether dst_kind is the enum or its value
    (programs carry values)."""
    fields = {"op": int(VOP.ADD), "rows": 3, "beats": 2, "a": 0, "b": 0, "dst": 100,
              "total": 200, "total_write": 1}
    want = {VecDst.TILE: set(range(100, 116)), VecDst.SCALAR: {100},
            VecDst.SPAD: set(range(100, 106)), VecDst.NONE: set()}[kind]
    want = {x if kind == VecDst.SPAD else x + (1 << 20) for x in want} | {200 + (1 << 20)}
    for value in (kind, kind.value):
        _, writes = accesses(Opcode.VEC, {**fields, "dst_kind": value}, 8)
        assert writes == want


def test_unbalanced_or_deadlocked_semaphores_are_refused(tiny):
    cfg = _config(tiny, spad_words=4096, num_pages=64)
    ops = decode_from_workload(cfg, tiny, 1, 0).ops
    signalling = next((op, f) for op, f in ops
                      if op == Opcode.GEMM and f.get("signal", {}).get("enable"))
    with pytest.raises(ValueError, match="waited for at HALT"):
        check_synchronisation(ops[:-1] + [signalling, ops[-1]], cfg.n)
    extra = (Opcode.WAIT, {"semaphore": ENGINE_SEMAPHORES[Opcode.VEC], "count": 1})
    with pytest.raises(ValueError, match="deadlocks"):
        check_synchronisation([extra] + ops, cfg.n)


@pytest.mark.parametrize("banks", [8, 4])
def test_gemm_operands_start_half_the_banks_apart(gpt_oss, banks):
    """Every scores and P·V GEMM reads its A operand (queries, P's high limbs) from a
    region starting in bank banks/2, P's low limbs from bank 3·banks/4 and its B operand
    (a K or V page) from bank 0, so the streams do not ask the same bank in the same
    cycle."""
    cfg = _config(gpt_oss, banks=banks)
    program = decode_from_workload(cfg, gpt_oss, 1, 1, allocator=PageAllocator(cfg, seed=7))
    kv = [f for op, f in program.ops if op == Opcode.GEMM and f["b"] >= cfg.kv_start]
    assert len(kv) == 2 * program.summary.notes["key_blocks"]  # scores + one-pass P·V
    assert {(f["a"] % banks, f["b"] % banks) for f in kv} == {(banks // 2, 0)}
    pv = [f for f in kv if f.get("a_limbs")]
    assert len(pv) == program.summary.notes["key_blocks"]
    assert {f["a_lo"] % banks for f in pv} == {3 * banks // 4}


# --- refusals ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "message"), [
    ({"n": 3}, "n must be a power of two"),
    ({"acc_depth": 300}, "acc_depth"),
    ({"slots": 0}, "slots"),
    ({"program_depth": 1000}, "program_depth"),
    ({"page_size": 12}, "page_size"),
    ({"spad_words": 1 << 17}, "spad_words"),
    ({"num_pages": 1000}, "do not fit"),
    ({"kv_base": 100}, "kv_base"),
    ({"kv_sequences": 16, "max_pages": 256}, "at most 2048"),
    ({"banks": 6}, "banks must be a power of two"),
    ({"banks": 128}, "banks must be a power of two up to 64"),
    ({"spad_words": 1000, "banks": 16, "num_pages": 1}, "divides spad_words"),
    ({"spad_words": 48, "banks": 16, "num_pages": 1}, "each bank's depth"),
    ({"spad_words": 16, "banks": 16, "num_pages": 1}, "power of two >= 2, not 16 / 16"),
])
def test_bad_tile_config(fields, message):
    with pytest.raises(ValueError, match=message):
        TileConfig(**fields)


def test_refuses_what_does_not_fit(tiny, gpt_oss):
    t = tiny.tensors
    ok = _config(tiny, spad_words=4096, num_pages=64)
    cases = [
        (_config(tiny, spad_words=4096, num_pages=64, program_depth=64), "program_depth"),
        (_config(tiny, spad_words=4096, num_pages=4), "KV pages"),
        (_config(tiny, spad_words=4096, num_pages=64, max_pages=2), "max_pages"),
        (_config(tiny, spad_words=4096, num_pages=64, kv_sequences=2), "kv_sequences"),
        (_config(tiny, spad_words=1024, num_pages=126), "scratchpad full"),
        (_config(tiny, spad_words=4096, num_pages=64, acc_depth=16), "accumulator memory full"),
        (TileConfig.for_attention(12, 12, 8, spad_words=4096, num_pages=32), "page_size"),
        (TileConfig.for_attention(8, 8, 4, spad_words=4096, num_pages=64), "token_words"),
    ]
    for cfg, message in cases:
        with pytest.raises(ValueError, match=message):
            decode_from_workload(cfg, tiny, 1, 3)
    layer = AttentionLayer.from_workload(tiny, 1)
    q = t["attn1.q_decode"][0]
    k = np.zeros((5, 2, 12), np.int8)
    with pytest.raises(ValueError, match="int8"):
        build_decode(ok, layer, q.astype(np.int16), k, k)
    with pytest.raises(ValueError, match="shape"):
        build_decode(ok, layer, q, k, k[:4])
    with pytest.raises(ValueError, match="context >= 1"):
        build_decode(ok, layer, q, k[:0], k[:0])
    with pytest.raises(ValueError, match="tokens >= 1"):
        build_prefill(ok, layer, t["attn1.q_prefill"][0], k, k)
    with pytest.raises(ValueError, match="multiple"):
        AttentionLayer(6, 4, 12, 12, 4, None, None, 1, 1, 1, 1)
    # A page of 2048 keys fits the VEC beats at N = 32, but its one-pass P·V could wrap.
    wide = TileConfig.for_attention(8, 8, 2048, n=32, num_pages=2, spad_words=16384)
    k8 = np.zeros((5, 1, 8), np.int8)
    with pytest.raises(ValueError, match="sums at most 1024 keys"):
        build_decode(wide, AttentionLayer(1, 1, 8, 8, 2048, None, None, 1, 1, 1, 1),
                     np.zeros((1, 8), np.int8), k8, k8)
    with pytest.raises(ValueError, match="attention layers 0..1"):
        AttentionLayer.from_workload(tiny, 2)
    # A 4096-token gpt-oss decode: straight, it does not fit the default config's
    # program memory; compact, it does, and its context does not fit the block table.
    layer = AttentionLayer.from_workload(gpt_oss, 1)
    cfg = _config(gpt_oss)
    kk = np.zeros((4096, 2, 32), np.int8)
    with pytest.raises(ValueError, match="needs 5641 instructions .* program_depth"):
        build_decode(cfg, layer, gpt_oss.tensors["attn1.q_decode"][0], kk, kk, loops=False)
    with pytest.raises(ValueError, match="256 pages of 16 .* max_pages = 128"):
        build_decode(cfg, layer, gpt_oss.tensors["attn1.q_decode"][0], kk, kk)
