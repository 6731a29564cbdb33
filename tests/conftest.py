"""Suite-wide pytest hooks: the ``seed`` fixture and its regression options, shards, and the
order and groups of the tests for 2 pytest-xdist workers.

A test marked ``nightly`` (slow, and covered in part by quicker ones) runs only with
``--nightly``, which ``make regress`` passes.

A test that takes the ``seed`` fixture is a *random test*: it derives every random choice
(traffic, stalls, data) from it. ``make test`` runs each once with ``seed == 0``, the
suite's fixed seed; ``make regress`` (:mod:`verif.regress`) passes ``--seeds N
--seed-base B`` and runs it for seeds B … B+N-1 (node ids ``test[s7]``), and ``--shard
i/k`` keeps every k-th test of the collection order, starting at the i-th.
"""

from __future__ import annotations

import os

import pytest

from sim import coverage
from verif.regress import parse_shard

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


def pytest_addoption(parser):
    group = parser.getgroup("serrano", "serrano regression options (make regress)")
    group.addoption("--seeds", type=int, default=0,
                    help="run every random test (the ones taking `seed`) for this many seeds")
    group.addoption("--seed-base", type=int, default=0, help="first seed of --seeds")
    group.addoption("--shard", default="1/1", help="run shard i of k (i/k, 1-based) of the tests")
    group.addoption("--nightly", action="store_true",
                    help="also run the tests marked nightly (make regress does)")


def pytest_configure(config):
    config.addinivalue_line("markers", "seeded: a random test, run over seeds by make regress")
    config.addinivalue_line("markers", "nightly: a slow test only make regress (--nightly) runs")
    if config.getoption("seeds") < 0:
        raise pytest.UsageError("--seeds must be >= 0")
    _shard(config)


def _shard(config) -> tuple[int, int]:
    try:
        return parse_shard(config.getoption("shard"))
    except ValueError as why:
        raise pytest.UsageError(str(why)) from None


def pytest_generate_tests(metafunc):
    if "seed" not in metafunc.fixturenames:
        return
    count, base = metafunc.config.getoption("seeds"), metafunc.config.getoption("seed_base")
    if count:
        seeds = range(base, base + count)
        metafunc.parametrize("seed", seeds, ids=[f"s{s}" for s in seeds])


@pytest.fixture(scope="session")
def tiny():
    """The tiny workload's tensors (``golden.workloads.generate``), shared read-only."""
    from golden.workloads import generate

    return generate("tiny")


@pytest.fixture(scope="session")
def gpt_oss():
    """The gpt-oss workload's tensors, shared read-only."""
    from golden.workloads import generate

    return generate("gpt-oss")


@pytest.fixture
def seed() -> int:
    """The suite's fixed seed; ``--seeds N`` parametrizes it instead."""
    return 0


def pytest_sessionfinish(session, exitstatus):
    """Export the coverage this process sampled (only under ``make regress``)."""
    coverage.export(worker=os.environ.get("PYTEST_XDIST_WORKER", "main"))


def pytest_itemcollected(item):
    """Mark the random tests (so that ``-m seeded`` selects them)."""
    if "seed" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.seeded)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        for index, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return index
        return len(FIRST)

    if not config.getoption("nightly"):
        nightly = [item for item in items if item.get_closest_marker("nightly")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("nightly")]
    index, count = _shard(config)
    if count > 1:
        keep = items[index - 1::count]
        kept = set(keep)
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = keep
    items.sort(key=rank)  # stable: everything else keeps its order
    for item in items:
        for group, prefixes in GROUPS.items():
            if item.nodeid.startswith(prefixes):
                item.add_marker(pytest.mark.xdist_group(group))
