"""Start an invocation's runs as they fit, follow their progress, restart a driver that died.

:func:`follow` starts at most ``limit`` groups of runs at a time, in order, shows one progress
bar per run (round, status, latest accuracy, ETA) and collects each run's end: its final rows,
or the error and exit code that say why it did not reach them. Ctrl-C and SIGTERM stop the
runs that are going at their next round boundary and start no more.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import ray

from raysim.engine.interrupt import STOP
from raysim.engine.pool.seed_groups import RunKey
from raysim.engine.progress import RunProgress, labels_of
from raysim.errors import RaysimError

MAX_DRIVER_RESTARTS = 3
"""How often a run's driver process may die (and be replaced by one that resumes from the
run's checkpoint) before the run counts as failed."""

Ending = tuple[dict[str, Any] | None, str | None, int]
"""How a run ended: its final row (None if it failed), the error, the CLI's exit code."""


class RunHandle(Protocol):
    """A started run's driver, as the loop asks it for progress and to stop."""

    def query(self) -> Any:
        """A reference to the run's progress."""

    def stop(self) -> Any:
        """Ask the run to stop at its next round boundary."""


Start = Callable[[RunKey], tuple[RunHandle, Any]]
"""Starts a run (again, after its driver died); returns its handle and the driver's future."""
Finish = Callable[[RunKey, bool], None]
"""Called when a run ended, with whether it succeeded."""


class _Follower:
    """The state of :func:`follow`'s loop."""

    def __init__(self, queue: list[RunKey], start: Start, finish: Finish, limit: int,
                 rounds: dict[RunKey, int], show: bool, group_of: dict[RunKey, RunKey]):
        self.start, self.finish, self.limit, self.group_of = start, finish, limit, group_of
        self.view = RunProgress(labels_of(queue), dict(rounds), show)
        self.waiting = list(queue)
        self.active: dict[RunKey, tuple[RunHandle, Any]] = {}
        self.started_at: dict[RunKey, float] = {}
        self.results: dict[RunKey, Ending] = {}
        self.restarts: dict[RunKey, int] = {}
        self.stopping = False

    def may_start(self, key: RunKey) -> bool:
        """Whether ``key`` may start now: its group is going, or another group fits."""
        groups = {self.group_of.get(k, k) for k in self.active}
        return self.group_of.get(key, key) in groups or len(groups) < self.limit

    def step(self) -> None:
        """One turn: honour a stop request, start what fits, take in what ended."""
        if STOP.requested and not self.stopping:  # SIGINT/SIGTERM: stop at round boundaries
            self.stopping = True
            self.waiting.clear()  # not started: `--resume` starts them
            for handle, _ in self.active.values():
                handle.stop()
        while self.waiting and self.may_start(self.waiting[0]):
            key = self.waiting.pop(0)
            self.started_at[key] = time.monotonic()
            self.active[key] = self.start(key)
        ready, _ = ray.wait([future for _, future in self.active.values()], timeout=0.5,
                            num_returns=len(self.active))
        for key, (handle, future) in list(self.active.items()):
            with contextlib.suppress(ray.exceptions.RayError):
                self.view.update(key, ray.get(handle.query(), timeout=5))
            if future in ready:
                self.ended(key, future)

    def ended(self, key: RunKey, future: Any) -> None:
        """Run ``key``'s driver returned: record how it ended, or restart a lost driver."""
        ending = self.outcome(key, future)
        if ending is None:  # a new driver resumes from the run's checkpoint
            self.restarts[key] = self.restarts.get(key, 0) + 1
            self.active[key] = self.start(key)
            return
        self.results[key] = ending
        self.finish(key, ending[1] is None)
        final = ending[0] or {}
        stop_reason = final.get("stop_reason")
        self.view.finished(key, ending[1], time.monotonic() - self.started_at[key],
                           interrupted=final.get("interrupted"),
                           stopped=stop_reason if isinstance(stop_reason, str) else None)
        del self.active[key]

    def outcome(self, key: RunKey, future: Any) -> Ending | None:
        """How the run ended (None: its driver's process died and it may restart)."""
        try:
            return ray.get(future), None, 0
        except ray.exceptions.RayActorError as error:  # the driver's process died
            if error.actor_init_failed:  # a bug or bad input, not a lost process
                return None, f"the driver could not start ({first_line(error)}){JOINED_HINT}", 1
            if self.restarts.get(key, 0) >= MAX_DRIVER_RESTARTS:
                return None, (f"the driver died {MAX_DRIVER_RESTARTS + 1} times (last: "
                              f"{first_line(error)}){JOINED_HINT}"), 1
            return None
        except ray.exceptions.RayError as error:
            cause = getattr(error, "cause", None) or error
            code = cause.exit_code if isinstance(cause, RaysimError) else 1
            return None, f"{type(cause).__name__}: {cause}", code


JOINED_HINT = (". The rows written so far are kept. Where the run joined a Ray cluster "
               "(engine.address, RAY_ADDRESS, or a `ray start` cluster recorded on this "
               "machine, which another program may have started), that cluster may lack "
               "raysim's environment or memory: run on a Ray of this invocation's own with "
               "`--set engine.address=local`, then continue with `--resume`.")
"""What a run whose driver could not run is told (its cause is most often the cluster's)."""


def first_line(error: BaseException) -> str:
    """An error's first non-empty line (Ray's errors carry their internals after it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(error).__name__


def follow(queue: list[RunKey], start: Start, finish: Finish, limit: int,
           rounds: dict[RunKey, int], show: bool, group_of: dict[RunKey, RunKey] | None = None
           ) -> dict[RunKey, Ending]:
    """Start runs (at most ``limit`` groups at a time, in order) and show live progress: one
    bar per run with round, status, latest accuracy and ETA. Runs of one group (a seed group on
    shared workers, ``group_of``) count once and start together; other runs are groups of
    their own. A driver whose process dies is replaced by one that resumes from the run's
    checkpoint. ``start(key)`` returns (handle, future), ``handle.query()`` a reference
    to the run's progress; ``finish(key, succeeded)`` is called when a run ends. Returns
    (final row, error, exit code) per run."""
    follower = _Follower(queue, start, finish, limit, rounds, show, group_of or {})
    while follower.waiting or follower.active:
        follower.step()
    follower.view.close()
    return follower.results
