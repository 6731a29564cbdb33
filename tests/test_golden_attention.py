"""Attention golden: integer model against float64, bit-exact identities, properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden.attention import (
    AttentionScales,
    attention_decode,
    attention_decode_float,
    attention_prefill,
    attention_prefill_float,
    calibrate_out_scale,
    cosine,
    lsb_error,
)
from golden.expected import accuracy, compute_expected
from golden.gemm import gemm
from golden.kv_cache import build_cache
from golden.workloads import generate, quantize
from spec.numerics import NUMERICS

COSINE_MIN = 0.999
LSB_MAX = 3.0


def _random_qkv(rng, tokens, heads, kv_heads, dim, v_dim, spread=2.5):
    k = rng.standard_normal((tokens, kv_heads, dim))
    k[:, :, 0] *= 5  # an outlier channel
    q = rng.standard_normal((tokens, heads, dim)) * spread / np.sqrt(np.mean(k**2))
    v = rng.standard_normal((tokens, kv_heads, v_dim))
    (q, sq), (k, sk), (v, sv) = quantize(q), quantize(k), quantize(v)
    return q, k, v, sq, sk, sv


@pytest.mark.parametrize("workload", ["gpt-oss", "deepseek-r1", "kimi-k2"])
@pytest.mark.parametrize("context", [1, 2, 17, 4096])
def test_decode_accuracy_vs_float(workload, context):
    wl = generate(workload, decode_context_lens=(context,), prefill_tokens=8, moe_tokens=2)
    acc = accuracy(wl, compute_expected(wl))
    for layer in range(len(wl.config.windows)):
        assert acc[f"attn{layer}.decode.cosine"] >= COSINE_MIN
        assert acc[f"attn{layer}.decode.max_lsb_error"] <= LSB_MAX


def test_workload_prefill_and_batched_decode_accuracy():
    wl = generate("gpt-oss", prefill_tokens=96, moe_tokens=2)
    acc = accuracy(wl, compute_expected(wl))
    for key, value in acc.items():
        if key.startswith("attn") and key.endswith(".cosine"):
            assert value >= COSINE_MIN, key
        if key.endswith("max_lsb_error"):
            assert value <= LSB_MAX, key
    # the integer model's own error is rounding-sized, not just within the target
    assert max(v for k, v in acc.items() if k.endswith("max_lsb_error")) < 1.0


def test_prefill_row_equals_decode_bit_exact():
    rng = np.random.default_rng(5)
    q, k, v, sq, sk, sv = _random_qkv(rng, 45, 6, 2, 12, 10)
    sinks = rng.normal(1, 1, 6)
    scales = AttentionScales(sq, sk, sv, sv / 2)
    for window in (None, 9):
        pre = attention_prefill(q, k, v, scales, window=window, sinks=sinks, block_keys=8)
        lens = np.array([1, 8, 9, 30, 45])
        cache, table = build_cache([k[:n] for n in lens], [v[:n] for n in lens], 8,
                                   num_pages=40, rng=rng)
        dec = attention_decode(q[lens - 1], cache, table, lens, scales, window=window,
                               sinks=sinks)
        np.testing.assert_array_equal(dec, pre[lens - 1])


def test_batch_equals_single_sequences():
    rng = np.random.default_rng(6)
    q, k, v, sq, sk, sv = _random_qkv(rng, 70, 4, 4, 16, 16)
    scales = AttentionScales(sq, sk, sv, sv)
    lens = [70, 3, 33]
    cache, table = build_cache([k[:n] for n in lens], [v[:n] for n in lens], 16, rng=rng)
    qd = q[:3]
    both = attention_decode(qd, cache, table, np.array(lens), scales)
    for b, n in enumerate(lens):
        c1, t1 = build_cache([k[:n]], [v[:n]], 16)
        one = attention_decode(qd[b:b + 1], c1, t1, np.array([n]), scales)
        np.testing.assert_array_equal(both[b], one[0])


def test_pv_limbs_equal_int8_gemms():
    """The 14-bit P.V product equals two int8 GEMMs (hi and lo 7-bit limbs) recombined."""
    rng = np.random.default_rng(7)
    p = rng.integers(0, NUMERICS.attn_p_max + 1, (8, 16))
    v = rng.integers(-128, 128, (16, 12))
    hi, lo = p >> 7, p & 127
    assert hi.max() <= 127 and NUMERICS.attn_p_limbs == 2
    np.testing.assert_array_equal(
        (gemm(hi, v).astype(np.int64) << 7) + gemm(lo, v), p @ v
    )


def test_block_size_changes_rounding_only_slightly():
    rng = np.random.default_rng(8)
    q, k, v, sq, sk, sv = _random_qkv(rng, 100, 2, 1, 16, 16)
    scales = AttentionScales(sq, sk, sv, sv)
    a = attention_prefill(q, k, v, scales, block_keys=4).astype(int)
    b = attention_prefill(q, k, v, scales, block_keys=100).astype(int)
    assert np.abs(a - b).max() <= 1


def test_sink_and_window_semantics():
    rng = np.random.default_rng(9)
    q, k, v, sq, sk, sv = _random_qkv(rng, 20, 2, 1, 8, 8)
    scales = AttentionScales(sq, sk, sv, sv)
    # a huge sink soaks up all attention: the output goes to zero
    big = attention_prefill(q, k, v, scales, sinks=np.array([40.0, 40.0]))
    assert np.abs(big).max() == 0
    # window 1: each token sees only itself, the output is its own value
    own = attention_prefill(q, k, v, scales, window=1)
    np.testing.assert_array_equal(own, np.repeat(v, 2, axis=1))
    # float twin: window 1 as well
    np.testing.assert_allclose(
        attention_prefill_float(q, k, v, scales, window=1), np.repeat(v * sv, 2, axis=1)
    )


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    kv_heads=st.integers(1, 3),
    group=st.sampled_from([1, 2, 3, 8]),
    dim=st.sampled_from([3, 7, 12, 24, 40]),
    v_dim=st.sampled_from([5, 16]),
    page=st.sampled_from([1, 3, 8, 16]),
    lens=st.lists(st.integers(1, 90), min_size=1, max_size=3),
    window=st.sampled_from([None, 1, 7, 50]),
    sink=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_decode_property(kv_heads, group, dim, v_dim, page, lens, window, sink, seed):
    rng = np.random.default_rng(seed)
    heads = kv_heads * group
    n = max(max(lens), len(lens))
    q, k, v, sq, sk, sv = _random_qkv(rng, n, heads, kv_heads, dim, v_dim)
    sinks = rng.normal(0, 2, heads) if sink else None
    cache, table = build_cache([k[:m] for m in lens], [v[:m] for m in lens], page, rng=rng)
    qd = q[: len(lens)]
    lens = np.array(lens)
    base = AttentionScales(sq, sk, sv, 1.0)
    ref = attention_decode_float(qd, cache, table, lens, base, window=window, sinks=sinks)
    scales = AttentionScales(sq, sk, sv, calibrate_out_scale(ref))
    y = attention_decode(qd, cache, table, lens, scales, window=window, sinks=sinks)
    assert y.shape == (len(lens), heads, v_dim) and y.dtype == np.int8
    assert lsb_error(y, ref, scales.out) <= LSB_MAX
    assert cosine(y * scales.out, ref) >= COSINE_MIN


@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    tokens=st.integers(1, 70),
    kv_heads=st.integers(1, 2),
    group=st.sampled_from([1, 3, 4]),
    dim=st.sampled_from([5, 16, 33]),
    block=st.sampled_from([1, 5, 16]),
    window=st.sampled_from([None, 4]),
    seed=st.integers(0, 2**16),
)
def test_prefill_property(tokens, kv_heads, group, dim, block, window, seed):
    rng = np.random.default_rng(seed)
    q, k, v, sq, sk, sv = _random_qkv(rng, tokens, kv_heads * group, kv_heads, dim, dim)
    ref = attention_prefill_float(q, k, v, AttentionScales(sq, sk, sv, 1.0), window=window)
    scales = AttentionScales(sq, sk, sv, calibrate_out_scale(ref))
    y = attention_prefill(q, k, v, scales, window=window, block_keys=block)
    assert lsb_error(y, ref, scales.out) <= LSB_MAX
    assert cosine(y * scales.out, ref) >= COSINE_MIN
