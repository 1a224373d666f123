"""The runs of one driver host take turns (a seed group's drivers share one process: see
:mod:`raysim.engine.pool.seed_groups`).

A run's driver thread holds the process's turn for all its work and lets it go only while it
waits for Ray (:func:`get`, :func:`released`): the runs' Python work never interleaves, so
sections that seed torch's global generator stay whole, and one run's wait is another's turn.
A host with one run pays nothing (the turn is never contended).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

_turn = threading.Lock()
_held = threading.local()


@contextmanager
def taking_turns() -> Iterator[None]:
    """Run the calling thread's work in turns with the other runs of this process."""
    _turn.acquire()
    _held.holding = True
    try:
        yield
    finally:
        _held.holding = False
        _turn.release()


@contextmanager
def released() -> Iterator[None]:
    """Let the other runs go while this thread waits (a no-op outside :func:`taking_turns`)."""
    if not getattr(_held, "holding", False):
        yield
        return
    _held.holding = False
    _turn.release()
    try:
        yield
    finally:
        _turn.acquire()
        _held.holding = True


def get(refs: Any, **kwargs: Any) -> Any:
    """``ray.get``, the other runs of this process going meanwhile."""
    with released():
        return ray.get(refs, **kwargs)
