"""The `serrano` command line: the report, and bad options refused before simulation."""

from __future__ import annotations

import json
import os
import re

import pytest

from cli.main import main
from rtl.tensor_core import TensorCore
from sim.chip_run import BOUNDS
from sim.gemm_run import simulate_gemm
from sim.harness import StreamHarness


def test_sim_runs_a_decoder_layer_on_the_chip_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["sim", "--workload", "tiny", "--batch", "2", "--prefill", "5", "--context",
                 "8", "--steps", "1", "--json", str(out), "--dump", str(tmp_path / "dump")]) == 0
    text = capsys.readouterr().out
    assert "2x2 chip of N=8 tiles" in text and "round 6/6 decode-moe" in text
    assert "round 5/6 decode-proj" in text
    assert "bit-exact with golden.attention, golden.decoder and golden.moe" in text
    assert "time-to-first-token proxy" in text and "inter-token latency proxy" in text
    assert "sparse dispatch" in text and "flits injected" in text
    figures = json.loads(out.read_text())
    assert figures["passed"] is True
    metrics = figures["metrics"]
    assert metrics["chip__prefill__cycles"] == (metrics["chip__prefill__attention_cycles"]
                                                + metrics["chip__prefill__projection_cycles"]
                                                + metrics["chip__prefill__moe_cycles"])
    assert "+ projection " in text
    assert 0 < metrics["chip__decode__utilisation"] < 1
    assert 1 < metrics["moe__executed_over_sparse_macs"] < 2.5  # tables, gates, combine
    # Expert tiles wait for their tokens: part of the MoE rounds, not all of them.
    assert 0 < metrics["chip__decode__moe_network_wait_share"] < 1
    assert "waiting on the network or memory: " in text
    assert metrics["chip__network__moe_words"] > 0 and metrics["chip__network__kv_words"] == 0
    # The experts' weights streamed from the memory channels, every MoE round.
    assert "MoE weights loaded from them" in text
    assert "before each round the tokens, constants, KV appends" in text
    assert all(sum(r["channel_reads"]) > 0 for r in figures["rounds"] if r["phase"].endswith("moe"))
    assert metrics["chip__decode__memory_bytes_per_token"] > 0
    # What the host wrote before the rounds and read after them, outside the rounds'
    # cycles: the programs and the memory image (the experts' weights) once, before the
    # first round (32 bytes an instruction, 8 a memory word), then
    # a round's changed program words, its tokens and constants; decode appends each
    # sequence's K and V (2 KV heads x 4 words of a 32-channel head, each). The host
    # port moves one word of a stream a cycle, the streams side by side: at least the
    # most words of one kind.
    assert "the host's transfers before and after each round, the tiles idle" in text
    assert "once, before the first round (in no phase): the programs " in text
    assert ", the memory image " in text
    image = metrics["chip__host__memory_once_bytes"]
    assert image > 0 and image % 8 == 0
    assert metrics["chip__host__memory_once_cycles"] >= image // 8 // 2  # 2 channels
    once = metrics["chip__host__programs_once_bytes"]
    assert once > 0 and once % 32 == 0
    assert metrics["chip__host__programs_once_cycles"] >= once // 32
    assert metrics["chip__decode__host_program_bytes"] < once / 10
    for phase, name in (("prefill", "cycles"), ("decode", "cycles_per_token")):
        assert metrics[f"chip__{phase}__host_program_bytes"] % 32 == 0
        assert metrics[f"chip__{phase}__host_scratchpad_bytes"] > 0
        assert metrics[f"chip__{phase}__host_output_bytes"] > 0
        assert metrics[f"chip__{phase}__host_bytes"] == sum(
            metrics[f"chip__{phase}__host_{kind}_bytes"] for kind in ("program", "scratchpad",
                                                                    "kv"))
        assert metrics[f"chip__{phase}__host_cycles"] >= max(
            metrics[f"chip__{phase}__host_program_bytes"] // 32,
            metrics[f"chip__{phase}__host_scratchpad_bytes"] // 8)
        assert metrics[f"chip__{phase}__{name}_with_host"] == (
            metrics[f"chip__{phase}__{name}"] + metrics[f"chip__{phase}__host_cycles"])
    # Accuracy of the run's own outputs, per phase: printed and in the JSON.
    assert "accuracy     the run's outputs against float64" in text
    assert "decode-moe:" in text and "none of " in text
    assert set(figures["accuracy"]) == {"prefill", "prefill-proj", "prefill-moe", "decode",
                                        "decode-proj", "decode-moe"}
    assert metrics["chip__decode__accuracy_saturated"] == 0
    assert metrics["chip__prefill__accuracy_cosine"] >= 0.999
    assert metrics["chip__decode_moe__accuracy_cosine"] >= 0.99
    # --dump: two sequences and one projection and one MoE round per phase, each a golden
    # workload directory.
    assert "6 workload directories" in text
    assert ", 0 elements differ" in text
    run = json.loads((tmp_path / "dump" / "run.json").read_text())
    assert run["workload"] == "tiny" and run["chip"]["k"] == 2
    assert "not measured: add --energy" in text


def test_sim_runs_the_moe_layer_in_rounds_of_moe_tokens(tmp_path, capsys):
    """--moe-tokens 4: the prefill's 10 tokens in three MoE rounds, bit-exact on the RTL
    (the tiny chip's build: its room is sized by attention either way), with the weights
    streamed and resident: loading them from memory is counted, in MoE cycles."""
    runs = {}
    for weights in ("streamed", "resident"):
        out = tmp_path / f"{weights}.json"
        assert main(["sim", "--workload", "tiny", "--batch", "2", "--prefill", "5",
                     "--context", "8", "--steps", "1", "--moe-tokens", "4", "--weights",
                     weights, "--json", str(out)]) == 0
        text = capsys.readouterr().out
        assert "in rounds of up to 4 tokens" in text
        assert "the host port's transfers, outside the rounds" in text
        runs[weights] = json.loads(out.read_text())
    for run in runs.values():
        assert [r["phase"] for r in run["rounds"]] == [
            "prefill", *["prefill-proj", "prefill-moe"] * 3, "decode", "decode-proj",
            "decode-moe"]
    streamed, resident = (runs[w]["metrics"] for w in ("streamed", "resident"))
    assert resident["chip__decode__memory_bytes_per_token"] == 0
    assert streamed["chip__decode__memory_bytes_per_token"] > 0
    for phase in ("prefill", "decode"):
        assert (streamed[f"chip__{phase}__attention_cycles"]
                == resident[f"chip__{phase}__attention_cycles"])
        assert streamed[f"chip__{phase}__moe_cycles"] > resident[f"chip__{phase}__moe_cycles"]
    # The roofline's bounds are lower bounds of what the RTL took; the weights streamed,
    # memory is the largest; resident, nothing is loaded and memory bounds nothing.
    for run in (streamed, resident):
        for phase, name in (("prefill", "cycles"), ("decode", "cycles_per_token")):
            cycles = run[f"chip__{phase}__{name}"]
            for bound in BOUNDS:
                assert 0 <= run[f"chip__{phase}__{bound}_bound_cycles"] <= cycles, bound
            assert run[f"chip__{phase}__memory_bound_ratio"] >= 1
            # Every tile computes, and the MoE layer's dispatch crosses the mesh.
            assert run[f"chip__{phase}__tile_compute_bound_cycles"] > 0
            assert run[f"chip__{phase}__network_bound_cycles"] > 0
    assert streamed["chip__decode__largest_bound"] == "memory"
    assert resident["chip__decode__memory_bound_cycles"] == 0
    # The access model: the streamed bytes cost memory energy, resident weights none;
    # the other classes are counted in both.
    assert streamed["chip__decode__energy_memory_pj"] > 0
    assert resident["chip__decode__energy_memory_pj"] == 0
    for run in (streamed, resident):
        assert all(run[f"chip__decode__energy_{c}_pj"] > 0 for c in ("compute", "sram", "network"))
        assert run["chip__decode__energy_per_token_pj"] * 2 == pytest.approx(
            run["chip__decode__energy_pj"], abs=1)
        assert run["chip__decode__energy_per_token_with_host_pj"] * 2 == pytest.approx(
            run["chip__decode__energy_pj"] + run["chip__decode__energy_host_pj"], abs=2)
    # Resident weights cross the host port before every MoE round: their bytes' energy
    # is the host's, not the memory channels'.
    assert resident["chip__decode__energy_host_pj"] > streamed["chip__decode__energy_host_pj"]
    assert streamed["chip__prefill__crossover_tokens"] > 4
    assert "crossover_tokens" not in str(resident)


def test_more_memory_bandwidth_streams_the_same_weights_in_fewer_cycles(tmp_path, capsys):
    """--memory-bandwidth 16 (two channels of a word a cycle) against the default 7/8: the
    same bytes loaded and the same attention, the MoE rounds faster, and still above
    their (smaller) memory bound; one build per bandwidth."""
    runs = {}
    for bandwidth, option in (("7/8", []), ("16", ["--memory-bandwidth", "16"])):
        out = tmp_path / f"{bandwidth.replace('/', '_')}.json"
        assert main(["sim", "--workload", "tiny", "--batch", "2", "--prefill", "5",
                     "--context", "8", "--steps", "1", *option, "--json", str(out)]) == 0
        assert f"{bandwidth} byte/cycle in all" in capsys.readouterr().out
        runs[bandwidth] = json.loads(out.read_text())["metrics"]
    slow, fast = runs["7/8"], runs["16"]
    for phase, name in (("prefill", "memory_bytes"), ("decode", "memory_bytes_per_token")):
        assert fast[f"chip__{phase}__{name}"] == slow[f"chip__{phase}__{name}"] > 0
        assert (fast[f"chip__{phase}__attention_cycles"]
                == slow[f"chip__{phase}__attention_cycles"])
        assert fast[f"chip__{phase}__moe_cycles"] < slow[f"chip__{phase}__moe_cycles"]
        assert (fast[f"chip__{phase}__memory_bound_cycles"]
                < slow[f"chip__{phase}__memory_bound_cycles"])
        assert fast[f"chip__{phase}__memory_bound_ratio"] >= 1


def test_sim_with_far_placement_loads_the_kv_pages_from_memory(tmp_path, capsys):
    """--placement far: the same outputs bit-exact, the attention slower than local (every
    page loaded from a memory channel each step), the bytes in the memory line."""
    out = tmp_path / "far.json"
    assert main(["sim", "--workload", "tiny", "--batch", "2", "--prefill", "5", "--context",
                 "8", "--steps", "1", "--placement", "far", "--moe", "off", "--json",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "KV pages (far placement) loaded from them" in text
    metrics = json.loads(out.read_text())["metrics"]
    assert metrics["chip__decode__memory_bytes_per_token"] > 0
    assert metrics["chip__network__kv_words"] == 0  # no page moves between tiles


def test_sim_prefills_a_long_prompt_in_chunks(tmp_path, capsys):
    """--prefill-chunk: a prefill step, then extend steps; the report's prefill is every
    chunk's rounds."""
    out = tmp_path / "report.json"
    assert main(["sim", "--workload", "tiny", "--batch", "1", "--prefill", "9",
                 "--prefill-chunk", "4", "--context", "9", "--steps", "1", "--moe", "off",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "prefill 9 tokens per sequence in chunks of 4" in text
    assert "round 3/4 extend at contexts [9]" in text and "round 4/4 decode" in text
    figures = json.loads(out.read_text())
    chunks = [r for r in figures["rounds"] if r["phase"] != "decode"]
    assert [r["phase"] for r in chunks] == ["prefill", "extend", "extend"]
    assert figures["metrics"]["chip__prefill__cycles"] == sum(r["cycles"] for r in chunks)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--mesh", "2x3"], "KxK (square)"),
        (["--mesh", "9x9"], "1..8"),
        (["--placement", "scattered"], "unknown placement 'scattered'; known: local, striped, far"),
        (["--batch", "0"], "positive"),
        (["--prefill-chunk", "0"], "positive"),
        (["--moe-tokens", "0"], "positive"),
        (["--moe-tokens", "1025"], "MoE rounds of 1 to 1024 tokens, not 1025"),
        (["--memory-bandwidth", "fast"], "bytes per cycle as a number or a fraction"),
        (["--memory-bandwidth", "0"], "must be positive"),
        (["--heads", "-2"], "positive"),
        (["--heads", "100000"], "at most 4095"),
        (["--array", "12"], "power of two"),
        (["--seed", "-1"], "non-negative"),
        (["--threads", "0"], "positive"),
        (["--threads", str((os.cpu_count() or 1) + 1)], "would spin against each other"),
        (["--inject-faults", "1.5"], "fault rate must be a number in 0..1"),
        (["--inject-faults", "0.1,double=0.95"], "add up to more than 1"),
        (["--inject-faults", "0.1,triple=0.1"], "expected RATE or RATE,double=RATE"),
        (["--inject-faults", "0.1", "--fault-seed", "-3"], "non-negative"),
    ],
)
def test_chip_sim_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["sim", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_fault_seed_zero_is_kept(monkeypatch, capsys):
    """--fault-seed 0 is a seed like any other (not the default 1)."""
    import sim.chip_run

    seen = {}

    def simulate_layer(*args, **kwargs):
        seen["faults"] = kwargs["faults"]
        raise ValueError("not simulated here")

    monkeypatch.setattr(sim.chip_run, "simulate_layer", simulate_layer)
    assert main(["sim", "--workload", "tiny", "--batch", "1", "--prefill", "3", "--context",
                 "8", "--steps", "1", "--inject-faults", "0.1", "--fault-seed", "0"]) == 1
    assert seen["faults"].seed == 0


def test_a_fault_seed_without_faults_is_refused(capsys):
    assert main(["sim", "--workload", "tiny", "--fault-seed", "3"]) == 2
    assert "--fault-seed needs --inject-faults" in capsys.readouterr().err


def test_sim_with_a_double_bit_fault_stops_with_a_named_error(tmp_path, capsys):
    """The report and the JSON of a run a double-bit fault stopped: exit status 1."""
    out = tmp_path / "run.json"
    assert main(["sim", "--workload", "tiny", "--batch", "1", "--prefill", "3", "--context",
                 "8", "--steps", "1", "--inject-faults", "0.05,double=0.01",
                 "--fault-seed", "4", "--json", str(out)]) == 1
    text = capsys.readouterr().out
    assert "result       STOPPED: uncorrectable ECC error in round 1: tile 1 " in text
    # Every tile's doubles were detected, tile 1's at least one (one that stopped it).
    doubles = re.findall(r"tile (\d+): \d+ single \(\d+ corrected\), (\d+) double "
                         r"\((\d+) detected\)", text)
    assert len(doubles) == 4 and all(d == seen for _, d, seen in doubles), doubles
    assert int(doubles[1][1]) > 0
    written = json.loads(out.read_text())
    assert written["passed"] is False
    assert {"round", "tile", "address", "bits", "cycle"} == set(written["faults"]["log"][0])


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--workload", "kimi-k2"], "does not fit the tiles of a 2x2 chip"),
        (["--workload", "tiny", "--context", "200"], "does not fit the KV cache"),
        (["--workload", "tiny", "--batch", "40", "--context", "8"],
         "use a larger mesh or a smaller batch"),
        # 24 jobs: 6 a tile need 12 block-table rows, and a tile has 8 unless --kv-rows.
        (["--workload", "tiny", "--batch", "12", "--context", "8"], "kv_sequences = 8"),
        (["--workload", "tiny", "--heads", "5"], "not a multiple of 2"),
        (["--workload", "tiny", "--layer", "2"], "layers 0..1"),
        (["--workload", "tiny", "--max-context", "16", "--context", "40"],
         "give a larger --max-context"),
        (["--workload", "tiny", "--moe", "dense", "--weights", "streamed"],
         "--weights streamed needs --moe sparse"),
        (["--workload", "tiny", "--memory-bandwidth", "20"],
         "at most one 8-byte word per cycle"),
    ],
)
def test_chip_sim_refuses_what_does_not_fit_before_simulating(option, message, capsys):
    assert main(["sim", "--prefill", "4", *option]) == 2
    assert message in capsys.readouterr().err


def test_a_moe_layer_a_larger_mesh_would_not_help_is_not_told_to_use_one(capsys):
    assert main(["sim", "--top-k", "16"]) == 2
    error = capsys.readouterr().err
    assert "top-k list of 8 entries" in error and "simulate attention alone" in error
    assert "larger mesh" not in error


def test_tile_runs_attention_on_a_tile_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["tile", "--workload", "tiny", "--layer", "0", "--prefill", "6", "--context",
                 "9", "--steps", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PASS: all" in text and "bit-exact with golden.attention" in text
    assert "prefill @6" in text and "decode @10" in text and "decode @11" in text
    assert "bound" in text and "phases: GEMM" in text
    figures = json.loads(out.read_text())
    assert figures["passed"] is True
    assert [p["context"] for p in figures["phases"]] == [6, 10, 11]
    assert figures["metrics"]["attention__decode__bound_ratio"] > 1.0


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--workload", "llama"], "unknown workload 'llama'"),
        (["--prefill", "-1"], "non-negative"),
        (["--stall", "2"], "probability"),
    ],
)
def test_tile_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["tile", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_tile_refuses_a_layer_the_workload_lacks(capsys):
    assert main(["tile", "--workload", "tiny", "--layer", "2"]) == 2
    assert "layers 0..1" in capsys.readouterr().err


def test_tile_refuses_nothing_to_simulate_as_a_usage_error(capsys):
    assert main(["tile", "--prefill", "0", "--context", "0", "--steps", "0"]) == 2
    assert "nothing to simulate" in capsys.readouterr().err


def test_tile_refuses_a_context_beyond_its_max_context(capsys):
    assert main(["tile", "--workload", "tiny", "--max-context", "16", "--prefill", "4",
                 "--context", "20", "--steps", "1"]) == 2
    assert "a context of 21 tokens does not fit the KV cache" in capsys.readouterr().err


def test_tile_refuses_a_max_context_no_scratchpad_holds(capsys):
    """gpt-oss's 4 KV caches of 4096 tokens need more than the 2**16-word scratchpad:
    refused as such, not sized down to fewer pages."""
    assert main(["tile", "--max-context", "4096", "--prefill", "4"]) == 2
    assert "do not fit a scratchpad of at most 65536 words" in capsys.readouterr().err


def test_tile_defaults_to_the_workloads_last_layer(monkeypatch, capsys):
    """deepseek-r1 has one attention layer: no --layer means layer 0, as in `serrano sim`."""
    import sim.tile_run

    def stop(config, workload, layer, **kwargs):
        raise ValueError(f"stopped before simulating layer {layer}")

    monkeypatch.setattr(sim.tile_run, "simulate_attention", stop)
    assert main(["tile", "--workload", "deepseek-r1"]) == 1
    out = capsys.readouterr().out
    assert "deepseek-r1 attention layer 0" in out and "simulating layer 0" in out


def test_gemm_reports_pass_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    assert main(["gemm", "--array", "2", "--m", "3", "--k", "5", "--p", "4", "--stall", "0.25",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "PASS: all 12 outputs bit-exact" in text
    assert "utilisation" in text and "cycles/s" in text
    figures = json.loads(out.read_text())
    assert figures["passed"] is True and figures["macs"] == 3 * 5 * 4


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--array", "40"], "array size must be 2..32"),
        (["--array", "1"], "array size must be 2..32"),
        (["--m", "0"], "positive integer"),
        (["--k", "5000"], "at most 4095"),
        (["--seed", "-1"], "non-negative"),
        (["--idle", "1.0"], "probability"),
        (["--sim", "modelsim"], "invalid choice"),
    ],
)
def test_gemm_refuses_bad_options(option, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["gemm", *option])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["synthesize"])
    assert "invalid choice" in capsys.readouterr().err


def test_gemm_shapes_are_checked_before_simulation():
    with pytest.raises(ValueError, match="positive integer"):
        simulate_gemm(4, 0, 3, 3)
    with pytest.raises(ValueError, match="cannot hold"):
        simulate_gemm(4, 64, 64, 64, depth=16)


def test_harness_needs_a_depth_for_every_stream():
    with pytest.raises(ValueError, match="missing \\['c'\\]"):
        StreamHarness(TensorCore(2), {"a": 8, "b": 8})
    with pytest.raises(ValueError, match="positive integer"):
        StreamHarness(TensorCore(2), {"a": 8, "b": 0, "c": 8})


def test_agent_loop_reports_hit_and_miss(tmp_path, capsys):
    out = tmp_path / "agent.json"
    assert main(["agent", "--workload", "tiny", "--turns", "2", "--prompt", "5", "--tool",
                 "3", "--answer", "1", "--no-moe", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hit: " in text and "miss: " in text and "faster with the cache kept" in text
    figures = json.loads(out.read_text())
    assert figures["hit"]["cycles"] > 0 and figures["miss"]["cycles"] > 0
    assert figures["chip__agent_loop__hit_over_miss__speedup"] == pytest.approx(
        figures["miss"]["cycles"] / figures["hit"]["cycles"], rel=1e-3)


def test_agent_refuses_a_workload_that_does_not_fit(capsys):
    assert main(["agent", "--workload", "kimi-k2"]) == 2
    assert "does not fit the tiles of a 2x2 chip" in capsys.readouterr().err
    # Refused before tensors of 100 022 tokens are generated (the prompt, 2 tool
    # results of 8, 3 answers of 2).
    assert main(["agent", "--workload", "tiny", "--no-moe", "--prompt", "100000"]) == 2
    assert "a context of 100022 tokens does not fit the KV cache" in capsys.readouterr().err


def test_sweep_writes_runs_and_plots(tmp_path, capsys):
    """Two placements on the tiny chip (one build): a row per run, the JSON, the two
    plots; striped moves KV words over the network, local does not."""
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--workload", "tiny", "--placement", "local,striped", "--batch",
                 "3", "--context", "9", "--json", str(out), "--plot",
                 str(tmp_path / "sweep")]) == 0
    text = capsys.readouterr().out
    assert "2 runs on 1 design points" in text and "µJ/token" in text
    runs = json.loads(out.read_text())["runs"]
    assert [(r["placement"], r["batch"]) for r in runs] == [("local", 3), ("striped", 3)]
    assert all(r["passed"] and r["decode_cycles_per_token"] > 0 for r in runs)
    local, striped = runs
    assert striped["network_flits"] > local["network_flits"]
    # Striped pages cross the network and are written into the compute tile's frames.
    assert striped["access_energy_per_token_pj"] > local["access_energy_per_token_pj"] > 0
    assert (tmp_path / "sweep_pareto.png").stat().st_size > 0
    assert (tmp_path / "sweep_placement.png").stat().st_size > 0


def test_sweep_reports_a_point_that_does_not_fit(tmp_path, capsys):
    assert main(["sweep", "--workload", "kimi-k2", "--batch", "1", "--placement", "local",
                 "--json", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s")]) == 1
    assert "FAIL: the MoE layer of kimi-k2 does not fit" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sweep", "--mesh", "2x2,2x3"])
    assert main(["sweep", "--workload", "tiny", "--layer", "9"]) == 2
    assert "layers 0..1, not 9" in capsys.readouterr().err


def test_sweep_refuses_a_point_before_building_it(tmp_path, monkeypatch, capsys):
    """A context the KV cache cannot hold fails the point at compile time: no build."""
    import sim.chip_run

    def no_build(*args, **kwargs):
        raise AssertionError("the point was simulated")

    monkeypatch.setattr(sim.chip_run, "simulate_layer", no_build)
    assert main(["sweep", "--workload", "tiny", "--no-moe", "--batch", "1", "--placement",
                 "local", "--context", "5000", "--json", str(tmp_path / "s.json"), "--plot",
                 str(tmp_path / "s")]) == 1
    assert "FAIL: a context of 5001 tokens does not fit the KV cache" in capsys.readouterr().out


def test_clock_line_says_which_figure_it_uses(monkeypatch):
    """The report's clock: the Fmax of the chip's tile when measured; else the slowest
    block measured alone, naming the blocks without a figure, or a tile of another size
    if that is lower (an estimate); else none."""
    import synth
    from cli.report import fmax_line

    measured: dict[str, dict] = {}
    monkeypatch.setattr(synth, "load_area", lambda design: measured.get(design))
    assert fmax_line(8) == (None, "not measured (run `make synth`)")
    measured["gemm_engine"] = {"ecp5_fmax_mhz": 69.6}
    measured["vector_unit"] = {"ecp5_fmax_mhz": 41.5}
    fmax, line = fmax_line(8)
    assert fmax == 41.5 and "upper bound" in line and "(vector_unit)" in line
    assert "not measured yet: tensor_core_n8, scratchpad" in line
    measured["tile_n4"] = {"ecp5_fmax_mhz": 33.8}
    fmax, line = fmax_line(8)
    assert fmax == 33.8 and "an estimate, the N = 4 tile placed whole (tile_n4)" in line
    assert "the slowest block measured alone: vector_unit, 41.5 MHz" in line
    assert fmax_line(4) == (33.8, "33.8 MHz (tile_n4, ECP5)")
    measured["tile"] = {"ecp5_fmax_mhz": 38.2}
    assert fmax_line(8) == (38.2, "38.2 MHz (tile, ECP5)")


def test_area_line_says_when_a_design_does_not_fit(monkeypatch):
    import synth
    from cli.report import area_line

    measured = {"tile": {"ecp5_lut4": 69557, "ecp5_ff": 39287, "ecp5_mult18": 133,
                         "ecp5_ebr": 126, "ecp5_fits": 0, "generic_cells": 323231}}
    monkeypatch.setattr(synth, "load_area", lambda design: measured.get(design))
    assert area_line("tile") == ("ECP5-85F: 69557 LUT4, 39287 FF, 133 MULT18X18D, 126 EBR, "
                                  "does not fit the 85F, so no place and route; 323231 "
                                  "generic cells")
    measured["tile"].update(ecp5_fits=1, ecp5_fmax_mhz=38.25)
    assert "Fmax 38.2 MHz" in area_line("tile")
    assert area_line("tile", " per tile").endswith("generic cells per tile")
    assert "not measured (run" in area_line("vector_unit")
    # what the area is of follows a measured area only
    assert area_line("vector_unit", " per tile").endswith("--only vector_unit'`)")


@pytest.mark.parametrize("argv", [
    ["sim", "--workload", "tiny"], ["agent", "--workload", "tiny"], ["gemm"],
    ["tile", "--workload", "tiny"], ["sweep", "--workload", "tiny"]])
def test_output_paths_are_checked_before_anything_is_built(tmp_path, capsys, argv):
    """A --json that is a folder, or under a file, is refused in one line before any
    build (these would otherwise fail after the whole run)."""
    (tmp_path / "file").write_text("")
    for bad, said in ((tmp_path, "is a folder, not a file"),
                      (tmp_path / "file" / "out.json", "is not a folder")):
        assert main([*argv, "--json", str(bad)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_dump_refuses_a_used_folder_unless_forced(tmp_path, capsys):
    """--dump into a folder holding an earlier run's files is refused (nothing deleted);
    --force empties it first; a file is no folder."""
    from argparse import Namespace

    from cli.options import check_output_paths

    used = tmp_path / "dump"
    used.mkdir()
    (used / "seq0").mkdir()
    (used / "run.json").write_text("{}")
    assert main(["sim", "--workload", "tiny", "--dump", str(used)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (used / "run.json").exists()
    assert main(["sim", "--workload", "tiny", "--dump", str(used / "run.json")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert check_output_paths(Namespace(dump=used, force=True)) is None
    assert used.is_dir() is False or not any(used.iterdir())
    assert check_output_paths(Namespace(dump=tmp_path / "new" / "dump", force=False)) is None


def test_an_unknown_option_prints_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        main(["sim", "--no-such-option"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: serrano sim") and "--no-such-option" in err


def test_a_failed_write_is_said_as_such(tmp_path, capsys):
    from argparse import Namespace

    from cli.report import write_json

    (tmp_path / "file").write_text("")
    args = Namespace(command="sim", json=tmp_path / "file" / "out.json")
    assert write_json(args, {"passed": True}) is False
    assert "the run's figures were not written" in capsys.readouterr().err
