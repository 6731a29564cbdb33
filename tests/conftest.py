"""Suite-wide pytest hooks."""

from __future__ import annotations

#: Tests that start with a long simulator build, longest first. Collected first, so
#: pytest-xdist hands them to different workers at once and the rest of the suite fills
#: in around them (`make test` runs on 2 workers).
FIRST = (
    "tests/test_chip.py::test_decoder_layer",
    "tests/test_tile.py::test_gpt_oss",
    "tests/test_tile.py::test_tiny",
    "tests/test_noc_traffic.py::test_every_pattern",
)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        for index, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return index
        return len(FIRST)

    items.sort(key=rank)  # stable: everything else keeps its order
