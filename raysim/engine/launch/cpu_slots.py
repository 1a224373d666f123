"""Machine-wide CPU slots, so that concurrent ``raysim`` invocations on one machine share its
CPUs instead of each starting a local Ray that sees all of them (and oversubscribing them).

Each of the machine's CPUs is a lock file; an invocation that starts a local Ray takes as many
free slots as it can (at most the machine's CPUs), starts Ray with that many CPUs, and holds the
locks for its lifetime. The operating system releases ``flock`` locks when a process ends in
any way, SIGKILL included, so a killed invocation never leaves slots taken. An invocation that
finds fewer free slots than its runs need waits, with a notice, until another one finishes.
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
system's temporary folder)."""


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
        self.directory = directory or default_directory()
        self._held: list[int] = []
        """Open descriptors of the lock files whose locks this process holds."""

    @property
    def held(self) -> int:
        return len(self._held)

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
                    f"Another raysim invocation on this machine holds its CPUs: waiting for "
                    f"{needed} of the {self.total} to be free (Ctrl-C stops; results of runs "
                    "already written are kept).")
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


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
