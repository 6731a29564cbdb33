"""The processes a command started: find them and end them (``serrano``'s SIGINT and
SIGTERM, :func:`cli.main.entry`). Linux only: read from /proc."""

from __future__ import annotations

import contextlib
import os
import signal
import time

__all__ = ["alive", "descendants", "stop_descendants"]


def descendants(pid: int) -> list[int]:
    """Every process started, directly or not, by ``pid`` (from /proc; children first)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as children:
                kids = [int(c) for c in children.read().split()]
        except OSError:
            continue
        for kid in kids:
            found += descendants(kid) + [kid]
    return found


def stop_descendants(grace_s: float = 2.0) -> None:
    """SIGTERM every process this one started (builds, compilers, simulators), then
    SIGKILL those still there after ``grace_s``."""
    victims = descendants(os.getpid())
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(pid) for pid in victims):
        time.sleep(0.05)
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
