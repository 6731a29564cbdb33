"""The MoE layer mapped onto a k x k chip (compiler/moe.py), run on the chip's functional
model (golden/chip_model.py), against golden.moe bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from compiler.moe import (
    build_moe,
    check_chip_synchronisation,
    dense_masked_reference,
    moe_from_workload,
    moe_tile_config,
    run_on_chip_model,
    run_projection_on_chip_model,
)
from compiler.moe_sparse import build_sparse_moe
from golden.moe import MoEWeights, moe_layer
from golden.workloads import generate
from spec.config import ceil_div


def _golden(workload, tokens=None):
    x = workload.tensors["moe.x"][:tokens]
    return moe_layer(x, workload.moe_weights(), workload.moe_scales(),
                     workload.config.top_k)


def _tied(workload) -> MoEWeights:
    """The workload's weights with router columns copied, so logits tie across experts."""
    w = workload.moe_weights()
    router = w.router.copy()
    router[:, 3] = router[:, 1]
    router[:, 5] = router[:, 1]
    router[:, 4] = router[:, 0]
    return replace(w, router=router)


@pytest.mark.parametrize("name", ["tiny", "gpt-oss", "deepseek-r1", "kimi-k2"])
def test_dense_masked_form_is_golden(name):
    """The argument behind the mapping: every expert on every token, gates exactly 0 off
    the top-k (softmax over all E lanes after the +HUGE offset), gives golden's output."""
    wl = generate(name)
    x, w, s, k = wl.tensors["moe.x"], wl.moe_weights(), wl.moe_scales(), wl.config.top_k
    golden = moe_layer(x, w, s, k)
    out, gates = dense_masked_reference(x, w, s, k)
    np.testing.assert_array_equal(out, golden.out)
    np.testing.assert_array_equal(np.take_along_axis(gates, golden.experts, axis=1),
                                  golden.gates)
    assert (np.count_nonzero(gates, axis=1) <= k).all()
    tied = _tied(wl)
    out, gates = dense_masked_reference(x, tied, s, k)
    golden = moe_layer(x, tied, s, k)
    np.testing.assert_array_equal(out, golden.out)
    np.testing.assert_array_equal(np.take_along_axis(gates, golden.experts, axis=1),
                                  golden.gates)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_tiny_on_the_chip(tiny, k):
    program = moe_from_workload(moe_tile_config(), tiny, k=k)
    check_chip_synchronisation(program)
    out, chip = run_on_chip_model(program)
    np.testing.assert_array_equal(out, _golden(tiny).out)
    s = program.summary
    assert s["experts_per_tile"] == [sum(1 for e in range(7) if e % (k * k) == t)
                                    for t in range(k * k)]
    if k > 1:  # the tokens once (multicast), every remote expert's output back
        assert s["network_words_sent"] == sum(chip.words_sent)
        assert s["network_words_delivered"] == sum(chip.words_received)


def test_tiny_with_tied_router_logits(tiny):
    x, s, k = tiny.tensors["moe.x"][:5], tiny.moe_scales(), tiny.config.top_k
    weights = _tied(tiny)
    program = build_moe(moe_tile_config(), 2, weights, s, k, x)
    out, _ = run_on_chip_model(program)
    np.testing.assert_array_equal(out, moe_layer(x, weights, s, k).out)


def test_gpt_oss_on_2x2(gpt_oss):
    program = moe_from_workload(moe_tile_config(), gpt_oss, k=2, tokens=8)
    check_chip_synchronisation(program)
    out, chip = run_on_chip_model(program)
    np.testing.assert_array_equal(out, _golden(gpt_oss, 8).out)
    s = program.summary
    # 32 experts top-4, no shared: the dense-masked experts do 8x the sparse work.
    assert s["expert_dense_over_sparse"] == 8
    assert s["macs_executed"] == sum(p.summary.macs for p in program.tiles)
    assert s["macs_executed"] > 8 * s["macs_sparse"] > s["expert_macs_sparse"]
    assert s["experts_per_tile"] == [8, 8, 8, 8]
    assert all(n <= program.config.program_depth for n in s["instructions"])
    assert len(program.tiles[0].instructions) == s["instructions"][0]
    home = program.tiles[program.home]
    assert home.read_output(chip.tiles[0].spad).shape == (8, 128)
    assert set(home.output_words) == set(program.output_words)


def test_bad_inputs_are_refused_before_anything_runs(gpt_oss, tiny):
    cfg = moe_tile_config()
    with pytest.raises(ValueError, match="scratchpad full.*expert"):
        moe_from_workload(cfg, gpt_oss, k=1, tokens=8)  # 32 experts' weights on one tile
    with pytest.raises(ValueError, match="mesh side"):
        moe_from_workload(cfg, tiny, k=9)
    with pytest.raises(ValueError, match="accumulator memory full"):
        moe_from_workload(moe_tile_config(acc_depth=64), gpt_oss, k=2, tokens=8)
    with pytest.raises(ValueError, match="slots"):
        moe_from_workload(moe_tile_config(slots=4), tiny, k=1)
    with pytest.raises(ValueError, match="top-k list"):
        moe_from_workload(moe_tile_config(n=4), generate("deepseek-r1", moe_tokens=4), k=2)
    with pytest.raises(ValueError, match="program_depth"):
        moe_from_workload(moe_tile_config(program_depth=256), gpt_oss, k=2, tokens=8)
    with pytest.raises(ValueError, match="int8"):
        build_moe(cfg, 1, tiny.moe_weights(), tiny.moe_scales(), 2,
                  tiny.tensors["moe.x"].astype(np.int16))


def _build_streamed(config, k, *args):
    """The sparse mapping with every weight streamed from a channel per row (west edge)."""
    from compiler.moe import WeightMemory

    return build_sparse_moe(config, k, *args,
                            memory=WeightMemory(tuple((0, y) for y in range(k)), 1 << 16))


@pytest.mark.parametrize("build", [build_moe, build_sparse_moe, _build_streamed],
                         ids=["dense", "sparse", "sparse-streamed"])
@pytest.mark.parametrize("name,tokens,k", [("tiny", 8, 2), ("tiny", 3, 1), ("gpt-oss", 9, 2)])
def test_the_home_tile_projects_the_attention_output_into_the_residual(name, tokens, k, build):
    """With a Projection the chip computes the MoE input clamp(r + rq(o . W_o)) itself
    (golden.decoder) before routing (dense-masked: the home tile; sparse: every expert
    tile a slice of the channels, in programs of a round of their own, whose x on home
    is golden's): the output is bit-exact with golden's layer on that input, including
    an attention output so large that the residual add saturates. Streamed, every tile
    first loads its slice of W_o (and home the router) from memory in the projection's
    round, and the host writes no weight."""
    from compiler.moe import Projection
    from golden.decoder import project_residual
    from golden.gemm import Saturation

    wl = generate(name)
    rng = np.random.default_rng(tokens)
    channels = wl.config.heads * wl.config.v_head_dim
    o = rng.integers(-128, 128, (tokens, channels)).astype(np.int8)
    w_o = wl.tensors["attn1.w_o"]
    o[0] = np.where(w_o[:, 0] < 0, -127, 127)  # one token whose channel 0 clamps
    projection = Projection(o, w_o, wl.projection_scales(1))
    residual = wl.tensors["moe.x"][:tokens]
    program = build(moe_tile_config(), k, wl.moe_weights(), wl.moe_scales(),
                    wl.config.top_k, residual, projection)
    if build is build_moe:
        check_chip_synchronisation(program)
    saturation = Saturation()
    x = project_residual(o, projection.w_o, residual, projection.scales,
                         saturation=saturation)
    assert saturation.saturated > 0  # the case is exercised
    chip = None
    if build is not build_moe:
        assert all(not p.spad_writes for p in program.tiles)  # all before the projection
        projected, chip = run_projection_on_chip_model(program)
        np.testing.assert_array_equal(projected, x)
    got, _ = run_on_chip_model(program, chip, projected=chip is not None)
    want = moe_layer(x, wl.moe_weights(), wl.moe_scales(), wl.config.top_k)
    np.testing.assert_array_equal(got, want.out)
    if build is _build_streamed:  # W_o's words and the router's, whatever the routing
        n = moe_tile_config().n
        assert program.projection.memory_words == channels * ceil_div(
            wl.config.hidden, n) + ceil_div(wl.config.experts, n) * wl.config.hidden
        resident = build_sparse_moe(moe_tile_config(), k, wl.moe_weights(), wl.moe_scales(),
                                    wl.config.top_k, residual, projection)
        assert sum(len(p.spad_writes) for p in resident.projection.tiles) - sum(
            len(p.spad_writes) for p in program.projection.tiles) == sum(
            len(image) for image in program.memory.values())

    if build is build_moe:
        assert program.summary["projection_macs"] == tokens * channels * wl.config.hidden
    with pytest.raises(ValueError, match="w_o must be int8"):
        build(moe_tile_config(), k, wl.moe_weights(), wl.moe_scales(), wl.config.top_k,
              residual, Projection(o, projection.w_o[1:], projection.scales))
