"""Machine-wide CPU slots, so that concurrent ``raysim`` invocations on one machine share its
CPUs instead of each starting a local Ray that sees all of them (and oversubscribing them).

Each of the machine's CPUs is a lock file; an invocation that starts a local Ray takes as many
free slots as it can (at most the machine's CPUs), starts Ray with that many CPUs, and holds the
locks for its lifetime. The operating system releases ``flock`` locks when a process ends in
any way, SIGKILL included, so a killed invocation never leaves slots taken. An invocation that
finds fewer free slots than its runs need waits, with a notice naming the processes that hold
them, until another one finishes. ``RAYSIM_CPU_SLOTS=off`` opts out: the invocation takes every
CPU without waiting, sharing them with whatever else runs.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from raysim.engine.launch.private_state import open_private_file, private_directory

VARIABLE = "RAYSIM_CPU_SLOTS"
"""The environment variable that moves the slot files (default: a per-user directory in the
system's temporary folder), or turns the slots off (``off``)."""

OFF = "off"
"""``RAYSIM_CPU_SLOTS=off``: no slots; every invocation takes all CPUs."""


def slots_off() -> bool:
    """Whether the user opted out of sharing the machine's CPUs between invocations."""
    return os.environ.get(VARIABLE, "").strip().lower() == OFF


def default_directory() -> Path:
    """Where the slot files live (per user; ``RAYSIM_CPU_SLOTS`` overrides it)."""
    override = os.environ.get(VARIABLE)
    if override:
        return Path(override)
    return Path(tempfile.gettempdir()) / f"raysim-cpu-slots-{os.getuid()}"


class CpuSlots:
    """The CPU slots this process holds (released when it ends or on :meth:`release`)."""

    def __init__(self, total: int, directory: Path | None = None):
        self.total = total
        self._off = directory is None and slots_off()
        """The user opted out (``RAYSIM_CPU_SLOTS=off``): every CPU, no lock files."""
        self.directory = directory or default_directory()
        self._held: list[int] = []
        """Open descriptors of the lock files whose locks this process holds."""

    @property
    def held(self) -> int:
        return self.total if self._off else len(self._held)

    def _grab_free(self, wanted: int) -> None:
        private_directory(self.directory, VARIABLE)
        for slot in range(self.total):
            if len(self._held) >= wanted:
                return
            descriptor = open_private_file(self.directory / f"cpu-{slot}.lock", VARIABLE)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(descriptor)
                continue
            self._held.append(descriptor)

    def acquire(self, needed: int, wanted: int | None = None, *, timeout: float | None = None,
                notify: Callable[[str], None] | None = None, poll_seconds: float = 1.0) -> int:
        """Take up to ``wanted`` free slots (default: all), waiting until at least ``needed``
        are free; returns how many are held. ``timeout``: give up after this many seconds
        (TimeoutError). ``notify`` receives one line when this has to wait."""
        if self._off:
            return self.total
        wanted = self.total if wanted is None else min(wanted, self.total)
        needed = min(max(needed, 1), wanted)
        deadline = None if timeout is None else time.monotonic() + timeout
        told = False
        while True:
            self._grab_free(wanted)
            if self.held >= needed:
                return self.held
            self.release()  # never sit on a partial set while waiting
            if not told:
                (notify or _to_stderr)(
                    f"{holders_text(self.directory)} its CPUs: waiting for {needed} of the "
                    f"{self.total} to be free (Ctrl-C stops; results of runs already written are "
                    f"kept). To run now beside it instead, sharing the CPUs (each slower), set "
                    f"{VARIABLE}={OFF}.")
                told = True
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{needed} CPU slots did not become free within {timeout} s")
            time.sleep(poll_seconds)

    def file_descriptors(self) -> tuple[int, ...]:
        """The held slots' open lock files: a child process given them (``pass_fds``) keeps
        the slots held after this process releases its own copies."""
        return tuple(self._held)

    def release(self) -> None:
        for descriptor in self._held:
            os.close(descriptor)  # closing drops the lock
        self._held = []


def holders(directory: Path) -> dict[int, int]:
    """PID -> how many of the slot files in ``directory`` that process holds locked (from
    Linux's ``/proc/locks``; empty elsewhere)."""
    inodes = {}
    for path in directory.glob("cpu-*.lock"):
        try:
            info = path.lstat()
        except OSError:
            continue
        inodes[(os.major(info.st_dev), os.minor(info.st_dev), info.st_ino)] = path
    held: dict[int, int] = {}
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return held
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
            continue
        try:
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:
            continue
        if key in inodes:
            held[pid] = held.get(pid, 0) + 1
    return held


def holders_text(directory: Path) -> str:
    """Who holds the slots, for the waiting notice: the processes with their commands."""
    found = holders(directory)
    if not found:
        return "Another raysim invocation on this machine holds"
    described = []
    for pid, count in sorted(found.items()):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            command = "?"
        described.append(f"pid {pid} ({command[:120]}) holds {count}")
    return "On this machine " + "; ".join(described) + " of"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
