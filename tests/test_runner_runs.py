"""Run directories under sim_build/<build>/runs: reused by the same run, pruned to a few."""

from __future__ import annotations

import os

from sim.runner import KEEP_RUNS, PRUNE_AFTER_S, RUNNING, prune_runs, run_name


def test_the_same_run_reuses_its_directory():
    """A fresh progress file per run does not make a new directory; what the run computes
    does."""
    a = run_name("chip_layer", "tag", 1, {"batch": 2, "progress": "/tmp/serrano-a"}, 0)
    b = run_name("chip_layer", "tag", 1, {"batch": 2, "progress": "/tmp/serrano-b"}, 0)
    c = run_name("chip_layer", "tag", 1, {"batch": 3, "progress": "/tmp/serrano-a"}, 0)
    assert a == b != c
    assert run_name("chip_layer", "tag", 2, {"batch": 2}, 0) != a


def _runs(root, count, now, age):
    made = []
    for i in range(count):
        d = root / f"run{i:02d}"
        d.mkdir(parents=True)
        t = now - age - 10 * (count - i)  # run00 the oldest
        os.utime(d, (t, t))
        made.append(d)
    return made


def test_old_run_directories_are_pruned(tmp_path):
    """Past the newest KEEP_RUNS (the starting run's own counted), old directories go."""
    now = 1_000_000.0
    made = _runs(tmp_path, KEEP_RUNS + 4, now, PRUNE_AFTER_S * 2)
    current = made[0]  # the run starting now keeps its directory whatever its age
    removed = prune_runs(tmp_path, keep=current, now=now)
    assert sorted(removed) == made[1:5]
    assert current.exists() and all(d.exists() for d in made[5:])
    assert len(list(tmp_path.iterdir())) == KEEP_RUNS


def test_recently_touched_run_directories_stay(tmp_path):
    """Another process may be using a directory it touched lately: it is not removed,
    however many there are."""
    now = 1_000_000.0
    made = _runs(tmp_path, KEEP_RUNS + 4, now, 0)
    assert prune_runs(tmp_path, keep=made[-1], now=now) == []
    assert all(d.exists() for d in made)


def test_a_directory_a_live_process_runs_in_stays(tmp_path):
    """A long simulation may not touch its directory for a while: its running marker
    (a live process's id) keeps it; a dead process's marker does not."""
    now = 1_000_000.0
    made = _runs(tmp_path, KEEP_RUNS + 3, now, PRUNE_AFTER_S * 2)
    for d, marker in ((made[1], str(os.getpid())), (made[2], "0x")):  # "0x": no pid
        mtime = d.stat().st_mtime
        (d / RUNNING).write_text(marker)
        os.utime(d, (mtime, mtime))
    removed = prune_runs(tmp_path, keep=made[-1], now=now)
    assert made[1].exists() and made[1] not in removed
    assert sorted(removed) == [made[0], made[2]]


def test_a_directory_removed_while_pruning_is_passed_over(tmp_path, monkeypatch):
    """Two runs pruning at once: a directory the other removed between the listing and
    its stat is skipped, and the rest are pruned as before."""
    now = 1_000_000.0
    made = _runs(tmp_path, KEEP_RUNS + 4, now, PRUNE_AFTER_S * 2)
    gone, seen = made[2], []
    stat = type(gone).stat

    def vanishing(path, *args, **kwargs):
        if path == gone:  # there for the listing's is_dir, gone by its stat
            seen.append(path)
            if len(seen) > 1:
                raise FileNotFoundError(path)
        return stat(path, *args, **kwargs)

    monkeypatch.setattr(type(gone), "stat", vanishing)
    removed = prune_runs(tmp_path, keep=made[0], now=now)
    assert len(seen) == 2  # the stat after is_dir found it gone
    assert sorted(removed) == [made[1], made[3], made[4]]
