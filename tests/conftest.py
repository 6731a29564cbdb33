"""Suite-wide pytest hooks: order and group the tests for 2 pytest-xdist workers."""

from __future__ import annotations

import pytest

#: Tests that start with a long simulator build, longest first. Collected first, so
#: pytest-xdist hands them to different workers at once and the rest of the suite fills
#: in around them (`make test` runs on 2 workers).
FIRST = (
    "tests/test_chip.py::test_decoder_layer",
    "tests/test_tile.py::test_gpt_oss",
    "tests/test_tile.py::test_tiny",
    "tests/test_noc_traffic.py::test_every_pattern",
)

#: Tests sharing one slow simulator build run on one worker (``--dist loadgroup``), so
#: that the other worker does not sit idle on the build's lock while it compiles.
GROUPS = {
    "chip-tiny": ("tests/test_chip.py::test_d", "tests/test_cli.py::test_sim_runs",
                  "tests/test_cli.py::test_agent_loop_reports",
                  "tests/test_cli.py::test_sweep_writes"),
    "tile-tiny": ("tests/test_tile.py::test_tiny", "tests/test_tile.py::test_faults",
                  "tests/test_tile.py::test_network", "tests/test_cli.py::test_tile_runs"),
    "traffic-k3": ("tests/test_noc_traffic.py::test_every_pattern",
                   "tests/test_noc_traffic.py::test_zero_load"),
}


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        for index, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return index
        return len(FIRST)

    items.sort(key=rank)  # stable: everything else keeps its order
    for item in items:
        for group, prefixes in GROUPS.items():
            if item.nodeid.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))
