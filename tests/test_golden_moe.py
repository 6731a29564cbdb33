"""MoE golden: accuracy against float64, top-k rules, gates, loads, properties."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from golden.attention import cosine
from golden.moe import (
    MoEWeights,
    calibrate_moe_scales,
    moe_layer,
    moe_layer_float,
    silu_table,
    topk,
)
from golden.workloads import generate, quantize


@pytest.mark.parametrize("workload", ["tiny", "gpt-oss", "deepseek-r1", "kimi-k2"])
def test_moe_accuracy_vs_float(workload):
    wl = generate(workload, prefill_tokens=4, decode_context_lens=(1,), moe_tokens=48)
    w, s, k = wl.moe_weights(), wl.moe_scales(), wl.config.top_k
    x = wl.tensors["moe.x"]
    r, f = moe_layer(x, w, s, k), moe_layer_float(x, w, s, k)
    assert cosine(r.out * s.out, f.out) >= 0.99
    np.testing.assert_array_equal(r.experts, f.experts)  # same dequantised inputs
    assert np.abs(r.gates / 2**15 - f.gates).max() < 2e-3
    assert r.load.sum() == x.shape[0] * k
    np.testing.assert_array_equal(r.load, np.bincount(r.experts.ravel(), minlength=w.experts))
    assert np.abs(r.gates.sum(axis=1) / 2**15 - 1).max() < 2e-3


def test_topk_ties_go_to_lower_index():
    logits = np.array([[5, 7, 7, 1, 7], [0, 0, 0, 0, 0]], np.int32)
    assert topk(logits, 2).tolist() == [[1, 2], [0, 1]]
    assert topk(logits.astype(float), 3).tolist() == [[1, 2, 4], [0, 1, 2]]
    assert topk(np.array([[np.iinfo(np.int32).min, 0]], np.int32), 1).tolist() == [[1]]


def test_topk_matches_unquantised_float_except_near_ties():
    """Against routing on the original float activations, only near-ties may differ."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((400, 64))
    router = rng.standard_normal((64, 16)) / 8
    (xq, sx), (rq, sr) = quantize(x), quantize(router)
    exact = x @ router
    err = np.abs(xq @ rq.astype(np.int64) * sx * sr - exact).max()  # one quantisation step
    k = 4
    a, b = topk(xq.astype(np.int64) @ rq, k), topk(exact, k)
    kth = np.sort(exact, axis=1)[:, -k]
    for t in np.nonzero((np.sort(a, 1) != np.sort(b, 1)).any(axis=1))[0]:
        differ = np.setxor1d(a[t], b[t])
        assert np.all(np.abs(exact[t, differ] - kth[t]) <= 2 * err)


def test_silu_table():
    t = silu_table(0.05, 6.35 / 127)
    assert t.shape == (256,) and t.dtype == np.int8
    assert t[128] == 0 and t[255] == 127
    assert np.all(np.diff(t[128:].astype(int)) >= 0)
    assert t.min() < 0  # SiLU dips below zero


def _random_moe(rng, tokens, hidden, experts, ffn, shared, top_k):
    x = rng.standard_normal((tokens, hidden))
    x[:, 0] *= 6
    xq, sx = quantize(x)
    rq, sr = quantize(rng.standard_normal((hidden, experts)) / np.sqrt(hidden) * 4)
    ws, scales = {}, {}
    for name, shape, fan in (("w_gate", (hidden, ffn), hidden), ("w_up", (hidden, ffn), hidden),
                             ("w_down", (ffn, hidden), ffn)):
        w = rng.standard_normal((experts + shared, *shape)) / np.sqrt(fan)
        s = np.abs(w).reshape(experts + shared, -1).max(axis=1) / 127
        ws[name] = np.clip(np.rint(w / s[:, None, None]), -128, 127).astype(np.int8)
        scales[name] = s
    weights = MoEWeights(rq, ws["w_gate"], ws["w_up"], ws["w_down"], shared)
    return xq, weights, calibrate_moe_scales(xq, weights, sx, sr, scales, top_k)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(
    tokens=st.integers(1, 20),
    hidden=st.sampled_from([8, 24, 65]),
    experts=st.integers(1, 12),
    ffn=st.sampled_from([4, 12, 33]),
    shared=st.integers(0, 1),
    data=st.data(),
)
def test_moe_property(tokens, hidden, experts, ffn, shared, data):
    top_k = data.draw(st.integers(1, experts))
    seed = data.draw(st.integers(0, 2**16))
    x, w, s = _random_moe(np.random.default_rng(seed), tokens, hidden, experts, ffn, shared,
                          top_k)
    r, f = moe_layer(x, w, s, top_k), moe_layer_float(x, w, s, top_k)
    assert r.out.shape == x.shape and r.out.dtype == np.int8
    np.testing.assert_array_equal(r.experts, f.experts)
    assert r.load.sum() == tokens * top_k
    assert cosine(r.out * s.out, f.out) >= 0.99
