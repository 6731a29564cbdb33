"""The chip (rtl/chip.py): tiles on a mesh behind one host port, on Verilator.

DMAs between tiles over the network; a decoder layer (attention for a batch, then the
MoE layer) under each KV placement, every output bit-exact with golden; bad designs and
mappings refused before simulation."""

from __future__ import annotations

import shutil

import pytest

from compiler.chip import first_programs, handoff_at, layer_rounds
from golden.io import compare, load_expected, load_workload
from golden.workloads import get_workload
from rtl.chip import Chip
from sim.chip_run import chip_config, simulate_chip, simulate_layer
from sim.faults import FaultPlan
from spec.config import ChipConfig
from spec.isa import DmaTarget

#: The tiny workload's chip: one build serves every test here.
TINY = chip_config("tiny", k=2)


def test_dma_between_tiles_unicast_and_multicast():
    result = simulate_chip(TINY, "chip_network", {})
    assert result["passed"]
    sent = [c["sent"] for c in result["net"]]
    assert sent[0] == 5 + 1 and sent[3] == 5, sent  # flits: 5 + a multicast; 5 back
    # Link traversals: 5 flits over 2 hops each way, the multicast's tree of 3 links.
    links = [c["links"] for c in result["net"]]
    assert sum(links) == 5 * 2 + 3 + 5 * 2, links


def test_tiles_store_and_load_words_through_the_memory_channels():
    result = simulate_chip(TINY, "chip_memory", {})
    assert result["passed"]


@pytest.mark.nightly
def test_a_threaded_build_runs_the_layer_exactly():
    """``--threads 2``: the chip evaluated on two Verilator threads (its own build)."""
    result = simulate_layer(TINY, "tiny", 1, batch=2, prefill=5, context=9, steps=1,
                            moe="off", threads=2)
    assert [r["phase"] for r in result["rounds"]] == ["prefill", "decode"]
    with pytest.raises(ValueError, match="threads must be 1"):
        simulate_layer(TINY, "tiny", 1, prefill=5, threads=2, simulator="icarus")


@pytest.mark.skipif(shutil.which("iverilog") is None,
                    reason="Icarus Verilog, the optional second simulator, is not installed")
def test_icarus_runs_the_chip_cycle_for_cycle_like_verilator():
    """The tiny decoder layer (attention, projection and MoE, a prefill and a decode step)
    on Icarus: bit-exact with golden and the same cycles in every round as Verilator."""
    runs = {sim: simulate_layer(TINY, "tiny", 1, batch=1, prefill=3, context=8, steps=1,
                                simulator=sim)
            for sim in ("verilator", "icarus")}
    cycles = {sim: [(r["phase"], r["cycles"]) for r in run["rounds"]]
              for sim, run in runs.items()}
    assert [phase for phase, _ in cycles["icarus"]] == ["prefill", "prefill-moe", "decode",
                                                         "decode-moe"]
    assert cycles["icarus"] == cycles["verilator"]


@pytest.mark.parametrize(("placement", "moe"), [("local", "sparse"), ("striped", "dense"),
                                              ("far", "off")])
def test_decoder_layer_for_a_batch_is_exact(placement, moe, tmp_path, seed):
    # 3 sequences x 2 KV heads = 6 jobs on 4 tiles: two attention rounds per step. The
    # MoE layer sparse, dense-masked or off on the same build; every tile's MAC counter
    # checked against what its programs dispatch, and the memory channels' words read
    # against what they load (far pages, streamed weights; tb.chip_tb).
    result = simulate_layer(TINY, "tiny", 1, batch=3, prefill=5, context=9, steps=1,
                            placement=placement, moe=moe, dump=tmp_path, seed=seed + 1)
    phases = [r["phase"] for r in result["rounds"]]
    has_moe = moe != "off"
    split = moe == "sparse"  # the projection in a round of its own
    expected = ["prefill", "prefill"] + ["prefill-proj"] * split + ["prefill-moe"] * has_moe \
        + ["decode", "decode"] + ["decode-proj"] * split + ["decode-moe"] * has_moe
    assert phases == expected
    attention = [r for r in result["rounds"] if r["phase"] in ("prefill", "decode")]
    kv_words = sum(r["network_words"] for r in attention)
    flits = sum(r["flits"] for r in result["rounds"])
    assert (kv_words > 0) == (placement == "striped")
    assert flits >= kv_words
    far_words = [sum(r["channel_reads"]) for r in attention]
    assert all(words > 0 for words in far_words) == (placement == "far")
    # The host appends the KV of the prefill's 3 x 5 tokens, then of each sequence's
    # decoded token and, before it, of the context the step starts from: through the
    # tiles' KV ports (local) or into the memory channels (far; striped writes pages).
    host = {phase: [sum(r["host_words"][kind] for r in result["rounds"] if r["phase"] == phase)
                    for kind in ("kv", "kv_setup")] for phase in ("prefill", "decode")}
    if placement != "striped":
        token = host["prefill"][0] // 15
        assert token > 0 and host["prefill"] == [15 * token, 0]
        assert host["decode"][0] - host["decode"][1] == 3 * token and host["decode"][1] > 0
    # The experts' weights streamed by the sparse mapping, resident with the dense one.
    assert all((sum(r["channel_reads"]) > 0) == (moe == "sparse") for r in result["rounds"]
               if r["phase"].endswith("moe"))
    assert all(r["cycles"] > 0 for r in result["rounds"])
    # The dump: a golden workload directory per sequence (and per MoE round) whose RTL
    # outputs compare equal to its golden ones, output by output.
    groups = sorted(d.name for d in tmp_path.iterdir())
    layer = {"sparse": ["moe-r03", "moe-r07", "proj-r02", "proj-r06"],
             "dense": ["moe-r02", "moe-r05"], "off": []}[moe]
    assert groups == layer + ["seq0", "seq1", "seq2"]
    moe_rounds = [r for r in result["rounds"] if r["phase"].endswith("moe")]
    assert all(r["dispatch"] == moe for r in moe_rounds)
    if moe == "sparse":  # less work than every expert over every token, on each round
        dense = [r.macs for r in layer_rounds(TINY, "tiny", 1, batch=3, prefill=5, context=9,
                                              steps=1, placement=placement, moe="dense",
                                              seed=seed + 1) if r.phase.endswith("moe")]
        assert all(r["macs"] < d for r, d in zip(moe_rounds, dense, strict=True))
        assert all(r["executed_over_sparse"] > 1 for r in moe_rounds)
    for group in groups:
        workload = load_workload(tmp_path / group)
        assert workload.config.name == "tiny"
        expected = load_expected(tmp_path / group)
        assert len(expected) == (4 if group.startswith("seq") else 1)  # 2 steps x 2 heads
        assert set(compare(expected, tmp_path / group / "rtl").values()) == {0}


def test_programs_and_held_words_stay_between_rounds_on_the_chip(seed):
    """Three decode steps of tiny: the rounds run from where compiler.chip.place_programs
    puts their programs (a tile's first through a SKIP at pc 0, each later one from the
    pc the HALT before it names), every output bit-exact; the host writes every phase's
    programs once, before the first round, and then per round the words that changed:
    none in the first round of a phase, the last step's two rounds under a tenth of
    their programs' words. Of the scratchpad words,
    the host writes those the tiles do not hold (``compiler.chip.HeldWords``): every
    word of the first round, fewer than its loads in the last MoE round; among them the
    attention outputs of every MoE round (tiny's heads of 12 channels are not handed
    over), and no other round's."""
    rounds = layer_rounds(TINY, "tiny", 1, prefill=5, steps=3, seed=seed)
    result = simulate_layer(TINY, "tiny", 1, prefill=5, steps=3, rounds=rounds, seed=seed)
    once = first_programs(rounds)
    assert result["programs_once"]["words"] == sum(map(len, once.values()))
    assert result["programs_once"]["host_cycles"] > 0
    written = [r["host_words"]["program"] for r in result["rounds"]]
    programs = [sum(len(load.instructions) for load in r.loads.values()) for r in rounds]
    first = {}
    for i, r in enumerate(rounds):
        first.setdefault(r.phase, i)
    assert sorted(first) == ["decode", "decode-moe", "decode-proj", "prefill", "prefill-moe",
                             "prefill-proj"]
    assert written[0] == 0
    assert all(written[i] == 0 for i in first.values()), written
    assert 0 < sum(written[-3:]) < sum(programs[-3:]) / 10, (written, programs)
    spad = [r["host_words"]["scratchpad"] for r in result["rounds"]]
    loads = [sum(len(load.spad_writes) for load in r.loads.values()) for r in rounds]
    # The last projection round carries its MoE round's words, which carries none.
    assert spad[0] == loads[0] and 0 < spad[-2] < loads[-2] and loads[-1] == 0, (spad, loads)
    attention = [(r["host_words"]["attention"], sum(len(ld.attention_words)
                                                    for ld in rnd.loads.values()))
                 for r, rnd in zip(result["rounds"], rounds, strict=True)]
    assert all(0 < wrote <= held if rnd.phase.endswith("-proj") else wrote == held == 0
               for (wrote, held), rnd in zip(attention, rounds, strict=True)), attention


def test_attention_hands_its_outputs_over_the_mesh(seed):
    """tiny with heads of 16 channels (whole words): on the RTL a step's jobs multicast
    their outputs to every tile, where the projection round reads them and the host writes
    none of them; every output bit-exact, the projection and MoE rounds' included. Under
    local placement no KV word moves, so the attention rounds' flits are the hand-off's:
    each of the 4 jobs injects its 3 heads x 2 words once per token, 5 tokens in the prefill
    and one in a decode step, the mesh copying them to 3 tiles."""
    shaped = get_workload("tiny", v_head_dim=16)
    rounds = layer_rounds(TINY, shaped, 1, batch=2, prefill=5, context=9, steps=2, seed=seed)
    for r in rounds:
        if r.phase.endswith(("-proj", "-moe")):
            region = range(handoff_at(TINY, shaped, 2 * r.tokens), TINY.tile.kv_start)
            assert all(not set(load.spad_writes) & set(region) for load in r.loads.values())
    result = simulate_layer(TINY, shaped, 1, batch=2, prefill=5, context=9, steps=2,
                            rounds=rounds, seed=seed)
    assert result["passed"] is True
    attention = [(r["phase"], r["network_words"], r["flits"]) for r in result["rounds"]
                 if not r["phase"].endswith(("-proj", "-moe"))]
    assert attention == [("prefill", 0, 4 * 5 * 3 * 2), *[("decode", 0, 4 * 3 * 2)] * 2]


def test_later_moe_rounds_load_their_attention_outputs_from_memory(seed):
    """tiny with heads of 16 channels (a token row of 6 heads x 2 words), MoE rounds of
    4 tokens: the prefill's 2 x 4 token rows make two MoE rounds. On the RTL the
    attention jobs multicast the first round's rows (sequence 0's) to every tile and
    store the second's (sequence 1's) in the memory channels, a STORE a token, then
    fence each channel they stored to; the second projection round's tiles load those
    rows, a part each, and multicast them. The host writes none of those words, into the tiles
    or the channels; the channels count them written once and read once (their
    counters equal the compiler's, tb.chip_tb), and every output is bit-exact."""
    shaped = get_workload("tiny", v_head_dim=16)
    options = {"batch": 2, "prefill": 4, "context": 9, "steps": 1, "moe_tokens": 4,
               "seed": seed}
    rounds = layer_rounds(TINY, shaped, 1, **options)
    assert [r.phase for r in rounds] == ["prefill", *["prefill-proj", "prefill-moe"] * 2,
                                         "decode", "decode-proj", "decode-moe"]
    plan = rounds[0].handoff
    assert (plan.first, plan.rows, plan.row, len(plan.stored)) == (4, 8, 12, 4)
    assert rounds[0].stored_words == 4 * 12
    stored = {(c, a + i) for c, a in plan.stored.values() for i in range(12)}
    assert not stored & {(c, a) for r in rounds for c, image in r.memory.items()
                         for a in image}
    region = range(handoff_at(TINY, shaped, 4), TINY.tile.kv_start)
    fetched = [f for load in rounds[3].loads.values() for op, f in load.dispatched
               if op.name == "DMA" and DmaTarget(f["target"]) is DmaTarget.LOAD
               and f["dst"] in region]
    assert sorted((f["channel"], f["mem_addr"]) for f in fetched) == sorted(
        (c, a) for _, c, a, _, _ in plan.parts[0])
    assert sum(f["length"] for f in fetched) == 4 * 12
    assert not any(set(load.spad_writes) & set(region)
                   for r in rounds[1:5] for load in r.loads.values())
    result = simulate_layer(TINY, shaped, 1, rounds=rounds, **options)
    assert result["passed"] is True
    writes = [sum(r["channel_writes"]) for r in result["rounds"]]
    assert writes == [48] + [0] * 7
    assert sum(result["rounds"][3]["channel_reads"]) == rounds[3].memory_words >= 48


def test_a_steps_moe_rounds_share_the_weights_they_stream(seed):
    """Rounds of 4 tokens: the prefill's 15 tokens take a chain of four rounds (4, 4,
    4 and 3 tokens). On the RTL (the channels' counters, equal to the compiler's in
    tb.chip_tb, every output bit-exact) the first projection round reads the first
    weights (``W_o`` and the router: 320 words of tiny), the first MoE round the shared
    expert (224 words) and its routed experts (224 words each), each later one only the
    experts no round before it loaded (flags the tiles keep between rounds), the later
    projection rounds nothing."""
    first, expert = 544, 224
    result = simulate_layer(TINY, "tiny", 1, batch=3, prefill=5, context=9, steps=1,
                            moe_tokens=4, seed=seed + 1)
    rounds = [r for r in result["rounds"] if r["phase"] == "prefill-moe"]
    projections = [sum(r["channel_reads"]) for r in result["rounds"]
                   if r["phase"] == "prefill-proj"]
    assert projections == [first - expert, 0, 0, 0]
    chosen = [{e for e, n in enumerate(r["expert_load"]) if n} for r in rounds]
    assert [r["tokens"] for r in rounds] == [4, 4, 4, 3]
    expected = [first + expert * len(chosen[0]),
                *(expert * len(chosen[i] - set().union(*chosen[:i])) for i in (1, 2, 3))]
    assert [sum(r["channel_reads"]) + before
            for r, before in zip(rounds, projections, strict=True)] == expected
    assert sum(expected) == first + expert * len(set().union(*chosen))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Chip(0), "mesh side k must be an integer 1..8"),
        (lambda: Chip(9), "mesh side k must be an integer 1..8"),
        (lambda: Chip(2, tile={"position": (0, 0)}), "places its tiles itself"),
        (lambda: ChipConfig(k=2, vcs=3), "vcs must be"),
        (lambda: ChipConfig(k=2, vcs=2.0), "vcs must be"),
        (lambda: ChipConfig(k=2, depth=32), "depth must be 1..16"),
        (lambda: ChipConfig(k=2, max_packet=0), "max_packet must be 1..64"),
        # A 1 x 1 chip builds no network, but its network parameters are still checked.
        (lambda: Chip(1, vcs=3), "vcs must be even"),
        (lambda: Chip(1, depth=0), "depth must be an integer in \\[1, 16\\]"),
        (lambda: Chip(1, max_packet=-5), "max_packet must be 1..64"),
        (lambda: Chip(2, tile=5), "tile must be a dict"),
        (lambda: Chip(1, shared_tile="maybe"), "shared_tile must be True or False"),
        (lambda: chip_config("kimi-k2", k=2), "does not fit the tiles of a 2x2 chip"),
        # Two channels of at most a word (8 bytes) a cycle each.
        (lambda: ChipConfig(k=2, memory_bandwidth="17"), "at most one 8-byte word per cycle"),
        (lambda: ChipConfig(k=2, memory_bandwidth="-1"), "more than 0"),
        (lambda: ChipConfig(k=2, memory_bandwidth="1/512"), "denominator must be at most 256"),
        (lambda: ChipConfig(k=1, memory_bandwidth="1"), "no memory bandwidth to set"),
    ],
)
def test_bad_designs_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_memory_bandwidth_is_kept_as_its_exact_fraction():
    assert ChipConfig(k=2, memory_bandwidth="0.5").memory_bandwidth == "1/2"
    assert ChipConfig(k=2, memory_bandwidth="16").memory_bytes_per_cycle == 16
    assert ChipConfig(k=2).memory_bandwidth is None  # the machine balance


def test_a_one_tile_chip_has_no_network():
    """``--mesh 1x1``: one tile, its network ports tied off (no interface, no mesh)."""
    chip = Chip(1)
    assert (len(chip.tiles), chip.nis, chip.mesh) == (1, [], None)


def test_single_bit_faults_in_stored_words_are_corrected_and_outputs_stay_exact(seed):
    """``--inject-faults``: single-bit faults in the words each round reads (weights,
    queries, KV pages appended in earlier rounds) are corrected on every read; every
    output stays bit-exact and each tile's counters account for its faults. The
    experts' weights resident, so that they sit in the scratchpads too (streamed, they
    arrive fresh in each round, and the memory channels have no ECC to test)."""
    result = simulate_layer(TINY, "tiny", 1, batch=2, prefill=3, context=8, steps=1,
                            faults=FaultPlan(0.1, seed=seed + 1), weights="resident")
    faults = result["faults"]
    assert [r["phase"] for r in result["rounds"]] == ["prefill", "prefill-proj", "prefill-moe",
                                                      "decode", "decode-proj", "decode-moe"]
    assert faults["stopped"] is None and faults["double_injected"] == 0
    assert faults["single_injected"] > 300
    assert faults["single_survived"] == faults["single_injected"] == len(faults["log"])
    assert {f["round"] for f in faults["log"]} == set(range(6))
    for tile, counts in faults["tiles"].items():
        assert counts["corrected_reads"] >= counts["single"] == counts["corrected"] > 0, \
            (tile, counts)
        assert counts["uncorrectable_reads"] == counts["detected"] == 0
    # Never two faults in one word in a round: the words a round's faults sit in differ.
    places = [(f["round"], f["tile"], f["address"]) for f in faults["log"]]
    assert len(set(places)) == len(places)


def test_a_double_bit_fault_stops_the_run_with_a_named_error():
    result = simulate_layer(TINY, "tiny", 1, batch=1, prefill=3, context=8, steps=1,
                            faults=FaultPlan(0.0, 0.01, seed=4))
    faults = result["faults"]
    assert faults["stopped"].startswith("uncorrectable ECC error in round 1: ")
    assert faults["double_injected"] == faults["double_detected"] > 0
    for tile, counts in faults["tiles"].items():
        assert counts["uncorrectable_reads"] >= counts["double"] == counts["detected"], \
            (tile, counts)
    # The run ended at the round of the first double: no later round ran.
    assert len(result["rounds"]) == 1
    assert {f["round"] for f in faults["log"]} == {1}
    assert all(len(f["bits"]) == 2 for f in faults["log"])
