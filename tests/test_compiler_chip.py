"""compiler.chip: a batch's attention on a chip under each placement, run on the chip
model (golden.chip_model) bit-exact with golden; bad mappings refused."""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate, pairwise
from types import SimpleNamespace

import numpy as np
import pytest

from compiler.chip import (
    PLACEMENTS,
    SEM_HANDOFF,
    HeldWords,
    agent_schedule,
    attention_rounds,
    changed,
    chunked,
    contexts,
    first_memory,
    first_programs,
    handoff_at,
    layer_rounds,
    moe_memory_words,
    moe_round,
    place_programs,
)
from golden.chip_model import ChipModel
from golden.workloads import generate, get_workload
from rtl.scratchpad import KvOp
from sim.chip_run import chip_config
from spec.config import ChipConfig
from spec.isa import DmaTarget, Opcode, decode, encode
from spec.memory import nearest_channel


def run_rounds(config: ChipConfig, rounds, resident: bool = False,
               held: HeldWords | None = None) -> int:
    """Every round on a fresh chip model holding the pages so far (and the memory image
    in its channels); returns the words the striped DMAs moved. Asserts each job's output
    equals golden. ``resident``: each tile runs its instruction memory from pc 0 as the
    rounds' images (``TileLoad.image``) leave it, not the round's program alone.
    ``held``: the host writes only the scratchpad words it lets through, and every
    word it holds back must be in the tile already."""
    cfg = config.tile
    chip = ChipModel(config.k, n=cfg.n, spad_words=cfg.spad_words, acc_depth=cfg.acc_depth,
                     slots=cfg.slots, memory_channels=len(config.memory_nodes),
                     channel_words=config.memory_words)
    # Each tile's instruction memory, as the host writes it before the first round.
    memory = first_programs(rounds) if resident else {}
    for rnd in rounds:
        for images in (rnd.memory, rnd.kv_image):
            for channel, image in images.items():
                chip.channels[channel].update(image)
        writes = held.load(rnd) if held else {t: ld.spad_writes for t, ld in rnd.loads.items()}
        for tile, load in rnd.loads.items():
            model = chip.tiles[tile]
            for address, word in load.spad_writes.items():
                assert address in writes[tile] or model.spad[address] == word, (
                    f"{rnd.phase} round: tile {tile} no longer holds word {address}")
            for address, word in writes[tile].items():
                model.spad[address] = word
        for job in rnd.jobs:
            if rnd.loads[job.tile].kv_requests:  # local: the appends fill the pages
                for address, word in job.program.kv_words.items():
                    chip.tiles[job.tile].spad[address] = word
        for load in rnd.loads.values():  # the sequencer would run past the end
            assert decode(load.instructions[-1])[0] == Opcode.HALT
        programs = {t: load.instructions for t, load in rnd.loads.items()}
        if resident:
            for t, load in rnd.loads.items():
                memory[t] = memory.get(t, {}) | load.image()
                # Between two regions, past a tile's shorter program: words never run.
                programs[t] = [memory[t].get(pc, encode(Opcode.HALT))
                               for pc in range(max(memory[t]) + 1)]
        else:  # each program alone, from its first instruction
            for t in programs:
                chip.tiles[t].resume = 0
        chip.run(programs)
        if held:
            held.ran(rnd)
        for job in rnd.jobs:
            got = job.program.read_output(chip.tiles[job.tile].spad.__getitem__)
            np.testing.assert_array_equal(got, job.expected)
        for model in chip.tiles:
            assert not any(model.semaphores), "a semaphore was left raised"
    return sum(r.network_words for r in rounds)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_tiny_batch_on_2x2_is_exact(placement):
    config = chip_config("tiny", k=2)
    rounds = attention_rounds(config, "tiny", 1, batch=3, prefill=5, context=9, steps=2,
                              placement=placement)
    # 3 sequences x 2 KV heads = 6 jobs on 4 tiles: two rounds per phase step.
    assert [r.phase for r in rounds] == ["prefill"] * 2 + ["decode"] * 4
    moved = run_rounds(config, rounds, held=HeldWords(config))
    assert (moved > 0) == (placement == "striped")


def test_kv_appends_of_a_context_the_run_starts_from_are_set_up():
    """Local placement, a 5-token prefill and two decode steps from context 9: the first
    decode step's KV appends are of tokens 5 to 9, all but its own token set-up
    (``TileLoad.kv_setup``); the prefill's and the second step's are their own."""
    config = chip_config("tiny", k=2)
    rounds = attention_rounds(config, "tiny", 1, prefill=5, context=9, steps=2)
    assert [(r.phase, r.contexts) for r in rounds] == [
        ("prefill", (5,)), ("decode", (10,)), ("decode", (11,))]
    for r, older in zip(rounds, (0, 4, 0), strict=True):
        for load in r.loads.values():
            appends = sum(q["op"] == KvOp.APPEND for q in load.kv_requests)
            tokens = {"prefill": 5, "decode": 5 if older else 1}[r.phase]
            assert appends and load.kv_setup * tokens == appends * older, (r.phase, load)


def test_far_placement_loads_every_page_from_its_channel():
    """Far: each job's program starts with a memory load of every page of its K and V
    rows from the channel of its tile's row, then one WAIT; the same pages keep their
    memory addresses from step to step, at the top of the store; KV never crosses the
    mesh between tiles; the host writes a step's KV appends into the channels."""
    config = chip_config("tiny", k=2)
    rounds = attention_rounds(config, "tiny", 1, batch=2, prefill=5, context=9, steps=2,
                              placement="far")
    assert run_rounds(config, rounds) == 0
    page = config.tile.page_words
    frames = {config.tile.page_address(p): p for p in range(config.tile.num_pages)}
    seen: dict[tuple[int, int], set] = {}
    for rnd in rounds:
        loaded = 0
        for tile, load in rnd.loads.items():
            ops = [decode(word) for word in load.instructions]
            pulls = [f for op, f in ops if op == Opcode.DMA and f["target"] == DmaTarget.LOAD.value]
            assert pulls and ops[len(pulls)] == (Opcode.WAIT, {"semaphore": 15, "count": 1})
            assert {f["channel"] for f in pulls} == {tile // 2}
            assert all(f["length"] == page for f in pulls)
            assert [config.far_page(tile, frames[f["dst"]]) for f in pulls] == [
                (tile // 2, f["mem_addr"]) for f in pulls]
            assert [f["remote_signal"] for f in pulls] == [0] * (len(pulls) - 1) + [1]
            seen.setdefault((rnd.phase, tile), set()).add(
                tuple(f["mem_addr"] for f in pulls))
            loaded += len(pulls) * page
        assert rnd.memory_words == loaded
        assert min(a for image in rnd.kv_image.values() for a in image) >= (
            config.memory_words - config.far_kv_words)
    # Decode steps at contexts 10 and 11 read the same pages at the same addresses.
    assert all(len(addresses) == 1 for (phase, _), addresses in seen.items()
               if phase == "decode")
    # The host writes the page words that changed (tb.chip_tb): the prefill's 5 tokens a
    # sequence; before the first decode step, its token and the context it starts from
    # (tokens 5-8 and 5-7 of the two sequences: setup, of tokens older than the step's
    # own); then the step's token alone.
    written: dict[int, dict[int, int]] = {}
    counts = []
    for rnd in rounds:
        new = changed(written, rnd.kv_image)
        older = sum(a in rnd.kv_image_older.get(c, ()) for c, words in new.items()
                    for a in words)
        counts.append((sum(map(len, new.values())) - older, older))
    token = counts[0][0] // 10  # a token's K and V words, every KV head
    assert token and counts == [(10 * token, 0), (2 * token, 7 * token), (2 * token, 0)]


def _hand_offs(load) -> tuple[list[dict], list[int]]:
    """A tile program's DMAs raising SEM_HANDOFF remotely and its WAITs' counts on it."""
    ops = [decode(word) for word in load.instructions]
    return ([f for op, f in ops if op == Opcode.DMA and f["remote_signal"]
             and f["remote_semaphore"] == SEM_HANDOFF],
            [f["count"] for op, f in ops if op == Opcode.WAIT and f["semaphore"] == SEM_HANDOFF])


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_attention_hands_its_outputs_to_the_moe_round(placement):
    """gpt-oss (heads of 32 channels, whole words), 2 sequences, sparse MoE: each job ends
    with a DMA of each of its tokens' outputs (its 8 heads', 32 words), from where the
    projection round reads them (``handoff_at``: row s·T + t), to every other tile, and
    waits for the other three jobs'; the host writes none of those words before the
    projection and MoE rounds. The prefill's 8 tokens a sequence (16 rows) go over as the
    decode steps' token (2 rows). Run round after round on the chip's functional model,
    every output is golden's (the projection rounds' too: their input came over the mesh),
    the host writing only the words a tile does not hold."""
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = layer_rounds(config, "gpt-oss", 1, batch=2, prefill=8, context=40, steps=2,
                          placement=placement)
    rows = {"prefill": 16, "decode": 2}
    regions = {phase: range(handoff_at(config, get_workload("gpt-oss"), n),
                            config.tile.kv_start) for phase, n in rows.items()}
    assert len(regions["decode"]) == 2 * 16 * 32 // 8  # two rows of 16 heads x 32 channels
    assert [r.phase for r in rounds] == ["prefill", "prefill-proj", "prefill-moe",
                                         *["decode", "decode-proj", "decode-moe"] * 2]
    for r in rounds:
        phase = r.phase.partition("-")[0]
        region, tokens = regions[phase], rows[phase] // 2
        if r.phase in rows:
            assert len(r.jobs) == 4
            for t, load in r.loads.items():
                sends, waits = _hand_offs(load)
                assert [(f["src"] in region, f["dst"] == f["src"], f["length"], f["tiles"])
                        for f in sends] == [(True, True, 8 * 32 // 8, sum(
                            config.mask(d) for d in range(4) if d != t))] * tokens
                assert len({f["src"] for f in sends}) == tokens
                assert waits == [3 * tokens]
        else:
            assert not any(set(load.spad_writes) & set(region) for load in r.loads.values())
    run_rounds(config, rounds, resident=True, held=HeldWords(config))


def test_a_steps_hand_off_spans_its_rounds():
    """gpt-oss, 4 sequences of 8 prompt tokens: 8 jobs, two attention rounds a step on
    the 4 tiles, whose 32 token rows make one MoE round. Both prefill rounds hand their
    jobs' outputs over (a DMA a token, a WAIT for the round's three other jobs' 24),
    the second round's programs kept clear of the rows the first left; the projection
    round reads all 32 rows, none written by the host. Run on the chip's functional model,
    every output is golden's."""
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = layer_rounds(config, "gpt-oss", 1, batch=4, prefill=8, steps=0)
    assert [r.phase for r in rounds] == ["prefill", "prefill", "prefill-proj", "prefill-moe"]
    region = range(handoff_at(config, get_workload("gpt-oss"), 32), config.tile.kv_start)
    for r in rounds[:2]:
        for load in r.loads.values():
            sends, waits = _hand_offs(load)
            assert len(sends) == 8 and all(f["src"] in region for f in sends)
            assert waits == [24]
            assert not set(load.spad_writes) & set(region)
    layer = [load for r in rounds[2:] for load in r.loads.values()]
    assert not any(set(load.spad_writes) & set(region) or load.attention_words
                   for load in layer)
    run_rounds(config, rounds, resident=True, held=HeldWords(config))


def test_a_steps_later_moe_rounds_load_their_attention_outputs():
    """gpt-oss, 2 sequences of 32 prompt tokens (``make sim``'s prefill): 64 token rows
    of 64 words, two MoE rounds of 32. Sequence 0's two jobs multicast their rows (a DMA
    a token) to every tile, where the first MoE round reads them; sequence 1's store
    theirs into the memory channels (a STORE of its heads' 32 words a token, into the
    channel nearest the tile that loads the row; the two jobs start on different
    channels, 16 tokens each), fence both channels and wait for the fences, and every
    job waits for sequence 0's rows it did not send. The second projection
    round's tiles each load a part of 8 rows from their nearest channel and multicast
    it; no host write, into a tile or a channel, holds those words. Run round after
    round on the chip's functional model, every output is golden's."""
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = layer_rounds(config, "gpt-oss", 1, batch=2, prefill=32, steps=0)
    assert [r.phase for r in rounds] == ["prefill", *["prefill-proj", "prefill-moe"] * 2]
    plan, row = rounds[0].handoff, 64
    assert (plan.first, plan.rows, plan.row, len(plan.stored)) == (32, 64, row, 32)
    assert rounds[0].stored_words == 32 * row
    starts = []  # the channel each storing job stores to first
    for job in rounds[0].jobs:
        ops = [decode(word) for word in rounds[0].loads[job.tile].instructions]
        dmas = [f for op, f in ops if op == Opcode.DMA and f["length"]
                and f["remote_semaphore"] == SEM_HANDOFF or op == Opcode.DMA
                and DmaTarget(f["target"]) is DmaTarget.STORE]
        fences = [f["channel"] for op, f in ops if op == Opcode.DMA and not f["length"]
                  and DmaTarget(f["target"]) is DmaTarget.LOAD]
        waits = [f["count"] for op, f in ops if op == Opcode.WAIT
                 and f["semaphore"] == SEM_HANDOFF]
        kinds = {DmaTarget(f["target"]) for f in dmas}
        if job.sequence == 0:
            assert (len(dmas), kinds, fences, waits) == (32, {DmaTarget.TILES}, [], [32])
        else:
            assert (len(dmas), kinds, fences, waits) == (32, {DmaTarget.STORE}, [0, 1],
                                                         [64 + 2])
            got = [(f["channel"], f["mem_addr"], f["length"]) for f in dmas]
            assert sorted(got) == sorted((c, a + job.kv_head * 32, 32) for c, a in
                                         (plan.stored[32 + t] for t in range(32)))
            assert [c for c, *_ in got] == [got[0][0]] * 16 + [1 - got[0][0]] * 16
            starts.append(got[0][0])
    assert sorted(starts) == [0, 1]
    stored = {(c, a + i) for c, a in plan.stored.values() for i in range(row)}
    assert not stored & {(c, a) for r in rounds for c, image in r.memory.items()
                         for a in image}
    region = range(handoff_at(config, get_workload("gpt-oss"), 32), config.tile.kv_start)
    for t, load in rounds[3].loads.items():
        assert not set(load.spad_writes) & set(region) and not load.attention_words
        dmas = [f for op, f in load.dispatched if op == Opcode.DMA]
        loads = [(f["channel"], f["mem_addr"], f["dst"], f["length"]) for f in dmas
                 if DmaTarget(f["target"]) is DmaTarget.LOAD and f["dst"] in region]
        assert loads == [(nearest_channel(config.memory_nodes, t % 2, t // 2),
                          plan.parts[0][t][2], region[0] + 8 * row * t, 8 * row)]
    run_rounds(config, rounds, resident=True, held=HeldWords(config))


@pytest.mark.parametrize("weights", ["streamed", "resident"])
def test_the_host_writes_only_words_the_tiles_do_not_hold(weights):
    """gpt-oss, 2 sequences, two decode steps, run round after round on the chip's
    functional model with the host writing only what ``HeldWords`` lets through: every
    word held back is still in its tile and every output is golden's. A projection
    round's loads carry the words of the MoE round after it, which carries none. The
    prefill's second projection round writes less than its loads (its constants stay),
    the second decode step's under a fifth (its token rows); with resident weights,
    which no attention round writes over, under a tenth and a hundredth. Every attention
    round writes all of its words (each step's queries, and constants the MoE rounds
    wrote over)."""
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = layer_rounds(config, "gpt-oss", 1, batch=2, prefill=32, context=40, steps=2,
                          weights=weights)
    run_rounds(config, rounds, resident=True, held=HeldWords(config))
    host, written = HeldWords(config), []
    for r in rounds:
        written.append((r.phase, sum(map(len, host.load(r).values())),
                        sum(len(load.spad_writes) for load in r.loads.values())))
        host.ran(r)
    phases = [phase for phase, *_ in written]
    assert phases == ["prefill", *["prefill-proj", "prefill-moe"] * 2,
                      *["decode", "decode-proj", "decode-moe"] * 2], written
    assert written[0][1] == written[0][2] and written[1][1] == written[1][2]
    assert all(loads == 0 for phase, _, loads in written if phase.endswith("moe"))
    # The second projection round of the prefill and of the decode steps: new tokens only.
    share = {"streamed": (1, 1 / 5), "resident": (1 / 10, 1 / 100)}[weights]
    for i, most in zip((3, 9), share, strict=True):
        assert 0 < written[i][1] < written[i][2] * most, written
    assert all(wrote == loads for phase, wrote, loads in written if phase == "decode")


def test_no_hand_off_where_the_moe_round_cannot_take_it():
    """The host writes the attention outputs instead when a head's outputs are not whole
    words (tiny: 12 channels a head), when the MoE layer is dense-masked (it reads them
    by token blocks), or when a step's tokens make more than one MoE round and a
    sequence's rows would span two (a prefill of 2 x 20 tokens, 32 a round, or of 2 x 4
    tokens, 1 a round; a decode step's 2 rows still go over, the second through the
    memory channels where rounds are of 1 token), or when a prefill's
    rows of a head are 128 words apart, past a VEC's row stride (16 heads of 64
    channels); its MoE rounds' loads name the words that hold them
    (``TileLoad.attention_words``, which the report counts apart: the projection round's,
    or the dense MoE round's), those of a step that hands them over none. A dense round
    asked to read handed-off outputs is refused."""
    gpt = chip_config("gpt-oss", k=2, n=8)
    wide = get_workload("gpt-oss", v_head_dim=64)
    cases = [(chip_config("tiny", k=2), "tiny", {}, False),
             (gpt, "gpt-oss", {"moe": "dense"}, False),
             (gpt, "gpt-oss", {"moe_tokens": 1}, True),
             (gpt, "gpt-oss", {"prefill": 20}, True),
             (chip_config(wide, k=2, n=8), wide, {}, True)]
    for config, workload, options, decodes in cases:
        rounds = layer_rounds(config, workload, 1, **{"batch": 2, "prefill": 4, "context": 24,
                                                      "steps": 1, **options})
        hands = {r.phase for r in rounds for load in r.loads.values()
                 if _hand_offs(load)[0] or _hand_offs(load)[1]}
        assert hands == ({"decode"} if decodes else set()), (workload, options, hands)
        for r in rounds:
            if r.phase.endswith("-proj") or r.phase.endswith("-moe") and options.get("moe"):
                handed = r.phase.startswith("decode") and decodes
                words = [set(load.attention_words) for load in r.loads.values()]
                assert all(w <= set(load.spad_writes)
                           for w, load in zip(words, r.loads.values(), strict=True))
                assert any(words) != handed, (workload, options, r.phase)
    wl = generate(get_workload("gpt-oss"))
    x = wl.tensors["moe.x"][:2]
    o = np.zeros((2, 16 * 32), np.int8)
    with pytest.raises(ValueError, match="dense-masked MoE layer reads the attention outputs"):
        moe_round(gpt, wl, "decode", (9, 9), x, o, 0, "dense", None, None,
                  handoff_at(gpt, wl.config, 2))


def test_programs_stay_resident_where_they_are_placed():
    """A layer of tiny with two decode steps: each phase's programs (prefill, decode and
    their projection and MoE rounds) sit in a region of their own from pc 1, a tile's first program
    jumping there from pc 0 and each program's HALT naming where the tile's next one
    starts; the host writes them all once (``first_programs``), and then a round
    changes a few words of what the step before left, the first round of a phase none;
    run from the instruction memory the rounds leave behind, every output is golden's.
    A program memory too small for a region a phase puts the attention programs from
    pc 1, the projection programs after them and the MoE programs after those; too
    small for the three, every program at pc 0."""
    config = chip_config("tiny", k=2)
    rounds = layer_rounds(config, "tiny", 1, batch=2, prefill=5, context=9, steps=2)
    longest: dict[str, int] = {}
    for r in rounds:
        longest[r.phase] = max(longest.get(r.phase, 0),
                               *(len(load.instructions) for load in r.loads.values()))
    assert list(longest) == ["prefill", "prefill-proj", "prefill-moe", "decode", "decode-proj",
                             "decode-moe"]
    bases = dict(zip(longest, accumulate([1, *longest.values()]), strict=False))
    assert {(r.phase, load.base) for r in rounds for load in r.loads.values()} == \
        set(bases.items())
    run_rounds(config, rounds, resident=True)
    held = first_programs(rounds)
    assert all(len(words) <= 1 + sum(longest.values()) for words in held.values())
    written, seen, after = [], set(), {}
    for r in rounds:
        images = {t: load.image() for t, load in r.loads.items()}
        for t, load in r.loads.items():  # pc 0 jumps to a tile's first program only
            assert (0 in images[t]) == (t not in after), (r.phase, t)
            assert load.entered == (t in after)
            if t in after:  # the program before names this one's first instruction
                assert decode(after[t].instructions[-1]) == (Opcode.HALT, {"next": load.base})
            after[t] = load
        new = changed(held, images)
        if r.phase not in seen:  # its program is where the host put it
            assert not any(new.values()), r.phase
        seen.add(r.phase)
        written.append(sum(map(len, new.values())))
    last_step = sum(len(load.instructions) for r in rounds[-3:] for load in r.loads.values())
    assert 0 < sum(written[-3:]) < last_step / 10, (written, last_step)
    attention, proj, moe = (max(longest[f"prefill{kind}"], longest[f"decode{kind}"])
                            for kind in ("", "-proj", "-moe"))
    for depth, expected in ((1 + attention + proj + moe,
                             {("", 1), ("proj", 1 + attention), ("moe", 1 + attention + proj)}),
                            (attention + proj + moe, {("", 0), ("proj", 0), ("moe", 0)})):
        for r in rounds:
            for load in r.loads.values():
                load.base = 0
        place_programs(SimpleNamespace(tile=SimpleNamespace(program_depth=depth)), rounds)
        assert {(r.phase.partition("-")[2], load.base) for r in rounds
                for load in r.loads.values()} == expected


def test_the_memory_image_is_written_once_and_must_agree():
    """The host writes every round's memory image once, before the first round
    (``first_memory``): a layer's projection and MoE rounds share one image, far
    placement's KV pages are not in it; two rounds that put different words at one address
    are refused."""
    config = chip_config("tiny", k=2)
    rounds = layer_rounds(config, "tiny", 1, prefill=5, context=8, steps=2, placement="far")
    image = first_memory(rounds)
    moe = [r for r in rounds if r.phase.endswith(("proj", "moe"))]
    assert image and all(r.memory == image for r in moe)
    assert not any(r.memory for r in rounds if r not in moe)
    assert all(a not in image.get(c, {}) for r in rounds for c, pages in r.kv_image.items()
               for a in pages)
    channel, words = next(iter(image.items()))
    address = next(iter(words))
    moe[-1].memory = {channel: {**words, address: words[address] ^ 1}}
    with pytest.raises(ValueError, match=f"memory channel {channel}, word {address}: two "
                                         "rounds' images differ"):
        first_memory(rounds)


def test_a_chip_without_memory_channels_keeps_its_weights_resident():
    """1 x 1 (no network, no channels): the MoE weights resident by default; asking to
    stream them is refused with the way out."""
    config = chip_config("tiny", k=1)
    rounds = layer_rounds(config, "tiny", 1, prefill=5, context=8, steps=1)
    assert [r.phase for r in rounds][-1] == "decode-moe"
    assert not any(r.memory or r.kv_image or r.memory_words for r in rounds)
    with pytest.raises(ValueError, match="1x1 chip has none: add --weights resident"):
        layer_rounds(config, "tiny", 1, prefill=5, steps=1, weights="streamed")


def test_far_placement_needs_memory_channels_and_room():
    with pytest.raises(ValueError, match="this chip has none"):
        attention_rounds(replace(chip_config("tiny", k=2), memory_nodes=()), "tiny", 1,
                         prefill=5, placement="far")
    small = replace(chip_config("tiny", k=2), memory_words=64)
    with pytest.raises(ValueError, match="far placement: a memory channel of 64 words cannot "
                                         "keep the 2048 words of its tiles' KV pages"):
        attention_rounds(small, "tiny", 1, prefill=9, placement="far")


@pytest.mark.parametrize("k", [2, 3, 4])
def test_far_pages_fill_each_channel_from_the_top_without_overlap(k):
    """Every KV page of every tile has its own far copy in the channel nearest its tile,
    the copies of a channel packed from the top of its store down to exactly
    ``far_kv_words`` (the channel that serves the most tiles), clear of the weights
    ``chip_config`` sizes the store for."""
    config = chip_config("gpt-oss", k=k)
    page, pages = config.tile.page_words, config.tile.num_pages
    taken: dict[int, list[int]] = {}
    for tile in range(config.tiles):
        x, y = config.position(tile)
        for p in range(pages):
            channel, base = config.far_page(tile, p)
            assert channel == nearest_channel(config.memory_nodes, x, y)
            taken.setdefault(channel, []).append(base)
    for bases in taken.values():
        bases.sort()
        assert bases == list(range(bases[0], config.memory_words, page))
    assert min(min(b) for b in taken.values()) == config.memory_words - config.far_kv_words
    assert config.memory_words - config.far_kv_words >= moe_memory_words(
        get_workload("gpt-oss"), k, config.tile.n, config.memory_nodes)
    with pytest.raises(ValueError, match=f"KV page {pages} is outside a tile's {pages}"):
        config.far_page(0, pages)


@pytest.mark.parametrize("layer", [0, 1], ids=["window5", "full"])
def test_a_long_prompt_is_prefilled_in_chunks(layer):
    """A 23-token prompt in chunks of 8: a prefill, then extend steps over the cache, each
    job's outputs the golden prefill's rows of its chunk (the window of 5 tokens spans
    chunks); the chunks' outputs make the whole prompt's."""
    assert chunked([("prefill", (23, 23), False)], 8) == [("prefill", (8, 8), False),
                                                         ("extend", (16, 16), False),
                                                         ("extend", (23, 23), False)]
    assert chunked([("prefill", (8,), False)], 8) == [("prefill", (8,), False)]
    assert chunked([], 8) == []
    with pytest.raises(ValueError, match="prefill chunk must be >= 1"):
        chunked([("prefill", (8,), False)], 0)
    config = chip_config("tiny", k=2)
    pieces = attention_rounds(config, "tiny", layer, batch=2, prefill=23, steps=1,
                              prefill_chunk=8)
    assert [(r.phase, r.contexts, r.tokens) for r in pieces] == [
        ("prefill", (8, 8), 8), ("extend", (16, 16), 8), ("extend", (23, 23), 7),
        ("decode", (24, 24), 1)]
    run_rounds(config, pieces)
    whole = attention_rounds(config, "tiny", layer, batch=2, prefill=23, steps=1,
                             prefill_chunk=23)  # the same tensors: as long a run
    for job in whole[0].jobs:
        rows = [j.expected for r in pieces[:3] for j in r.jobs
                if (j.sequence, j.kv_head) == (job.sequence, job.kv_head)]
        np.testing.assert_array_equal(np.concatenate(rows), job.expected)


def test_an_agent_loops_long_steps_are_prefilled_in_chunks():
    """A step adding more than the chunk is split: the first chunk keeps the step's
    phase and eviction, the rest extend; decode steps and short steps stay."""
    hit, miss = (chunked(agent_schedule(2, 10, 9, 1, cache), 4) for cache in ("hit", "miss"))
    assert hit == [("prefill", (4,), False), ("extend", (8,), False), ("extend", (10,), False),
                   ("decode", (11,), False), ("extend", (15,), False),
                   ("extend", (19,), False), ("extend", (20,), False), ("decode", (21,), False)]
    assert miss[4:7] == [("prefill", (4,), True), ("extend", (8,), False),
                         ("extend", (12,), False)]
    short = [("prefill", (4, 4), False), ("extend", (7, 7), False)]
    assert chunked(short, 4) == short
    config = chip_config("tiny", k=2)
    for cache in ("hit", "miss"):
        rounds = attention_rounds(config, "tiny", 1, prefill_chunk=4,
                                  schedule=agent_schedule(2, 10, 9, 1, cache))
        assert [(r.phase, r.contexts) for r in rounds][:3] == [
            ("prefill", (4,)), ("extend", (8,)), ("extend", (10,))]
        run_rounds(config, rounds)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_compact_programs_under_each_placement(placement):
    """A program memory of 128 words: the decode programs loop over their key blocks,
    and striped placement's page DMAs put before them move their branch targets."""
    config = chip_config("tiny", k=2)
    small = ChipConfig(k=2, tile=replace(config.tile, program_depth=128))
    rounds = attention_rounds(small, "tiny", 1, batch=2, prefill=4, context=60, steps=1,
                              placement=placement)
    decode = rounds[-1]
    assert all(job.program.summary.notes["loops"] for job in decode.jobs)
    run_rounds(small, rounds)


def test_sliding_window_layer_with_sinks_on_3x3():
    config = chip_config("tiny", k=3)
    rounds = attention_rounds(config, "tiny", 0, batch=2, prefill=7, context=11, steps=1,
                              placement="striped")
    run_rounds(config, rounds)


def test_contexts_differ_but_never_below_the_prompt():
    assert contexts(1, 256, 32) == (256,)
    assert contexts(4, 256, 32) == (256, 228, 200, 172)
    assert contexts(3, 0, 16) == (16, 16, 16)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"placement": "scattered"}, "unknown placement"),
        ({"batch": 0}, "batch must be >= 1"),
        ({"prefill": 0, "steps": 0}, "nothing to simulate"),
        ({"batch": 40}, "use a larger mesh or a smaller batch"),
        ({"context": 70}, "a context of 71 tokens does not fit the KV cache"),
    ],
)
def test_bad_mappings_are_refused(kwargs, message):
    config = chip_config("tiny", k=2)
    args = {"prefill": 4, "context": 8, "steps": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        attention_rounds(config, "tiny", 1, **args)


def test_custom_shape_and_page_size_mismatch():
    shaped = get_workload("tiny", heads=8, kv_heads=4)
    config = chip_config(shaped, k=2)
    run_rounds(config, attention_rounds(config, shaped, 1, batch=1, prefill=4, steps=1))
    with pytest.raises(ValueError, match="pages"):
        attention_rounds(chip_config("gpt-oss", k=2), "tiny", 1, prefill=4)


def test_decoder_layer_rounds_add_the_moe_layer_per_step():
    config = chip_config("tiny", k=2)
    rounds = layer_rounds(config, "tiny", 1, batch=2, prefill=5, context=8, steps=1)
    assert [r.phase for r in rounds] == ["prefill", "prefill-proj", "prefill-moe", "decode",
                                         "decode-proj", "decode-moe"]
    assert [len(r.jobs[0].expected) for r in rounds if r.phase.endswith("moe")] == [10, 2]
    # A projection round's job: the MoE round's input on home, golden's.
    assert [len(r.jobs[0].expected) for r in rounds if r.phase.endswith("proj")] == [10, 2]
    assert all(r.macs > 0 for r in rounds)
    run_rounds(config, rounds)


def test_moe_rounds_take_moe_tokens_each():
    """A step's tokens go through the MoE layer in rounds of ``moe_tokens`` (exact on the
    chip model); rounds twice the default keep more room on every tile, so fewer KV
    pages; a size outside 1..1024 is refused."""
    config = chip_config("tiny", k=2, moe_tokens=4)
    rounds = layer_rounds(config, "tiny", 1, batch=2, prefill=5, context=8, steps=1,
                          moe_tokens=4)
    assert [r.phase for r in rounds] == ["prefill", *["prefill-proj", "prefill-moe"] * 3,
                                         "decode", "decode-proj", "decode-moe"]
    assert [len(r.jobs[0].expected) for r in rounds if r.phase.endswith("moe")] == [4, 4, 2, 2]
    run_rounds(config, rounds)
    assert chip_config("gpt-oss", k=2, moe_tokens=64).tile.num_pages == 176  # 384 at 32
    for bad in (0, 1025, 2.0, True):
        with pytest.raises(ValueError, match="MoE rounds of 1 to 1024 tokens"):
            layer_rounds(config, "tiny", 1, moe_tokens=bad)
        with pytest.raises(ValueError, match="MoE rounds of 1 to 1024 tokens"):
            chip_config("tiny", k=2, moe_tokens=bad)


def test_a_steps_moe_rounds_stream_each_expert_once():
    """gpt-oss 2 x 2, weights streamed: a prefill step of two sequences x 32 tokens runs
    two MoE rounds, and the second loads only the experts (3,104 words each) the first
    did not (a chain), and its token rows' attention outputs (64 words a row), which the
    attention round stored; so does the shorter second round of three sequences x 16
    tokens; with resident weights nothing is loaded (the host writes the rows too). A
    projection round loads the rows (and, the chain's first, the router and ``W_o``), the
    MoE round after it the experts."""
    config = chip_config("gpt-oss", k=2)

    def moe(batch, prefill, weights=None):
        rounds = layer_rounds(config, "gpt-oss", 1, batch=batch, prefill=prefill,
                              steps=0, weights=weights)
        return [(before.memory_words + r.memory_words,
                 set(np.flatnonzero(r.summaries[0]["expert_load"])))
                for before, r in pairwise(rounds) if r.phase.endswith("moe")]

    for batch, prefill in ((2, 32), (3, 16)):
        (first, chosen), (second, more) = moe(batch, prefill)
        assert second == 3104 * len(more - chosen) + 64 * (batch * prefill - 32) < first / 8
    assert [words for words, _ in moe(2, 32, "resident")] == [0, 0]


def test_the_default_kv_cache_stays_within_the_block_table():
    """tiny at N = 4: 4096 tokens of 4-token pages would need 1024 entries per row; the
    default is what 8 rows of the 2048-entry table map, and asking more is refused."""
    assert chip_config("tiny", k=2, n=4, moe="off").tile.max_pages == 2048 // 8
    with pytest.raises(ValueError, match="only up to 1024 tokens"):
        chip_config("tiny", k=2, max_context=1100)


def test_a_context_beyond_a_jobs_kv_pages_is_refused_before_anything_is_built():
    """gpt-oss on the default chip: 384 pages a tile hold K and V of 3,072 tokens of a
    KV head; one token more is refused with the pages it needs, before any tensor."""
    config = chip_config("gpt-oss", k=2)
    assert config.tile.num_pages == 384
    with pytest.raises(ValueError, match="3073 tokens needs 386 KV pages .* leave 384 to "
                                         r"each of its jobs \(1 per tile, local"):
        attention_rounds(config, "gpt-oss", 1, prefill=3072, steps=1)
    with pytest.raises(ValueError, match=r"leave 192 to each of its jobs \(1 per tile, "
                                         "striped"):
        attention_rounds(config, "gpt-oss", 1, prefill=1600, placement="striped")


def test_moe_that_does_not_fit_is_refused_before_simulation():
    with pytest.raises(ValueError, match="does not fit the tiles of a 2x2 chip"):
        chip_config("kimi-k2", k=2)
    assert chip_config("kimi-k2", k=2, moe="off").tile.spad_words == 1 << 16


@pytest.mark.parametrize("cache", ["hit", "miss"])
def test_agent_loop_keeps_or_recomputes_the_cache_exactly(cache):
    config = chip_config("tiny", k=2)
    schedule = agent_schedule(3, prompt=5, tool=3, answer=2, cache=cache)
    lengths = [lengths[0] for _, lengths, _ in schedule]
    assert lengths == [5, 6, 7, 10, 11, 12, 15, 16, 17]
    phases = [phase for phase, *_ in schedule]
    if cache == "hit":  # the tool results are prefilled over the kept cache
        assert phases == ["prefill", "decode", "decode", "extend", "decode", "decode",
                          "extend", "decode", "decode"]
        assert not any(e for *_, e in schedule)
    else:  # the tool results are prefilled again with the whole context, cache evicted
        assert phases == ["prefill", "decode", "decode", "prefill", "decode", "decode",
                          "prefill", "decode", "decode"]
        assert [e for *_, e in schedule] == [False, False, False, True, False, False, True,
                                             False, False]
    rounds = attention_rounds(config, "tiny", 1, schedule=schedule)
    resets = [r for rnd in rounds for load in rnd.loads.values() for r in load.kv_requests
              if r["op"] == KvOp.RESET]
    assert len(resets) == (0 if cache == "hit" else 2 * 2 * 2)  # 2 evictions x 2 jobs x K/V
    run_rounds(config, rounds)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_extend_steps_attend_to_the_cached_context(placement):
    """Chunked prefills over a kept cache, across page boundaries (tiny: 4-token pages),
    for a batch whose sequences hold different contexts."""
    config = chip_config("tiny", k=2)
    schedule = [("prefill", (5, 5), False), ("extend", (9, 9), False),
                ("decode", (10, 10), False), ("extend", (13, 13), False)]
    rounds = attention_rounds(config, "tiny", 1, batch=2, schedule=schedule,
                              placement=placement)
    assert [r.tokens for r in rounds] == [5, 4, 1, 3]
    appends = [sum(r["op"] == KvOp.APPEND for load in rnd.loads.values()
                   for r in load.kv_requests) for rnd in rounds]
    if placement == "local":  # only the new tokens' K and V reach the cache
        words = appends[0] // 5
        assert appends == [5 * words, 4 * words, words, 3 * words]
    run_rounds(config, rounds)
    with pytest.raises(ValueError, match="same number"):
        attention_rounds(config, "tiny", 1, batch=2, schedule=[
            ("prefill", (5, 5), False), ("extend", (9, 8), False)])
    with pytest.raises(ValueError, match="phase is one of"):
        attention_rounds(config, "tiny", 1, schedule=[("refill", (5,), False)])


def test_agent_schedule_refuses_nonsense():
    with pytest.raises(ValueError, match="'hit' or 'miss'"):
        agent_schedule(2, 4, 2, 2, "maybe")
    with pytest.raises(ValueError, match=">= 1"):
        agent_schedule(0, 4, 2, 2, "hit")
