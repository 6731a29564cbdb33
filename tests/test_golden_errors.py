"""Bad input gets a ValueError that names the problem."""

import numpy as np
import pytest

from golden.attention import AttentionScales, attention_decode, attention_prefill
from golden.kv_cache import PagedKVCache, build_cache
from golden.moe import MoEWeights, moe_layer, topk
from golden.workloads import WorkloadConfig, generate, get_workload

S = AttentionScales(0.02, 0.02, 0.02, 0.02)


def _qkv(t=6, h=4, kvh=2, d=8):
    rng = np.random.default_rng(0)
    i8 = lambda *s: rng.integers(-128, 128, s).astype(np.int8)  # noqa: E731
    return i8(t, h, d), i8(t, kvh, d), i8(t, kvh, d)


def test_prefill_mismatched_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="token count"):
        attention_prefill(q, k[:5], v, S)
    with pytest.raises(ValueError, match="head_dim"):
        attention_prefill(q[..., :7], k, v, S)
    with pytest.raises(ValueError, match="not a multiple of 3 KV heads"):
        attention_prefill(q, np.concatenate([k, k[:, :1]], 1), np.concatenate([v, v[:, :1]], 1), S)
    with pytest.raises(ValueError, match="int8"):
        attention_prefill(q.astype(np.int32), k, v, S)
    with pytest.raises(ValueError, match="one logit per query head"):
        attention_prefill(q, k, v, S, sinks=np.zeros(3))
    with pytest.raises(ValueError, match="window"):
        attention_prefill(q, k, v, S, window=0)
    with pytest.raises(ValueError, match="scale q"):
        AttentionScales(0.0, 1, 1, 1)


def _cache():
    q, k, v = _qkv(t=10)
    cache, table = build_cache([k[:10], k[:3]], [v[:10], v[:3]], 4)
    return q[:2], cache, table


def test_decode_context_longer_than_capacity():
    q, cache, table = _cache()
    with pytest.raises(ValueError, match="exceeds the KV capacity of 12 tokens"):
        attention_decode(q, cache, table, np.array([13, 3]), S)
    with pytest.raises(ValueError, match="at least 1"):
        attention_decode(q, cache, table, np.array([0, 3]), S)


def test_decode_page_table_outside_cache():
    q, cache, table = _cache()
    bad = table.copy()
    bad[0, 1] = cache.num_pages
    with pytest.raises(ValueError, match=r"entry 1 -> physical page 4 is outside the cache of 4"):
        attention_decode(q, cache, bad, np.array([10, 3]), S)
    bad[0, 1] = -1
    with pytest.raises(ValueError, match="outside the cache"):
        attention_decode(q, cache, bad, np.array([10, 3]), S)


def test_decode_mismatched_shapes():
    q, cache, table = _cache()
    with pytest.raises(ValueError, match="sequences but the block table has"):
        attention_decode(q[:1], cache, table, np.array([10, 3]), S)
    with pytest.raises(ValueError, match="one length per block-table row"):
        attention_decode(q, cache, table, np.array([10]), S)
    with pytest.raises(ValueError, match="differ in pages"):
        PagedKVCache(cache.k_pages, cache.v_pages[:2])


def test_moe_bad_inputs():
    wl = generate("tiny")
    w, s, x = wl.moe_weights(), wl.moe_scales(), wl.tensors["moe.x"]
    with pytest.raises(ValueError, match="top_k 7 must be between 1 and the 6 experts"):
        moe_layer(x, w, s, 7)
    with pytest.raises(ValueError, match="top_k 0"):
        topk(np.zeros((1, 3)), 0)
    with pytest.raises(ValueError, match="hidden size 31 differs"):
        moe_layer(x[:, :31], w, s, 2)
    with pytest.raises(ValueError, match="w_down must be"):
        MoEWeights(w.router, w.w_gate, w.w_up, w.w_down[:, :3], 1)


def test_unknown_workload_lists_known():
    with pytest.raises(ValueError, match="unknown workload 'llama'.*tiny, gpt-oss, deepseek-r1"):
        get_workload("llama")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kv_heads": 0}, "kv_heads must be an integer >= 1, not 0"),
        ({"heads": 6.0}, "heads must be an integer >= 1, not 6.0"),
        ({"head_dim": -4}, "head_dim must be an integer >= 1"),
        ({"shared_experts": -1}, "shared_experts must be an integer >= 0"),
        ({"windows": ()}, "windows must list one attention layer or more"),
        ({"windows": (0, None)}, "each a window >= 1 token or None"),
        ({"decode_context_lens": ()}, "lists no context"),
        ({"heads": 5}, "5 heads not a multiple of 2"),
        ({"top_k": 7}, "top_k 7 outside 1..6"),
    ],
)
def test_impossible_workload_shapes_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_workload("tiny", **overrides)


def test_a_workload_config_missing_fields_is_refused():
    fields = get_workload("tiny").to_json()
    del fields["windows"], fields["ffn"]
    with pytest.raises(ValueError, match="a workload config lacks ffn, windows"):
        WorkloadConfig.from_json(fields)
    assert WorkloadConfig.from_json(get_workload("tiny").to_json()) == get_workload("tiny")
