"""The chip run's figures from round records: the roofline's bounds and the ratio, the
access-energy model."""

import pytest

from rtl.tile import ACC_READ_PORTS
from sim.chip_run import chip_config, chip_figures, round_bounds, round_energy
from spec import energy


def _record(phase, cycles, *, macs, beats, reads, tokens=None):
    tiles = {t: {"cycles": cycles, "tc_beats": b, "wait": 0, "macs": 0, "vec": 0,
                 "gemm_vec": 0, "spad": 0, "fetches": 0, "acc_reads": 0, "acc_writes": 0}
             for t, b in enumerate(beats)}
    return {"phase": phase, "contexts": [8], "cycles": cycles, "tiles": tiles,
            "outputs": 1, "macs": macs, "network_words": 0, "flits": 0, "link_flits": 0,
            "wall_s": 1.0, "channel_reads": reads,
            "tokens": tokens or 1,
            **({"macs_sparse": macs // 2} if tokens else {})}


def test_round_bounds_are_the_rounds_work_at_each_resources_rate():
    config = chip_config("gpt-oss", k=2, n=8)  # 2 channels, 7/8 byte a cycle in all
    record = _record("decode", 10_000, macs=4 * 64 * 100, beats=[10, 700, 3, 0],
                     reads=[70, 35])
    record["tiles"][2]["macs"] = 64 * 90 + 1
    record["router_link_flits"] = [5, 301, 0, 12]  # 2 links each on 2 x 2
    assert round_bounds(record, config) == {
        "compute": 100,             # 25,600 MACs at 4 x 64 a cycle
        "tile_compute": 91,         # the busiest tile's MACs at 64 a cycle
        "memory": 70 * 8 * 16 // 7,  # the busiest channel's bytes at 7/16 byte a cycle
        "streaming": 700, "injection": 70,
        "network": 151}             # 301 flits over a router's 2 links
    # A MoE round's useful work is its sparse-dispatch MACs, not what was executed.
    moe = _record("decode-moe", 10_000, macs=4 * 64 * 100, beats=[1], reads=[0], tokens=2)
    assert round_bounds(moe, config)["compute"] == 50


def test_mesh_links_count_each_routers_neighbours():
    from sim.chip_run import mesh_links

    assert mesh_links(1) == [0]
    assert mesh_links(3) == [2, 3, 2, 3, 4, 3, 2, 3, 2]


def test_phase_bounds_add_over_rounds_and_the_ratio_takes_the_largest():
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = [_record("prefill", 2_000, macs=4 * 64 * 1_000, beats=[900], reads=[0, 0]),
              _record("prefill-moe", 3_000, macs=4 * 64 * 200, beats=[100], reads=[7, 0],
                      tokens=4),
              _record("decode", 500, macs=0, beats=[400], reads=[0, 0]),
              _record("decode", 500, macs=0, beats=[200], reads=[0, 0])]
    rounds[-1]["contexts"] = [9]  # a second decode step
    f = chip_figures({"rounds": rounds}, config)
    assert f["chip__prefill__compute_bound_cycles"] == 1_000 + 100
    assert f["chip__prefill__memory_bound_cycles"] == 128
    assert f["chip__prefill__streaming_bound_cycles"] == 1_000
    assert f["chip__prefill__largest_bound"] == "compute"
    assert f["chip__prefill__memory_bound_ratio"] == round(5_000 / 1_100, 3)
    # The MoE round: 128 memory cycles against 100 of compute at 4 tokens.
    assert f["chip__prefill__crossover_tokens"] == round(4 * 128 / 100)
    # A later round of the step's chain that loads nothing still adds its tokens and
    # compute to the step's.
    rounds.insert(2, _record("prefill-moe", 900, macs=4 * 64 * 200, beats=[100],
                             reads=[0, 0], tokens=8))
    f = chip_figures({"rounds": rounds}, config)
    assert f["chip__prefill__crossover_tokens"] == round(12 * 128 / 200) == 8
    assert f["chip__decode__streaming_bound_cycles"] == 300  # per step
    assert f["chip__decode__largest_bound"] == "streaming"
    assert f["chip__decode__memory_bound_ratio"] == round(500 / 300, 3)


def test_round_energy_is_each_counter_times_its_energy_per_access():
    config = chip_config("gpt-oss", k=2, n=8)  # 64-bit words, flits of 64 + 36 bits
    record = _record("decode", 1_000, macs=0, beats=[0, 0], reads=[3, 1])
    record["tiles"][0] |= {"macs": 1_000, "vec": 10, "gemm_vec": 5, "spad": 40}
    record["tiles"][1] |= {"spad": 60, "fetches": 9, "acc_reads": 12, "acc_writes": 5}
    record |= {"flits": 7, "link_flits": 11}
    e = round_energy(record, config)
    assert e["compute"] == pytest.approx(1_000 * energy.MAC_PJ + 15 * 8 * energy.LANE_PJ)
    # An accumulator entry is 8 lanes of 48 bits; a write goes into every read port's copy.
    assert len(ACC_READ_PORTS) == energy.ACC_COPIES
    assert e["sram"] == pytest.approx(100 * energy.SRAM_PJ_PER_64_BITS + 9 * energy.FETCH_PJ
                                      + (12 + 4 * 5) * 6 * energy.ACC_PJ_PER_64_BITS)
    assert pytest.approx(203 / 64 * energy.SRAM_PJ_PER_64_BITS) == energy.FETCH_PJ
    assert e["memory"] == pytest.approx(4 * 8 * energy.MEMORY_PJ_PER_BYTE)
    flit = e["network"] / ((7 + 11) * energy.ROUTER_PJ_PER_64_BITS / 64
                           + 11 * energy.LINK_PJ_PER_BIT)
    assert 64 < flit < 128  # the flit's width: a word and its header fields
    assert set(e) == set(energy.CLASSES)


def test_host_bytes_and_cycles_are_per_step():
    """Program words are 32 bytes (256-bit instructions), scratchpad, KV and output words
    N (the attention outputs written back among the scratchpad words, the set-up KV
    appends among the KV appends); the host port's cycles (loads and
    read-backs) are per step, added to the step's cycles only in ``..._with_host``."""
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = [_record("decode", 500, macs=0, beats=[1], reads=[0, 0]) for _ in range(2)]
    rounds[1]["contexts"] = [9]  # a second decode step
    for r in rounds:
        r["host_words"] = {"program": 10, "scratchpad": 100, "attention": 0, "kv": 4,
                           "kv_setup": 0, "output": 6}
        r["host_cycles"] = {"load": 110, "read": 12}
    rounds[0]["host_words"]["kv_setup"] = 3  # KV of a context the run starts from
    rounds[1]["host_words"]["attention"] = 50  # attention outputs written back
    f = chip_figures({"rounds": rounds}, config)
    assert [f[f"chip__decode__host_{kind}_bytes"]
            for kind in ("program", "scratchpad", "attention", "kv", "kv_setup", "output")
            ] == [320, 800, 200, 32, 12, 48]
    assert f["chip__decode__host_bytes"] == 1152  # written (the parts among their kinds)
    assert f["chip__decode__host_cycles"] == 122
    assert f["chip__decode__cycles_per_token"] == 500
    assert f["chip__decode__cycles_per_token_with_host"] == 622
    # Their energy, beside the rounds' (none here): written and read bytes at the link's.
    assert f["chip__decode__energy_pj"] == 0
    assert f["chip__decode__energy_host_pj"] == round((1152 + 48) * energy.HOST_PJ_PER_BYTE)
    assert f["chip__decode__energy_per_token_with_host_pj"] == round(
        (1152 + 48) * energy.HOST_PJ_PER_BYTE)  # one token a step


def test_phase_energy_is_per_step_and_per_token():
    config = chip_config("gpt-oss", k=2, n=8)
    rounds = [_record("decode", 500, macs=0, beats=[0], reads=[10, 0], tokens=2),
              _record("decode", 500, macs=0, beats=[0], reads=[30, 0], tokens=2)]
    rounds[-1]["contexts"] = [9]
    rounds[0]["tiles"][0] |= {"acc_reads": 3, "acc_writes": 1}  # 7 entry accesses
    rounds[1]["tiles"][0] |= {"acc_reads": 10, "acc_writes": 2}  # 18
    f = chip_figures({"rounds": rounds}, config)
    memory = 20 * 8 * energy.MEMORY_PJ_PER_BYTE  # the mean of the two steps
    accumulator = 12.5 * energy.acc_entry_pj(8)
    assert f["chip__decode__energy_memory_pj"] == round(memory)
    assert f["chip__decode__energy_accumulator_pj"] == round(accumulator)
    assert f["chip__decode__energy_sram_pj"] == round(accumulator)
    assert f["chip__decode__energy_pj"] == round(memory + accumulator)
    assert f["chip__decode__energy_per_token_pj"] == round((memory + accumulator) / 2)
