"""One worker process shared by several runs (the seeds of one config), so that their clients
train in one vectorised call (:mod:`raysim.training.merged_training`).

A :class:`WorkerHost` actor holds one :class:`~raysim.engine.run.worker.ClientWorker` per run
(its *slot*) and runs each run's calls in a thread of its own; a run's driver sees its slot
through a :class:`RunBoundWorker`, which has the methods of a ``ClientWorker`` handle, so the
driver's code is the same for a shared and an own worker. The runs' calls take turns (one
baton); only their vectorised training waits for the other runs' and runs as one call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from raysim.engine.run.worker import ClientWorker
from raysim.training.merged_training import Rendezvous

MAX_RUNS_PER_HOST = 8
"""Runs sharing one worker process at most (its actor runs this many calls at once)."""


class WorkerHost:
    """A pooled worker process serving the slots of several runs at once."""

    def __init__(self) -> None:
        self._slots: dict[int, ClientWorker] = {}
        self._rendezvous = Rendezvous()

    def call(self, slot: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` of the run on ``slot`` (its ``ClientWorker``, created on first use,
        e.g. after the actor restarted)."""
        with self._rendezvous.holding():
            worker = self._slots.get(slot)
            if worker is None:
                worker = self._slots[slot] = ClientWorker()
            if method == "reset":
                self._rendezvous.unbind(slot)
            if worker.setup is not None:
                # torch's thread count is the calling OS thread's (OpenMP's setting): this
                # actor runs each call in one of its pool's threads, not always the one that
                # configured the run; one that did not would train with every core (other
                # float reductions: other numbers, and the CPUs oversubscribed)
                torch.set_num_threads(worker.setup.threads)
            result = getattr(worker, method)(*args, **kwargs)
            if method == "configure":
                worker.runtime.job_trainer = partial(self._rendezvous.train, slot)
                self._rendezvous.bind(slot)
            return result

    def merge_stats(self, slot: int) -> dict[str, int]:
        """How the run on ``slot`` trained: jobs handed in, jobs merged with another run's,
        rendezvous taken part in."""
        with self._rendezvous.holding():
            return self._rendezvous.stats[slot].as_dict()

    def reset(self) -> None:
        """Forget every run (before the pool lends this process again)."""
        with self._rendezvous.holding():
            for slot, worker in self._slots.items():
                self._rendezvous.unbind(slot)
                worker.reset()
            self._slots.clear()


@dataclass(frozen=True)
class RunBoundWorker:
    """One run's view of a :class:`WorkerHost`: ``worker.method.remote(...)`` calls that
    method of the run's slot, as on a ``ClientWorker`` actor handle."""

    host: Any
    slot: int

    def __getattr__(self, method: str) -> _BoundMethod:
        if method.startswith("__"):
            raise AttributeError(method)
        return _BoundMethod(self.host, self.slot, method)


@dataclass(frozen=True)
class _BoundMethod:
    host: Any
    slot: int
    method: str

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        # a method with several results (``ray.method(num_returns=...)``) keeps them apart
        returns = getattr(getattr(ClientWorker, self.method, None), "__ray_num_returns__", 1)
        call = self.host.call if returns == 1 else self.host.call.options(num_returns=returns)
        return call.remote(self.slot, self.method, *args, **kwargs)
