"""Accuracy of what the chip runs (issue: decode outputs clipped under a scale calibrated
on other queries): compiled chip runs measured against float64, one layer per run."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compiler.chip import accuracy, attention_rounds, layer_rounds
from golden.__main__ import main as golden_main
from golden.decoder import project_residual
from golden.gemm import Saturation, requantize
from golden.io import save_workload
from golden.workloads import generate, generate_batch, get_workload
from sim.chip_run import chip_config


def _shape(workload: str, head_dim: int | None, ratio: int | None) -> dict:
    cfg = get_workload(workload)
    shape = {}
    if head_dim is not None:
        shape |= {"head_dim": head_dim, "v_head_dim": min(cfg.v_head_dim, head_dim)
                  if cfg.latent_kv else head_dim}
    if ratio is not None:
        shape |= {"heads": cfg.kv_heads * ratio}
    return shape


@settings(max_examples=25, deadline=None, derandomize=True)
@given(workload=st.sampled_from(["gpt-oss", "deepseek-r1", "kimi-k2", "tiny"]),
       head_dim=st.sampled_from([None, 24, 40]), ratio=st.sampled_from([None, 1, 3, 8]),
       tensor_seed=st.integers(1, 1000), batch=st.integers(1, 3),
       prefill=st.sampled_from([0, 1, 17, 40]), context=st.integers(1, 600),
       steps=st.integers(1, 2), data=st.data())
def test_attention_outputs_hold_the_bounds_on_what_the_chip_runs(
        workload, head_dim, ratio, tensor_seed, batch, prefill, context, steps, data):
    """Every attention output a chip run computes — prefill rows, decode steps on queries
    and contexts of the run, every sequence of the batch under one calibration — is
    within cosine 0.999 and 3 LSB of float64, and none saturates."""
    cfg = get_workload(workload, **_shape(workload, head_dim, ratio))
    layer = data.draw(st.integers(0, len(cfg.windows) - 1), label="layer")
    config = chip_config(cfg, moe="off")
    context = min(context, config.tile.max_pages * config.tile.page_size - steps)
    rounds = attention_rounds(config, cfg, layer, batch=batch, prefill=prefill,
                              context=context, steps=steps, seed=tensor_seed)
    for phase, a in accuracy(rounds).items():
        assert a["saturated"] == 0, (phase, a["sites"])
        assert a["cosine"] >= 0.999, (phase, a["cosine"])
        assert a["max_lsb_error"] <= 3, (phase, a["max_lsb_error"])


@pytest.mark.parametrize("workload,batch,prefill,context,tensor_seed", [
    ("gpt-oss", 2, 17, 100, 1), ("gpt-oss", 1, 0, 45, 7), ("tiny", 3, 11, 13, 2)])
def test_moe_rounds_hold_the_bounds(workload, batch, prefill, context, tensor_seed):
    """The MoE rounds of a layer (prefill tokens and each decode step's tokens) are within
    cosine 0.99 of float64 and no intermediate result saturates."""
    cfg = get_workload(workload)
    rounds = layer_rounds(chip_config(cfg), cfg, 1, batch=batch, prefill=prefill,
                          context=context, steps=2, seed=tensor_seed)
    figures = accuracy(rounds)
    assert any(phase.endswith("moe") for phase in figures)
    for phase, a in figures.items():
        assert a["saturated"] == 0, (phase, a["sites"])
        if phase.endswith("moe"):
            assert a["cosine"] >= 0.99, (phase, a["cosine"])


def test_a_run_is_one_layer():
    """Every MoE round of a run has the same weights and scales; each step's MoE round
    takes that step's own tokens: token t of sequence s enters it as its attention output
    projected by W_o plus its residual moe.x[t] (what the projection round before it
    computes); every attention job of the batch shares the layer's scales."""
    cfg = get_workload("tiny")
    layer = 0
    rounds = layer_rounds(chip_config(cfg), cfg, layer, batch=2, prefill=5, steps=2, seed=3)
    moe = [r for r in rounds if r.phase.endswith("moe")]
    assert [r.phase for r in moe] == ["prefill-moe", "decode-moe", "decode-moe"]
    first = moe[0].jobs[0].inputs
    sequences = rounds[0].workloads
    projections = [r for r in rounds if r.phase.endswith("proj")]
    attention = [r for r in rounds if not r.phase.endswith(("moe", "proj"))]
    for r, step, before in zip(moe, attention, projections, strict=True):
        inputs = r.jobs[0].inputs
        assert inputs.scales == first.scales
        for name in ("moe.router", "moe.w_gate", "moe.w_up", "moe.w_down", "attn0.w_o"):
            np.testing.assert_array_equal(inputs.tensors[name], first.tensors[name])
        tokens = 5 if r.phase == "prefill-moe" else 1
        residual = np.concatenate([wl.tensors["moe.x"][n - tokens:n]
                                   for wl, n in zip(sequences, r.contexts, strict=True)])
        o = np.concatenate([np.concatenate([job.expected for job in sorted(
            (job for job in step.jobs if job.sequence == s), key=lambda job: job.kv_head)],
            axis=1).reshape(tokens, -1) for s in range(2)])
        want = project_residual(o, first.tensors["attn0.w_o"], residual,
                                first.projection_scales(layer))
        np.testing.assert_array_equal(inputs.tensors["moe.x"], want)
        np.testing.assert_array_equal(before.jobs[0].expected, want)
        assert not np.array_equal(want, residual)
    assert not np.array_equal(moe[1].jobs[0].inputs.tensors["moe.x"],
                              moe[2].jobs[0].inputs.tensors["moe.x"])
    attention = [job for r in attention for job in r.jobs]
    assert {job.sequence for job in attention} == {0, 1}
    assert len({job.out_scale for job in attention}) == 1
    assert sequences[0].scales == sequences[1].scales


def test_weights_do_not_depend_on_the_token_counts():
    """A layer's weights come from streams of their own: more tokens, same weights; a
    longer sequence begins with the float tokens of a shorter one."""
    short, long = generate("gpt-oss", moe_tokens=3), generate("gpt-oss", moe_tokens=40,
                                                              prefill_tokens=200)
    for name in ("moe.router", "moe.w_gate", "moe.w_up", "moe.w_down", "attn0.sinks"):
        np.testing.assert_array_equal(short.tensors[name], long.tensors[name])
    for name in ("q", "k", "v"):  # the same real tokens, each quantised at its own peak
        s_short, s_long = short.scales["attn1"][name], long.scales["attn1"][name]
        np.testing.assert_allclose(short.tensors[f"attn1.{name}_prefill"] * s_short,
                                   long.tensors[f"attn1.{name}_prefill"][:160] * s_long,
                                   atol=(s_short + s_long) / 2 * 1.001)
    batch = generate_batch("tiny", 3)
    assert all(wl.scales == batch[0].scales for wl in batch)
    assert not np.array_equal(batch[0].tensors["moe.x"], batch[1].tensors["moe.x"])
    with pytest.raises(ValueError, match="batch must be"):
        generate_batch("tiny", 0)


def test_saturation_is_counted_per_site():
    saturation = Saturation()
    acc = np.array([10, 300, -400, 5])
    out = requantize(acc, 1 << 14, 15, saturation=saturation, site="x")  # x 1/2
    assert out.tolist() == [5, 127, -128, 3]
    requantize(np.array([2, 4]), 1 << 14, 15, saturation=saturation, site="y")
    assert saturation.sites == {"x": [2, 4], "y": [0, 2]}
    assert (saturation.saturated, saturation.outputs, saturation.worst()) == (2, 6, "x")


def test_a_manifest_whose_scales_clip_is_reported(tmp_path, capsys):
    """``python -m golden expected`` names the output a manifest's scales make clip, and
    fails."""
    save_workload(generate("tiny"), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["scales"]["attn1"]["out"] /= 16
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert golden_main(["expected", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "attn1.prefill.out" in err and "saturated" in err
    assert "attn0" not in err
