"""The pool keeper of a warm cluster: idle worker and driver actors kept between invocations.

On a warm cluster (:mod:`raysim.engine.launch.warm_cluster`) the actor pool of an invocation
(:mod:`raysim.engine.pool.shared_actors`) creates its actors detached, so they outlive the invocation. When
the invocation ends it hands its idle actors to the keeper (a detached actor named
``raysim-pool-keeper``); the next invocation takes them over at its start and its first run
borrows workers whose processes have long imported torch and raysim.

Rules that keep this safe:

- Actors are kept per code fingerprint (raysim's source, the Python and torch versions): an
  invocation of changed code never gets an actor running the old code; those are killed.
- An invocation that takes over actors is their *holder*; the keeper also learns of the actors
  it creates. When a holder's process is gone (killed before it could hand anything back) its
  actors are killed at the keeper's next call, so their CPUs return to the cluster.
- Idle actors reserve their CPUs. When an invocation hands actors back while another one is
  running, that one may be waiting for those CPUs: they are killed instead of kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import ray

from raysim.engine.launch.watchdog import start_time

KEEPER_NAME = "raysim-pool-keeper"

Holder = tuple[int, int | None]
"""An invocation: its process id and the process's start time (a reused pid is another)."""


def this_holder() -> Holder:
    """This process as a holder of pooled actors."""
    return os.getpid(), start_time(os.getpid())


@cache
def code_fingerprint() -> str:
    """What a pooled actor's process must share with the invocation that borrows it: raysim's
    source files, the Python executable and torch's version."""
    digest = hashlib.blake2b(digest_size=12)
    package = Path(__file__).resolve().parents[1]
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode())
        digest.update(path.read_bytes())
    digest.update(sys.executable.encode())
    with contextlib.suppress(PackageNotFoundError):
        digest.update(version("torch").encode())
    return digest.hexdigest()


class PoolKeeper:
    """Idle pooled actors of a warm cluster and who holds the others (see the module)."""

    def __init__(self) -> None:
        self._idle: list[tuple[str, Any, Any]] = []  # (fingerprint, shape or None, handle)
        self._holders: dict[Holder, list[Any]] = {}

    def hand_over(self, holder: Holder, fingerprint: str) -> list[tuple[Any, Any]]:
        """Every idle actor of ``fingerprint`` as (worker shape, or None for a driver host,
        handle), now held by ``holder``; idle actors of other code are killed."""
        self._reap()
        taken = [(shape, handle) for kept, shape, handle in self._idle if kept == fingerprint]
        for kept, _, handle in self._idle:
            if kept != fingerprint:
                ray.kill(handle)
        self._idle = []
        self._holders.setdefault(holder, []).extend(handle for _, handle in taken)
        return taken

    def register(self, holder: Holder, handles: list[Any]) -> None:
        """Actors ``holder`` created (killed with the others if its process dies)."""
        self._holders.setdefault(holder, []).extend(handles)

    def take_back(self, holder: Holder, fingerprint: str, idle: list[tuple[Any, Any]]) -> int:
        """``holder`` ended, handing back its ``idle`` actors (it killed the others); returns
        how many are kept (none while another invocation runs: it may need their CPUs)."""
        self._holders.pop(holder, None)
        self._reap()
        if self._holders:
            for _, handle in idle:
                ray.kill(handle)
            return 0
        self._idle.extend((fingerprint, shape, handle) for shape, handle in idle)
        return len(idle)

    def idle(self) -> int:
        """How many actors wait idle."""
        return len(self._idle)

    def _reap(self) -> None:
        """Kill the actors of holders whose process is gone."""
        for holder in [h for h in self._holders if start_time(h[0]) != h[1]]:
            for handle in self._holders.pop(holder):
                with contextlib.suppress(Exception):
                    ray.kill(handle)


def keeper(namespace: str) -> Any:
    """The cluster's keeper (created on first use; it lives as long as the cluster)."""
    return ray.remote(PoolKeeper).options(
        name=KEEPER_NAME, namespace=namespace, lifetime="detached", get_if_exists=True,
        num_cpus=0).remote()
