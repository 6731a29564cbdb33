"""serve: traces (format, refusals with line numbers, generators), the cost model's fit,
the continuous-batching scheduler (times by hand, concurrency, capacity, KV hits and
evictions, policies), the metrics and matched comparisons, and ``serrano serve --merge``."""

import json
from dataclasses import replace

import numpy as np
import pytest

from serve.cost import (
    MOVE_CYCLES_PER_WORD,
    MOVE_LATENCY,
    CostModel,
    Job,
    Shape,
    attention_features,
    calibration_plan,
    fit,
    fit_runs,
    kept,
    round_samples,
    step_totals,
)
from serve.metrics import front, interpolate, matched, summarise
from serve.scheduler import Capacity, serve
from serve.trace import Request, TraceError, agent_trace, fixed_trace, read_trace, write_trace

SHAPE = Shape(tiles=4, kv_heads=2, experts=8, top_k=2, moe_tokens=4, channels=(0, 0, 1, 1))
ROOMY = Capacity(tiles=4, pages=400, page_size=16, jobs_per_tile=4, kv_heads=2)


def linear_model(attention=(1000.0, 10.0, 0.0), moe=(0.0,) * 8, shape=SHAPE) -> CostModel:
    """Cycles: a round's 1000 + 10 x its biggest job's tokens; energy 1 pJ a token."""
    return CostModel(shape, {"attention_cycles": list(attention),
                             "attention_energy": [0.0, 1.0, 0.0, 0.0],
                             "moe_cycles": list(moe), "moe_energy": [0.0] * 8,
                             "moe_later_cycles": list(moe), "moe_later_energy": [0.0] * 8})


# Traces -------------------------------------------------------------------------------

def test_trace_round_trip(tmp_path):
    requests = agent_trace(3, 3, prompt=40, tool=10, answer=5, tool_wait=0.25, seed=4)
    path = tmp_path / "t.jsonl"
    write_trace(path, requests)
    assert read_trace(path) == requests


@pytest.mark.parametrize("line, reason", [
    ("{", "not JSON"),
    ("[1]", "a JSON object"),
    ('{"id": "a", "arrival": 0, "input": 4}', "missing field 'output'"),
    ('{"id": "a", "arrival": 0, "input": 4, "output": 1, "colour": 1}', "unknown field"),
    ('{"id": "a", "arrival": 0, "input": 0, "output": 1}', "input must be >= 1"),
    ('{"id": "a", "arrival": -1, "input": 4, "output": 1}', "arrival must be"),
    ('{"id": "a", "arrival": 0, "input": "4", "output": 1}', "input must be a number"),
    ('{"id": "a", "arrival": 0, "input": 4, "output": true}', "output must be a number"),
    ('{"id": "a", "arrival": 0, "input": 4, "output": 1, "prefix": 4, "conversation": "c"}',
     "prefix must be in 0..input - 1"),
    ('{"id": "a", "arrival": 0, "input": 4, "output": 1, "prefix": 2}', "needs the conv"),
    ('{"id": "r0", "arrival": 0, "input": 4, "output": 1}', "repeats an earlier"),
    ('{"id": "a", "arrival": 0, "input": 9, "output": 1, "prefix": 8, "conversation": "c"}',
     "longer than conversation 'c'"),
])
def test_malformed_trace_lines_are_refused_with_their_line_number(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "r0", "arrival": 0, "input": 4, "output": 1}\n\n' + line + "\n")
    with pytest.raises(TraceError, match=rf"bad.jsonl:3: .*{reason}"):
        read_trace(path)


def test_a_trace_that_cannot_be_read_as_text_is_refused(tmp_path):
    with pytest.raises(TraceError, match=r"missing.jsonl: cannot read the trace \(No such"):
        read_trace(tmp_path / "missing.jsonl")
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b'{"id": "r0"}\n\xff\xfe')
    with pytest.raises(TraceError, match="binary.jsonl: not a text file"):
        read_trace(path)


def test_empty_trace_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(TraceError, match="no requests"):
        read_trace(path)


def test_generated_lengths_and_prefixes(seed):
    fixed = fixed_trace(100, 50, 200, seed=seed)
    inputs = [r.input for r in fixed]
    assert min(inputs) >= 80 and max(inputs) <= 100 and len(set(inputs)) > 5
    assert all(40 <= r.output <= 50 for r in fixed)
    agents = agent_trace(2, 3, prompt=40, tool=10, answer=5, tool_wait=1.0, burst=1,
                         gap=2.0, seed=seed)
    for first, second in zip(agents, agents[1:], strict=False):
        if first.conversation == second.conversation:
            assert second.prefix == first.input + first.output
            assert second.tool_wait == 1.0
    assert [r.arrival for r in agents] == [0.0] * 3 + [2.0] * 3
    bursts = agent_trace(4, 1, prompt=40, tool=10, answer=5, tool_wait=1.0, burst=2,
                         gap=3.0, seed=seed)
    assert [r.arrival for r in bursts] == [0.0, 0.0, 3.0, 3.0]


# The cost model -----------------------------------------------------------------------

def test_fit_recovers_linear_rounds(seed):
    """Steps of 1 to 64 tokens: lone MoE rounds and chains of rounds that share the
    weights they stream, whose attention jobs store the later rounds' rows, each round's
    host-port cycles kept apart; the fit finds the coefficients that made the rounds'
    cycles."""
    rng = np.random.default_rng(seed)
    shape = replace(SHAPE, chained=True)
    truth = linear_model(attention=(500.0, 7.0, 0.25, 40.0),
                         moe=(300.0, 150.0, 20.0, 900.0, 0.0, 0.0, 700.0, 0.0), shape=shape)
    truth.coefficients["moe_energy"] = [10.0, 40.0, 2.0, 50.0, 30.0, 0.0, 3.0, 1.0]
    # A chain's later rounds have a model of their own (bound by compute, not memory).
    truth.coefficients["moe_later_cycles"] = [200.0, 0.0, 90.0, 100.0, 0.0, 0.0, 500.0, 0.0]
    truth.coefficients["moe_later_energy"] = [5.0, 0.0, 4.0, 20.0, 60.0, 0.0, 1.0, 2.0]
    truth.coefficients["attention_energy"] = [30.0, 2.0, 0.5, 9.0, 3.0]
    records = []
    for _ in range(16):
        batch = int(rng.integers(1, 5))
        contexts = [int(c) for c in rng.integers(20, 400, batch)]
        tokens = int(rng.choice([1, 8, 16]))
        host = float(rng.integers(50, 5000))  # the host port's, kept apart
        jobs = shape.jobs([(tokens, context) for context in contexts])
        for rnd in shape.attention_rounds(jobs):
            fc, fe = attention_features(rnd, stores=True)
            cycles = np.dot(truth.coefficients["attention_cycles"], fc)
            records.append({"phase": "extend", "contexts": contexts, "tokens": tokens * batch,
                            "cycles": cycles, "host_cycles": host,
                            "energy_pj": np.dot(truth.coefficients["attention_energy"], fe)})
        loads = []
        for t in shape.moe_rounds(tokens * batch):
            chosen = [rng.choice(shape.experts, shape.top_k, replace=False) for _ in range(t)]
            loads.append(np.bincount(np.ravel(chosen), minlength=shape.experts).tolist())
        for load, f in zip(loads, shape.step_features(loads), strict=True):
            cycles, energy = truth.moe(f)
            records.append({"phase": "extend-moe", "tokens": sum(load) // shape.top_k,
                            "contexts": contexts, "expert_load": load,
                            "cycles": cycles, "host_cycles": host,
                            "energy_pj": energy})
    model = fit(shape, round_samples(shape, records))
    assert model.coefficients["attention_cycles"] == pytest.approx([500.0, 7.0, 0.25, 40.0])
    # The cycle models leave out the experts loaded and the busiest tile's experts and pairs.
    for kind in ("moe", "moe_later"):
        assert [model.coefficients[f"{kind}_cycles"][i] for i in (4, 5, 7)] == [0, 0, 0]
    # Without a chain's later rounds to fit, the first rounds' model prices them.
    lone = fit(shape, [s for s in round_samples(shape, records) if s[0] != "moe_later"])
    assert lone.coefficients["moe_later_cycles"] == lone.coefficients["moe_cycles"]
    for cycles, predicted, pj, p_pj in step_totals(model, records):
        assert predicted == pytest.approx(cycles, rel=1e-6)
        assert p_pj == pytest.approx(pj, rel=1e-6)
    runs = [{"phase": "decode", "batch": 1, "tokens": 1, "held_out": held, "wall_s": 0,
             "rounds": records} for held in (False, True)]
    fitted = fit_runs(shape, runs)
    assert fitted.calibration["error_p95_cycles"] == pytest.approx(0, abs=1e-6)
    assert fitted.calibration["held_out_steps"] == len(step_totals(model, records))


def test_a_kept_round_keeps_the_host_port_apart():
    """A calibration keeps a round's host cycles (loading it, reading its outputs) as one
    count beside its cycles, which alone are priced; what else the chip's record holds
    is dropped."""
    record = {"phase": "decode", "contexts": [5], "tokens": 1, "cycles": 900,
              "host_cycles": {"load": 70, "read": 30}, "counters": {"0": {}}}
    round_ = kept(record, 12.4)
    assert round_ == {"phase": "decode", "contexts": [5], "tokens": 1, "cycles": 900,
                      "host_cycles": 100, "energy_pj": 12}
    [(cycles, _, pj, _)] = step_totals(linear_model(), [round_])
    assert (cycles, pj) == (900, 12)


def test_far_attention_rounds_are_priced_by_the_pages_behind_each_channel():
    """Far placement: an attention round's cycles grow with the contexts whose pages one
    channel serves (tiles 0 and 1 share channel 0 on 2 x 2), its energy with every
    job's; other placements keep the three and four features."""
    jobs = [Job(1, 100), Job(1, 50), Job(1, 30), Job(1, 10)]
    far = replace(SHAPE, channels=(0, 0, 1, 1), kv_from_memory=True)
    assert attention_features(jobs, far.kv_channels) == (
        [1.0, 1, 100, 150], [1.0, 4, 190, 4, 190])
    assert replace(far, kv_from_memory=False).kv_channels == ()
    assert attention_features(jobs) == ([1.0, 1, 100], [1.0, 4, 190, 4])


def test_a_chains_jobs_store_the_rows_of_its_later_moe_rounds():
    """Streamed weights (a chain of MoE rounds of 4 tokens): the step's rows are the
    sequences' tokens in turn; a job stores those past the first round's, which its
    round's features count (their cycles and energy); lone rounds store nothing."""
    chain = replace(SHAPE, chained=True)
    jobs = chain.jobs([(2, 10), (1, 5), (0, 7), (3, 20)], window=16)
    assert jobs == [Job(2, 10, 0)] * 2 + [Job(1, 5, 0)] * 2 + [Job(3, 16, 2)] * 2
    assert [job.stored for job in chain.jobs([(2, 10)] * 2)] == [0] * 4  # one round
    assert [job.stored for job in SHAPE.jobs([(2, 10), (1, 5), (3, 20)])] == [0] * 6
    first, second = chain.attention_rounds(chain.jobs([(4, 10), (4, 20), (2, 30)]))
    assert attention_features(first, stores=True) == ([1.0, 4, 80, 8], [1.0, 16, 240, 4, 8])
    assert attention_features(second, stores=True) == ([1.0, 2, 60, 4], [1.0, 4, 120, 2, 4])
    model = linear_model(attention=(1000.0, 0.0, 0.0, 10.0), shape=chain)
    model.coefficients["attention_energy"] = [0.0, 0.0, 0.0, 0.0, 1.0]
    assert model.step([(4, 10), (4, 20), (2, 30)]) == (2000.0 + 80 + 40, 8.0 + 4)
    # The split policy: the prefill's rows first (7 rows: the decode's one is stored).
    assert model.split_step([(4, 10), (2, 12)], [(1, 30)], None, 2) == (
        1000.0 + 1000 + 40, 4.0 + 2)


def test_step_places_jobs_like_the_compiler():
    """Six sequences x 2 KV heads = 12 jobs: 3 rounds of 4 tiles; a window caps context."""
    model = linear_model(attention=(1000.0, 0.0, 1.0))
    cycles, pj = model.step([(1, 100)] * 5 + [(1, 300)])
    # Rounds: jobs 0-3 (seq 0, 1), 4-7 (seq 2, 3), 8-11 (seq 4 and the 300-token seq 5).
    assert cycles == 3 * 1000 + 100 + 100 + 300
    assert pj == 12  # 1 pJ per job-token
    assert model.step([(1, 100)] * 5 + [(1, 300)], window=128)[0] == 3000 + 100 + 100 + 128


def test_moe_rounds_and_routing_features():
    assert SHAPE.moe_rounds(9) == [4, 4, 1]
    assert Shape(4, 2, 8, 2, 4, moe=False).moe_rounds(9) == []
    # Experts 0, 4 (tile 0) and 1 (tile 1), both tiles on channel 0: 3 tokens of top-2.
    assert SHAPE.routing_features([2, 1, 0, 0, 3, 0, 0, 0]) == [
        1.0, 1.0, 3.0, 3.0, 3.0, 2.0, 3.0, 5.0]
    # Without channels the busiest tile stands for the busiest channel.
    alone = Shape(4, 2, 8, 2, 4)
    assert alone.routing_features([2, 1, 0, 0, 3, 0, 0, 0])[6] == 2.0
    [one] = SHAPE.expected_step(1)
    assert one[:5] == pytest.approx([1.0, 1.0, 1.0, 2.0, 2.0])  # one token: its two experts
    [many] = replace(SHAPE, moe_tokens=64).expected_step(64)
    assert many[3:7] == pytest.approx([8.0, 8.0, 2.0, 4.0])
    assert SHAPE.expected_step(5) == SHAPE.expected_step(5)  # seeded


def test_a_chain_of_rounds_loads_each_expert_once():
    """With streamed weights a step's rounds share what they load: a later round of
    the chain loads only experts no round before it did, and not the first weights."""
    shape = replace(SHAPE, chained=True)
    rounds = [[1, 1, 2, 0, 0, 0, 0, 4], [2, 0, 2, 4, 0, 0, 0, 0], [0, 1, 0, 0, 1, 0, 0, 0]]
    first, second, last = shape.step_features(rounds)
    assert (first[1], first[4]) == (1.0, 4.0)  # experts 0, 1, 2, 7
    assert (second[1], second[3], second[4]) == (0.0, 3.0, 1.0)  # of 0, 2, 3 only 3
    assert (last[1], last[4]) == (0.0, 1.0)  # of 1 and 4 only 4
    assert SHAPE.step_features(rounds)[1][1:5] == [1.0, 4.0, 3.0, 3.0]  # not chained
    expected = shape.expected_step(12)  # a chain of three rounds of 4
    assert [f[1] for f in expected] == [1.0, 0.0, 0.0]
    assert expected[0][4] > expected[1][4] > expected[2][4] > 0
    assert [f[1] for f in shape.expected_step(10)] == [1.0, 0.0, 0.0]
    assert shape.expected_step(12)[:2] == shape.expected_step(9)[:2]
    assert shape.features(np.array(rounds), None).tolist() == [
        SHAPE.routing_features(load) for load in rounds]


def test_calibration_plan_holds_held_out_runs_within_capacity():
    plans = calibration_plan(ROOMY.max_sequences, ROOMY.max_context)
    assert any(p.held_out for p in plans) and any(not p.held_out for p in plans)
    for p in plans:
        assert 1 <= p.batch <= ROOMY.max_sequences
        if p.phase == "decode":
            assert p.tokens + 1 <= ROOMY.max_context(p.batch)


# The scheduler ------------------------------------------------------------------------

def test_one_request_by_hand():
    """40 prompt tokens in chunks of 32 and 8, then 2 decode steps; 2 layers at 1 kHz."""
    model = linear_model()
    [o] = serve([Request("a", 0.0, 40, 3)], model, ROOMY, concurrency=1,
                windows=[None, None], clock_hz=1000.0)
    # A step of one sequence: 2 jobs, one round of 1000 + 10 t cycles, x 2 layers.
    prefill = 2 * (1320 + 1080)
    decode = 2 * 1010
    assert o.first == pytest.approx(prefill / 1000)
    assert o.done == pytest.approx((prefill + 2 * decode) / 1000)
    assert o.energy_j == pytest.approx(2 * 2 * (40 + 2) * 1e-12)  # 2 jobs x 2 layers


def test_concurrency_paces_the_client():
    model = linear_model()
    requests = [Request(f"r{i}", 0.0, 16 * (i + 1), 4) for i in range(4)]
    one = serve(requests, model, ROOMY, concurrency=1, windows=[None], clock_hz=1e3)
    four = serve(requests, model, ROOMY, concurrency=4, windows=[None], clock_hz=1e3)
    for before, after in zip(one, one[1:], strict=False):
        assert after.sent == pytest.approx(before.done)
    assert all(o.sent == 0.0 for o in four)
    assert max(o.done for o in four) < max(o.done for o in one)
    summary = summarise(four)
    assert summary["completed"] == 4 and summary["failed"] == 0
    e2e = sorted(o.done - o.sent for o in one)
    assert summarise(one, slo_s=(e2e[0] + e2e[1]) / 2)["timeouts"] == 3
    assert summarise(one)["timeouts"] is None


def test_a_request_the_chip_cannot_hold_fails_and_the_rest_complete():
    small = Capacity(tiles=4, pages=8, page_size=16, jobs_per_tile=1, kv_heads=2)
    requests = [Request("ok", 0.0, 30, 2), Request("huge", 0.0, 200, 2), Request("ok2", 0.0, 30, 2)]
    outcomes = serve(requests, linear_model(), small, concurrency=3, windows=[None],
                     clock_hz=1e3)
    assert [o.failed is None for o in outcomes] == [True, False, True]
    assert "a sequence holds at most 64" in outcomes[1].failed
    summary = summarise(outcomes)
    assert summary["failed"] == 1 and summary["completed"] == 2
    # Two sequences fit the 4 tiles' single slots at once: both ran, none left waiting.
    assert all(o.done is not None for o in outcomes)


def test_capacity_follows_the_compiler_sizes():
    """gpt-oss on a chip of 383 pages a tile, 4 row pairs, 2 KV heads."""
    local = Capacity(tiles=4, pages=383, page_size=16, jobs_per_tile=4, kv_heads=2,
                     max_tokens=4096)
    assert local.max_sequences == 8
    assert local.max_context(1) == 191 * 16 and local.max_context(8) == 47 * 16
    striped = Capacity(tiles=4, pages=383, page_size=16, jobs_per_tile=4, kv_heads=2,
                       parts=2, max_tokens=4096)
    assert striped.max_context(2) == 95 * 16  # half a tile's pages for its own jobs
    capped = Capacity(tiles=4, pages=383, page_size=16, jobs_per_tile=4, kv_heads=2,
                      max_tokens=1024)
    assert capped.max_context(1) == 1024


def test_kv_kept_is_a_hit_and_evicted_is_a_miss():
    model = linear_model()
    trace = agent_trace(4, 3, prompt=40, tool=8, answer=4, tool_wait=0.01, seed=2)
    roomy = serve(trace, model, ROOMY, concurrency=4, windows=[None], clock_hz=1e3)
    # Every prefix but each previous answer's last token, which no step has fed yet.
    hit = summarise(roomy)["kv_hit_rate"]
    prefixes = [r.prefix for r in trace if r.prefix]
    assert hit == pytest.approx(1 - len(prefixes) / sum(prefixes))
    # Room for two conversations' caches: the others evict them between turns.
    tight = Capacity(tiles=4, pages=28, page_size=16, jobs_per_tile=1, kv_heads=2)
    missed = serve(trace, model, tight, concurrency=4, windows=[None], clock_hz=1e3)
    figures = summarise(missed)
    assert figures["completed"] == len(trace)
    assert 0 <= figures["kv_hit_rate"] < 1
    assert figures["energy_j"] > summarise(roomy)["energy_j"]  # misses prefill again
    assert figures["tasks"] == 4 and figures["agent_interactivity"] > 0
    never = summarise(serve(trace, model, ROOMY, concurrency=4, windows=[None],
                            clock_hz=1e3, prefix_cache=False))
    assert never["kv_hit_rate"] == 0 and never["task_e2e_p90_s"] > summarise(roomy)[
        "task_e2e_p90_s"]


def test_chunked_prefill_keeps_decoding_while_a_prompt_arrives():
    model = linear_model()
    requests = [Request("long", 0.0, 8, 40), Request("late", 0.05, 256, 2)]
    rounds = serve(requests, model, ROOMY, concurrency=2, windows=[None], clock_hz=1e5,
                   policy="rounds")
    chunked = serve(requests, model, ROOMY, concurrency=2, windows=[None], clock_hz=1e5,
                    policy="chunked")
    # Phase rounds stall the decoding sequence for the whole prompt; chunked does not.
    assert chunked[0].done < rounds[0].done
    assert {o.failed for o in rounds + chunked} == {None}


def test_split_prefills_on_its_tiles_then_moves_the_cache_by_hand():
    """40 prompt tokens on 2 of the 4 tiles (chunks of 32 and 8: one round of the two
    KV-head jobs each), the cache moved to the other two, 2 decode steps there; 2 layers."""
    model = linear_model(shape=replace(SHAPE, move_word_pj=2.0))
    capacity = replace(ROOMY, page_words=64)
    [o] = serve([Request("a", 0.0, 40, 3)], model, capacity, concurrency=1,
                windows=[None, None], clock_hz=1000.0, policy="split", prefill_tiles=2)
    prefill, decode = 2 * (1320 + 1080), 2 * 1010
    words = 2 * 3 * 64  # a job's K and V pages of 16 tokens for 40 tokens
    move = 2 * (MOVE_LATENCY + MOVE_CYCLES_PER_WORD * words)  # the two jobs at once
    assert o.first == pytest.approx(prefill / 1000)
    assert o.done == pytest.approx((prefill + move + 2 * decode) / 1000)
    assert o.energy_j == pytest.approx((2 * 2 * (40 + 2) + 2 * 2 * words * 2.0) * 1e-12)


def test_split_decodes_on_its_tiles_while_a_prompt_prefills():
    """A decoding sequence goes on while another's prompt is prefilled on the other
    tiles; with more decoding jobs than decode tiles, its steps take more rounds."""
    model = linear_model()
    requests = [Request("long", 0.0, 8, 40), Request("late", 0.05, 256, 2)]
    runs = {policy: serve(requests, model, ROOMY, concurrency=2, windows=[None],
                          clock_hz=1e5, policy=policy) for policy in ("rounds", "split")}
    assert runs["split"][0].done < runs["rounds"][0].done
    assert {o.failed for r in runs.values() for o in r} == {None}
    one = [Request(f"r{i}", 0.0, 4, 8) for i in range(2)]
    three = serve(one, model, ROOMY, concurrency=2, windows=[None], clock_hz=1e3,
                  policy="split", prefill_tiles=3)
    two = serve(one, model, ROOMY, concurrency=2, windows=[None], clock_hz=1e3,
                policy="split", prefill_tiles=2)
    # Four decode jobs: four rounds on one decode tile, two on two.
    assert max(o.done for o in three) > max(o.done for o in two)


def test_split_refuses_what_its_tiles_cannot_hold():
    small = Capacity(tiles=4, pages=8, page_size=16, jobs_per_tile=2, kv_heads=2)
    requests = [Request("ok", 0.0, 30, 2), Request("long prompt", 0.0, 100, 2)]
    outcomes = serve(requests, linear_model(), small, concurrency=2, windows=[None],
                     clock_hz=1e3, policy="split", prefill_tiles=1)
    assert outcomes[0].failed is None
    assert "holds at most" in outcomes[1].failed
    for tiles in (0, 4):
        with pytest.raises(ValueError, match="prefill tiles"):
            serve(requests, linear_model(), small, concurrency=1, windows=[None],
                  clock_hz=1.0, policy="split", prefill_tiles=tiles)
    with pytest.raises(ValueError, match="split policy"):
        serve(requests, linear_model(), small, concurrency=1, windows=[None], clock_hz=1.0,
              policy="chunked", prefill_tiles=2)


@pytest.mark.parametrize("words", [512, 2048])
def test_kv_move_cycles_are_the_chips(words):
    """On the RTL: two pairs of tiles streaming ``words`` words each at once take the
    cycles :meth:`CostModel.move` prices, within 2 %."""
    from sim.chip_run import chip_config, simulate_chip

    result = simulate_chip(chip_config("tiny", k=2), "chip_stream",
                           {"words": words, "chunk": 512, "senders": [0, 1],
                            "receivers": [3, 2]})
    assert result["passed"]
    priced, _ = linear_model().move([words, words], 2)
    assert abs(priced - result["cycles"]) <= 0.02 * result["cycles"], (priced, result)


def test_bad_scheduler_arguments_are_refused():
    with pytest.raises(ValueError, match="policy"):
        serve([Request("a", 0, 4, 1)], linear_model(), ROOMY, concurrency=1, windows=[None],
              clock_hz=1.0, policy="spatial")
    with pytest.raises(ValueError, match="concurrency"):
        serve([Request("a", 0, 4, 1)], linear_model(), ROOMY, concurrency=0, windows=[None],
              clock_hz=1.0)


# Metrics ------------------------------------------------------------------------------

def test_front_interpolation_and_matched_ratio():
    points = [(1.0, 10.0), (2.0, 8.0), (1.5, 5.0), (4.0, 2.0)]
    assert front(points) == [(1.0, 10.0), (2.0, 8.0), (4.0, 2.0)]
    f = front(points)
    assert interpolate(f, 3.0) == pytest.approx(5.0)
    assert interpolate(f, 5.0) is None
    doubled = [(x, 2 * y) for x, y in f]
    assert [r for _, r in matched(doubled, f)] == pytest.approx([2.0, 2.0])
    assert matched(f, [(10.0, 1.0), (11.0, 0.5)]) == []


def test_serve_merge_rebuilds_comparisons(tmp_path, capsys):
    from cli.main import main

    def run(label, c, inter, per_j, tps, e2e):
        return {"label": label, "concurrency": c, "completed": 4, "failed": 0,
                "failures": [], "requests": 4, "interactivity": inter, "tokens_per_j": per_j,
                "tokens_per_s": tps, "e2e_p50_s": e2e, "e2e_p99_s": e2e, "ttft_p50_s": 0.1,
                "tpot_p50_s": 1 / inter, "kv_hit_rate": None}
    head = {"workload": "gpt-oss", "clock_hz": 1e9, "layers": 36, "requests": 4}
    shards = []
    for i, (label, scale) in enumerate((("A", 1.0), ("B", 1.5))):
        runs = [run(label, c, 100 / c, 1000 * c ** 0.5 * scale, 50 * c, 0.5 * c / scale)
                for c in (1, 2, 4, 8)]
        path = tmp_path / f"shard{i}.json"
        path.write_text(json.dumps({**head, "calibration": {label: {}}, "runs": runs}))
        shards.append(path)
    out = tmp_path / "merged.json"
    assert main(["serve", "--merge", *map(str, shards), "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    [comparison] = merged["comparisons"]
    assert [item["ratio"] for item in comparison["throughput_per_energy"]] == \
        pytest.approx([1.5, 1.5])
    assert [item["ratio"] for item in comparison["e2e_latency_speedup"]] == \
        pytest.approx([1.5, 1.5])
    assert "B against A" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe")
    for name, reason in (("bad.json", "not a serve JSON file ('runs')"),
                         ("binary.json", "not a serve JSON file"),
                         ("missing.json", "cannot read it (No such file or directory)")):
        assert main(["serve", "--merge", str(tmp_path / name)]) == 2
        assert f"--merge {tmp_path / name}: {reason}" in capsys.readouterr().err


def test_serve_runs_a_split_for_each_prefill_tile_count(monkeypatch, tmp_path, capsys):
    """``--policy rounds,split --prefill-tiles 1,3``: three design points (on a linear
    cost model instead of a calibration), each split named by its tiles and compared
    with phase rounds."""
    import serve.design
    from cli.main import main

    def prepare(design, *_, **__):
        return serve.design.Prepared(design, replace(ROOMY, page_words=64), [None],
                                     linear_model(), None, None, 1)
    monkeypatch.setattr(serve.design, "prepare", prepare)
    out = tmp_path / "runs.json"
    assert main(["serve", "--policy", "rounds,split", "--prefill-tiles", "1,3",
                 "--concurrency", "1,4", "--requests", "8", "--isl", "40", "--osl", "4",
                 "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [(r["label"].split(" local ")[1], r.get("prefill_tiles")) for r in runs] == [
        ("rounds", None)] * 2 + [("split 1+3", 1)] * 2 + [("split 3+1", 3)] * 2
    assert all(r["completed"] == 8 for r in runs)
    printed = capsys.readouterr().out
    assert "split 1+3 against 2x2 N=8 local rounds" in printed
    assert "split 3+1 against 2x2 N=8 local rounds" in printed


def test_serve_refuses_a_malformed_trace_before_calibrating(tmp_path, capsys):
    from cli.main import main

    path = tmp_path / "t.jsonl"
    path.write_text('{"id": "a", "arrival": 0, "input": 4, "output": 1}\n{"id": "a"}\n')
    assert main(["serve", "--trace", str(path)]) == 2
    assert "t.jsonl:2: missing field" in capsys.readouterr().err


@pytest.mark.parametrize("args, reason", [
    (["--write-trace", "/proc/serrano/t.jsonl"], "--write-trace /proc/serrano/t.jsonl"),
    (["--tool-wait", "-1"], None),
    (["--tool-wait", "nan"], None),
    (["--agent", "--gap", "-2"], None),
    (["--agent", "--gap", "inf"], None),
    (["--slo", "0"], None),
    (["--slo", "nan"], None),
    (["--agent", "--burst", "0"], None),
    (["--clock", "fpgaa"], None),
    (["--shard", "2/2"], None),
    (["--policy", "rounds,spatial"], None),
    (["--kv-rows", "24"], None),
    (["--prefill-tiles", "2"], "--prefill-tiles is for --policy split"),
    (["--policy", "split", "--prefill-tiles", "4"], "--prefill-tiles 4: 1 to 3 of the 4"),
    (["--policy", "split", "--mesh", "1x1"], "--policy split needs 2 tiles or more"),
])
def test_serve_refuses_bad_options(args, reason, capsys):
    from cli.main import main

    if reason is None:  # refused by the option's type: argparse's usage error
        with pytest.raises(SystemExit) as stopped:
            main(["serve", *args])
        assert stopped.value.code == 2
        assert "serrano serve: error" in capsys.readouterr().err
        return
    assert main(["serve", *args]) == 2
    assert reason in capsys.readouterr().err


def test_serve_calibrates_on_the_chip_and_reuses_the_fit(tmp_path, monkeypatch, capsys):
    """tiny on the RTL with 16 block-table rows a tile (16 sequences at once, 8 with the
    default 8), KV local and far: a short calibration each (fitted runs up to 12
    sequences, one held out, each bit-exact with golden), the sweep served on its fit;
    far decodes slower (every step loads the whole cache from the memory channels); the
    second run reuses the saved runs without simulating, and a --recalibrate stopped
    half-way leaves them as they were."""
    import serve.design
    import sim.chip_run
    from cli.main import main
    from serve.cost import Plan

    monkeypatch.setattr(serve.design, "CALIBRATIONS", tmp_path / "serve")
    monkeypatch.setattr(serve.design, "calibration_plan", lambda *_: [
        Plan("decode", 1, 20), Plan("decode", 12, 9), Plan("prefill", 1, 10),
        Plan("decode", 2, 30, held_out=True)])
    out = tmp_path / "serve.json"
    args = ["serve", "--workload", "tiny", "--kv-rows", "16", "--concurrency", "1,12",
            "--requests", "12", "--isl", "12", "--osl", "3", "--layers", "2",
            "--placement", "local,far", "--json", str(out),
            "--write-trace", str(tmp_path / "served.jsonl")]
    assert main(args) == 0
    assert read_trace(tmp_path / "served.jsonl") == fixed_trace(12, 3, 12)
    document = json.loads(out.read_text())
    assert list(document["calibration"]) == ["2x2 N=8 16 rows local", "2x2 N=8 16 rows far"]
    for calibration in document["calibration"].values():
        assert calibration["held_out_steps"] == 1
        assert 0 <= calibration["error_p95_cycles"] < 1
        # Every run keeps the host port's cycles around its rounds, not priced.
        assert all(r["host_cycles"] > 0 for r in calibration["runs"])
    assert "not priced: the host port's transfers around the rounds" in capsys.readouterr().out
    assert [r["completed"] for r in document["runs"]] == [12] * 4
    one, twelve, far_one, _ = document["runs"]
    assert 0 < one["ttft_p50_s"] < one["e2e_p50_s"]
    assert twelve["tokens_per_s"] > one["tokens_per_s"]  # sequences share each step
    assert far_one["tpot_p50_s"] > one["tpot_p50_s"]

    def no_simulation(*_, **__):
        raise AssertionError("the saved calibration was not reused")
    monkeypatch.setattr(sim.chip_run, "simulate_layer", no_simulation)
    assert main(args) == 0
    assert json.loads(out.read_text())["runs"] == document["runs"]

    # A --recalibrate stopped before its runs are all made keeps the saved ones.
    saved = sorted((tmp_path / "serve").iterdir())
    before = [p.read_text() for p in saved]

    class Stopped(Exception):
        pass

    def stopped(*_, **__):
        raise Stopped
    monkeypatch.setattr(sim.chip_run, "simulate_layer", stopped)
    with pytest.raises(Stopped):
        main([*args, "--recalibrate"])
    assert sorted((tmp_path / "serve").iterdir()) == saved
    assert [p.read_text() for p in saved] == before


@pytest.mark.parametrize("policy", ["rounds", "chunked", "split"])
def test_every_request_is_served_or_failed_and_every_page_comes_back(policy, seed):
    """Random agent conversations and fixed requests on a chip too small for them all:
    each request completes (its times in order, its hits within its prefix) or fails
    with a reason, and the scheduler's books balance (it raises otherwise)."""
    rng = np.random.default_rng(seed)
    small = Capacity(tiles=4, pages=int(rng.integers(24, 60)), page_size=16,
                     jobs_per_tile=int(rng.integers(1, 4)), kv_heads=2, page_words=8)
    requests = agent_trace(int(rng.integers(2, 6)), int(rng.integers(1, 4)), prompt=60,
                           tool=20, answer=6, tool_wait=0.01, burst=2, gap=0.02,
                           seed=seed)
    requests += [replace(r, id=f"f{r.id}") for r in fixed_trace(80, 8, 6, seed=seed)]
    requests.append(Request("huge", 0.0, 2000, 4))
    model = linear_model(moe=(100.0, 10.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0),
                         shape=replace(SHAPE, move_word_pj=1.0))
    outcomes = serve(requests, model, small, concurrency=int(rng.integers(1, 6)),
                     windows=[None, 32], clock_hz=1e6, policy=policy)
    for o in outcomes:
        if o.failed:
            assert o.first is None and "holds at most" in o.failed, o
            continue
        assert o.sent <= o.first <= o.done and o.energy_j > 0, o
        assert o.hit_tokens <= o.request.prefix, o
    assert outcomes[-1].failed
