"""The MoE layer dispatched sparsely (compiler/moe_sparse.py), run on the chip's
functional model (golden/chip_model.py), against golden.moe bit for bit: on the
workloads and on adversarial routings (every token to the same experts, perfectly
balanced, tied logits), with the weights resident or streamed from the memory channels;
with the attention projection in tests/test_moe_compiler.py."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from compiler.moe import (
    WeightMemory,
    build_moe,
    executed_macs,
    moe_tile_config,
    run_on_chip_model,
)
from compiler.moe_sparse import StepRound, build_sparse_moe
from golden.moe import MoEWeights, moe_layer
from golden.workloads import generate
from spec.isa import DmaTarget


def _run(workload, k, x, weights=None):
    """(chip output, golden output, program, chip) of the sparse layer on ``x``."""
    weights = weights or workload.moe_weights()
    scales, top_k = workload.moe_scales(), workload.config.top_k
    program = build_sparse_moe(moe_tile_config(), k, weights, scales, top_k, x)
    out, chip = run_on_chip_model(program)
    return out, moe_layer(x, weights, scales, top_k).out, program, chip


@pytest.mark.parametrize("k", [1, 2, 3])
def test_tiny_on_the_chip(tiny, k):
    x = tiny.tensors["moe.x"]
    out, want, program, _ = _run(tiny, k, x)
    np.testing.assert_array_equal(out, want)
    assert program.summary["experts_per_tile"] == [
        sum(1 for e in range(7) if e % (k * k) == t) for t in range(k * k)]


@pytest.mark.parametrize("tokens", [1, 2, 13])
def test_gpt_oss_on_2x2_does_the_sparse_work(gpt_oss, tokens):
    """Bit-exact, and the experts compute only their tokens: every GEMM dispatched,
    tables, gating and combine included, within 20 % of the router and the top-4
    experts' MACs (the dense-masked mapping executes 8x)."""
    out, want, program, chip = _run(gpt_oss, 2, gpt_oss.tensors["moe.x"][:tokens])
    np.testing.assert_array_equal(out, want)
    sparse = program.summary["macs_sparse"]
    assert sparse == tokens * 128 * 32 + 4 * tokens * 3 * 128 * 64
    assert sparse < executed_macs(chip) < 1.2 * sparse


def test_gpt_oss_with_64_tokens_and_256_pairs():
    """The most token-expert pairs a round takes (64 x top-4 = 256): the index tables
    then share one accumulator buffer (two do not fit 256 entries), still bit-exact."""
    wl = generate("gpt-oss", moe_tokens=64)
    out, want, _, _ = _run(wl, 2, wl.tensors["moe.x"])
    np.testing.assert_array_equal(out, want)


def _routed(workload, chosen: list[list[int]]) -> tuple[np.ndarray, MoEWeights]:
    """Tokens and a router that make token t choose experts ``chosen[t]`` (equal
    logits among them, so the lower expert goes first) and no other: token t is 100 in
    channel t, and the router's row t is 100 for its experts, 0 elsewhere."""
    w = workload.moe_weights()
    tokens, hidden = len(chosen), w.router.shape[0]
    x = np.zeros((tokens, hidden), np.int8)
    router = np.zeros_like(w.router)
    for t, experts in enumerate(chosen):
        x[t, t] = 100
        router[t, experts] = 100
    return x, replace(w, router=router)


@pytest.mark.parametrize("routing", ["all to the same experts", "balanced", "ties"])
def test_adversarial_routings(gpt_oss, routing):
    """Every token to experts 0..3 (one tile gets all the work, three get none),
    perfectly balanced (each expert once), and four-way ties broken by the lower
    expert."""
    tokens, k = 8, gpt_oss.config.top_k
    chosen = {"all to the same experts": [[0, 1, 2, 3]] * tokens,
              "balanced": [[(t * k + j) % 32 for j in range(k)] for t in range(tokens)],
              "ties": [[5, 9, 17, 30, 31][:k + (t % 2)] for t in range(tokens)]}[routing]
    x, weights = _routed(gpt_oss, chosen)
    out, want, _, chip = _run(gpt_oss, 2, x, weights)
    np.testing.assert_array_equal(out, want)
    if routing == "all to the same experts":  # experts 0..3 are on tiles 0..3, in turn
        counts = [sum(1 for op, _ in tile.issued if op == "GEMM") for tile in chip.tiles]
        assert min(counts) > 0  # every tile runs one of the four


def test_experts_without_rows_send_nothing(gpt_oss):
    """Every token to experts 0..3: each tile's other seven experts have no rows, so
    they run nothing, and their result scatters (which would walk empty tables) are
    skipped: the only IDMA scatters a tile executes are its one expert's, one per
    combining tile."""
    x, weights = _routed(gpt_oss, [[0, 1, 2, 3]] * 8)
    out, want, _, chip = _run(gpt_oss, 2, x, weights)
    np.testing.assert_array_equal(out, want)
    for tile in chip.tiles:
        scatters = [f for op, f in tile.executed if op == "IDMA" and f.get("scatter")]
        assert len(scatters) == 4, len(scatters)
        assert len({f["table"] for f in scatters}) == 1  # one expert's result table


def test_tiny_with_tied_router_logits(tiny):
    x = tiny.tensors["moe.x"][:5]
    w = tiny.moe_weights()
    router = w.router.copy()
    router[:, 3] = router[:, 1]
    router[:, 5] = router[:, 1]
    router[:, 4] = router[:, 0]
    out, want, _, _ = _run(tiny, 2, x, replace(w, router=router))
    np.testing.assert_array_equal(out, want)


def test_sparse_and_dense_agree_on_deepseek_r1_with_a_shared_expert():
    wl = generate("deepseek-r1", moe_tokens=8)
    x = wl.tensors["moe.x"]
    out, want, _, _ = _run(wl, 3, x)
    np.testing.assert_array_equal(out, want)
    dense, _ = run_on_chip_model(build_moe(moe_tile_config(), 3, wl.moe_weights(),
                                           wl.moe_scales(), wl.config.top_k, x))
    np.testing.assert_array_equal(out, dense)


def test_bad_inputs_are_refused_before_anything_runs(gpt_oss, tiny):
    w, s = gpt_oss.moe_weights(), gpt_oss.moe_scales()
    x = gpt_oss.tensors["moe.x"]
    with pytest.raises(ValueError, match="256 token-expert pairs"):
        build_sparse_moe(moe_tile_config(), 2, w, s, 4, np.concatenate([x, x, x]))
    with pytest.raises(ValueError, match="32 routed experts on one tile"):
        build_sparse_moe(moe_tile_config(), 1, w, s, 4, x[:2])
    with pytest.raises(ValueError, match="mesh side"):
        build_sparse_moe(moe_tile_config(), 9, w, s, 4, x[:2])
    with pytest.raises(ValueError, match="program_depth"):
        build_sparse_moe(moe_tile_config(program_depth=256), 2, w, s, 4, x[:8])
    with pytest.raises(ValueError, match="int8"):
        build_sparse_moe(moe_tile_config(), 1, tiny.moe_weights(), tiny.moe_scales(), 2,
                         tiny.tensors["moe.x"].astype(np.int16))


# --- streamed weights (--weights streamed): the experts' weights from the memory channels

WEST = WeightMemory(((0, 0), (0, 1)), 1 << 16)  # the default 2 x 2 chip's channels


def _streamed(workload, x, weights=None, memory=WEST):
    """(chip output, golden output, program, chip) with the weights in ``memory``."""
    weights = weights or workload.moe_weights()
    scales, top_k = workload.moe_scales(), workload.config.top_k
    program = build_sparse_moe(moe_tile_config(), 2, weights, scales, top_k, x, None, memory)
    out, chip = run_on_chip_model(program)
    return out, moe_layer(x, weights, scales, top_k), program, chip


def _loaded(chip) -> list[list[tuple[int, int, int]]]:
    """Per tile, the memory loads it issued: (channel, memory address, words)."""
    return [[(f["channel"], f["mem_addr"], f["length"]) for op, f in tile.issued
             if op == "DMA" and f["target"] == DmaTarget.LOAD] for tile in chip.tiles]


@pytest.mark.parametrize("tokens", [1, 13])
def test_streamed_weights_load_only_the_chosen_experts(gpt_oss, tokens):
    """Bit-exact; the host writes no weight into a scratchpad; each tile loads, from the
    channel of its row only, the weights and tables of exactly the experts its tokens
    chose (3,072 + 32 words each at N = 8), home the router too (32 lanes x 128 rows:
    512 words), as the summary says."""
    x = gpt_oss.tensors["moe.x"][:tokens]
    out, golden, program, chip = _streamed(gpt_oss, x)
    np.testing.assert_array_equal(out, golden.out)
    resident = build_sparse_moe(moe_tile_config(), 2, gpt_oss.moe_weights(),
                                gpt_oss.moe_scales(), 4, x)
    router = [512, 0, 0, 0]
    for t, (mine, theirs) in enumerate(zip(program.tiles, resident.tiles, strict=True)):
        assert len(set(theirs.spad_writes) - set(mine.spad_writes)) == 8 * 3104 + router[t]
        assert mine.spad_writes.items() <= theirs.spad_writes.items()
    loads = _loaded(chip)
    chosen = [e for e in range(32) if golden.load[e]]
    per_tile = [sum(words for *_, words in tile) for tile in loads]
    assert per_tile == [3104 * sum(1 for e in chosen if e % 4 == t) + router[t]
                        for t in range(4)]
    assert sum(per_tile) == program.summary["memory_words"]
    assert all(channel == t // 2 for t, tile in enumerate(loads) for channel, *_ in tile)
    assert {c: len(image) for c, image in program.memory.items()} == {0: 16 * 3104 + 512,
                                                                      1: 16 * 3104}


def test_streamed_weights_with_every_token_on_one_tile(gpt_oss):
    """Every token to experts 0, 4, 8, 12 (all on tile 0): tile 0 loads four experts
    (and the router), the others none, and the layer is still bit-exact."""
    x, weights = _routed(gpt_oss, [[0, 4, 8, 12]] * 8)
    out, golden, _, chip = _streamed(gpt_oss, x, weights)
    np.testing.assert_array_equal(out, golden.out)
    assert [len({addr for _, addr, _ in tile}) for tile in _loaded(chip)] == [5, 0, 0, 0]


def test_streamed_weights_on_tiny_with_a_shared_expert(tiny):
    """The shared expert (every token) loads its weights unconditionally."""
    out, golden, program, chip = _streamed(tiny, tiny.tensors["moe.x"])
    np.testing.assert_array_equal(out, golden.out)
    assert sum(w for tile in _loaded(chip) for *_, w in tile) == program.summary["memory_words"]


def test_a_chain_of_rounds_loads_each_expert_once(gpt_oss):
    """Three rounds of one step on one chip, each finding the words the one before
    left: the first loads the router and its experts (0, 4, 8, 12: tile 0), the second
    only 1, 2 and 3 of its 0..3, the third only 5 of 1, 2, 3, 5 (flags written and read
    at run time); each bit-exact, each loading what its summary says."""
    rounds = [[0, 4, 8, 12], [0, 1, 2, 3], [1, 2, 3, 5]]
    chosen = [experts for experts in rounds for _ in range(8)]
    x, weights = _routed(gpt_oss, chosen)
    scales, loaded, chip, seen = gpt_oss.moe_scales(), [], None, frozenset()
    for index, experts in enumerate(rounds):
        part = x[8 * index:8 * index + 8]
        step = StepRound(index, index == len(rounds) - 1, seen)
        program = build_sparse_moe(moe_tile_config(), 2, weights, scales, 4, part, None,
                                   WEST, step)
        before = [len(tile.issued) for tile in chip.tiles] if chip else [0] * 4
        out, chip = run_on_chip_model(program, chip)
        np.testing.assert_array_equal(out, moe_layer(part, weights, scales, 4).out)
        words = sum(f["length"] for tile, first in zip(chip.tiles, before, strict=True)
                    for op, f in tile.issued[first:]
                    if op == "DMA" and f["target"] == DmaTarget.LOAD)
        assert words == program.summary["memory_words"]
        loaded.append(words)
        seen |= set(experts)
    assert loaded == [4 * 3104 + 512, 3 * 3104, 3104]


def test_a_chain_round_needs_streamed_weights(gpt_oss):
    x = gpt_oss.tensors["moe.x"][:4]
    w, s = gpt_oss.moe_weights(), gpt_oss.moe_scales()
    with pytest.raises(ValueError, match="shares streamed weights"):
        build_sparse_moe(moe_tile_config(), 2, w, s, 4, x, None, None, StepRound(1, True))
    with pytest.raises(ValueError, match="with experts loaded before it"):
        build_sparse_moe(moe_tile_config(), 2, w, s, 4, x, None, WEST,
                         StepRound(0, False, frozenset({1})))


def test_streamed_weights_that_do_not_fit_are_refused(gpt_oss):
    x = gpt_oss.tensors["moe.x"][:4]
    with pytest.raises(ValueError, match="channel 0 needs 50176 words, its store holds 16384"):
        _streamed(gpt_oss, x, memory=WeightMemory(((0, 0), (0, 1)), 1 << 14))
    with pytest.raises(ValueError, match="need memory channels"):
        _streamed(gpt_oss, x, memory=WeightMemory((), 1 << 16))


def test_each_tile_loads_from_its_nearest_channel():
    memory = WeightMemory(((0, 0), (0, 1), (0, 2), (0, 3)), 1)
    assert [memory.nearest(x, y) for y in range(4) for x in range(4)] == [
        y for y in range(4) for _ in range(4)]
    assert WeightMemory(((3, 0), (0, 3)), 1).nearest(0, 0) == 0  # a tie: the lower index
