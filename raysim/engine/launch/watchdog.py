"""A watchdog that outlives a SIGKILLed ``raysim`` process and removes what its local Ray left.

When ``raysim run`` dies without running its exit handlers (SIGKILL, OOM killer), Ray's GCS and
raylet go down but processes they started (the dashboard and runtime-env agents) are reparented
to init and stay for minutes. ``start_watchdog`` spawns a small process in its own session that
follows the raysim process: every second it records the raysim process's descendants (with
their start times, so that a reused PID is never touched); once the raysim process is gone it
SIGKILLs every recorded process still alive, and exits. Linux only (it reads /proc); elsewhere
it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PROC = Path("/proc")


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (None: no such process)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> dict[int, int]:
    """PID -> start time of every live descendant of ``pid``."""
    tree, found, todo = _children(), {}, [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            started = start_time(child)
            if started is not None and child not in found:
                found[child] = started
                todo.append(child)
    return found


def watch(pid: int, started: int, poll_seconds: float = 1.0) -> None:
    """Follow process ``pid``; when it is gone, SIGKILL the descendants it ever had."""
    known: dict[int, int] = {}
    while start_time(pid) == started:
        known.update(descendants(pid))
        time.sleep(poll_seconds)
    known.pop(os.getpid(), None)
    for child, child_started in known.items():
        if start_time(child) == child_started:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)


_WATCHDOGS: dict[int, subprocess.Popen] = {}
"""The watchdog of each process followed (one is enough however often Ray restarts)."""


def start_watchdog(pid: int | None = None) -> subprocess.Popen | None:
    """Spawn the watchdog for process ``pid`` (default: this one), unless one follows it
    already; None where /proc is missing."""
    followed = os.getpid() if pid is None else pid
    running = _WATCHDOGS.get(followed)
    if running is not None and running.poll() is None:
        return running
    started = start_time(followed) if PROC.is_dir() else None
    if started is None:
        return None
    _WATCHDOGS[followed] = subprocess.Popen(
        [sys.executable, "-m", "raysim.engine.launch.watchdog", str(followed), str(started)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    return _WATCHDOGS[followed]


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
