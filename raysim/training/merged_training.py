"""Several runs' clients trained in one vectorised call (seeds of one config on shared workers).

A run's vectorised local work is a list of :class:`VectorizedJob` (one per client size). Runs
that share a worker process (:mod:`raysim.engine.pool.worker_host`) hand their jobs to one
:class:`Rendezvous`; it waits until every run bound to the process has handed in its round's
jobs (or a short window has passed), then trains the jobs of equal shape from all runs as one
:func:`~raysim.training.vectorized.train_vectorized` call and gives each run its rows back.

Each client is one row of the batched call and no row reads another, so a client's result
does not depend on which rows share its call: merged runs give the same numbers as separate
ones (tested), and how jobs happen to be grouped (timing) cannot change a result.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from raysim.configuration.schema import OptimizerConfig
from raysim.training.vectorized import train_vectorized
from raysim.vectors.weights import FlatWeights, Proximal, Weights

JobResult = tuple[list[FlatWeights], list[torch.Tensor | None], np.ndarray]
"""New weights, momentum buffers and mean losses of a job's clients (as ``train_vectorized``)."""


@dataclass
class VectorizedJob:
    """Clients of one run and one local-data size, trained together by ``train_vectorized``."""

    model: nn.Module
    weights: Sequence[Weights]
    momentum: Sequence[torch.Tensor | np.ndarray | None]
    inputs: torch.Tensor
    """(clients, samples, ...) local data."""
    targets: torch.Tensor
    plan: Sequence[np.ndarray]
    """Per step, (clients, batch) positions into each client's local data."""
    optimizer: OptimizerConfig
    prox: Proximal | None = None
    loss: str = "cross_entropy"
    """``training.loss``."""
    compile_step: bool = False
    """Each step from the compiled step (``engine.compile_step``)."""

    def merge_key(self) -> tuple[Any, ...] | None:
        """Jobs with equal keys can share one call; None: this job trains alone (a proximal
        anchor is the run's own global model, one per call)."""
        if self.prox is not None and self.prox[1] > 0:
            return None
        layout = tuple((name, tuple(t.shape)) for name, t in
                       [*self.model.named_parameters(), *self.model.named_buffers()])
        return (repr(self.model), layout,
                self.optimizer.model_dump_json(), self.loss, self.compile_step,
                all(m is not None for m in self.momentum),
                tuple(self.inputs.shape[1:]), str(self.inputs.dtype), str(self.inputs.device),
                tuple(step.shape[1] for step in self.plan))

    def train(self) -> JobResult:
        """Train this job's clients alone."""
        return train_vectorized(self.model, self.weights, self.momentum, self.inputs,
                                self.targets, self.plan, self.optimizer, self.prox, self.loss,
                                self.compile_step)


def train_jobs(jobs: Sequence[VectorizedJob]) -> list[JobResult]:
    """Each job in a call of its own (a run alone on its worker)."""
    return [job.train() for job in jobs]


def train_merged(jobs: Sequence[VectorizedJob], keys: Sequence[Any] | None = None
                 ) -> tuple[list[JobResult], list[bool]]:
    """Jobs of equal :meth:`~VectorizedJob.merge_key` (``keys``, if computed already) trained
    as one call each, their clients in the order of ``jobs``; returns each job's result and
    whether it shared its call with another job."""
    keys = [job.merge_key() for job in jobs] if keys is None else keys
    groups: dict[Any, list[int]] = defaultdict(list)
    for index, key in enumerate(keys):
        groups[("alone", index) if key is None else key].append(index)
    results: list[JobResult | None] = [None] * len(jobs)
    shared = [False] * len(jobs)
    for members in groups.values():
        if len(members) == 1:
            results[members[0]] = jobs[members[0]].train()
            continue
        merged = [jobs[i] for i in members]
        steps = len(merged[0].plan)
        weights, momentum, losses = train_vectorized(
            merged[0].model, [w for job in merged for w in job.weights],
            [m for job in merged for m in job.momentum],
            torch.cat([job.inputs for job in merged]), torch.cat([job.targets for job in merged]),
            [np.concatenate([job.plan[step] for job in merged]) for step in range(steps)],
            merged[0].optimizer, loss=merged[0].loss, compile_step=merged[0].compile_step)
        start = 0
        for i in members:
            stop = start + len(jobs[i].weights)
            results[i] = (weights[start:stop], momentum[start:stop], losses[start:stop])
            shared[i] = True
            start = stop
    return [r for r in results if r is not None], shared


@dataclass
class MergeStats:
    """How one run's vectorised jobs were trained on a shared worker."""

    jobs: int = 0
    """Jobs the run handed in."""
    merged_jobs: int = 0
    """Of those, jobs trained in one call with another run's jobs."""
    calls: int = 0
    """Rendezvous the run took part in."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Handed:
    slot: int
    jobs: list[VectorizedJob]
    results: list[JobResult] | None = None
    error: BaseException | None = None


@dataclass
class Rendezvous:
    """Where the runs sharing one worker process meet to train their clients together.

    Threads of the worker's runs hold the baton (one at a time, so a run's global-RNG
    sections are never interleaved with another's) except while they wait here. Jobs are
    trained when every thread in a call waits here and either every bound run has handed in
    its jobs or ``window_s`` has passed since the first of them arrived (a run whose driver is
    still busy with its server-side work is not waited for longer).
    """

    window_s: float = 0.02
    _baton: threading.Condition = field(default_factory=threading.Condition)
    _bound: set[int] = field(default_factory=set)
    _in_call: int = 0
    _waiting: list[_Handed] = field(default_factory=list)
    _first_arrival: float = 0.0
    stats: dict[int, MergeStats] = field(default_factory=lambda: defaultdict(MergeStats))

    def bind(self, slot: int) -> None:
        """A run is configured on ``slot``: wait for its jobs."""
        with self._baton:
            self._bound.add(slot)
            self.stats[slot] = MergeStats()

    def unbind(self, slot: int) -> None:
        """The run on ``slot`` ended: stop waiting for it."""
        with self._baton:
            self._bound.discard(slot)
            self._baton.notify_all()

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Run a call of one run with the baton (the caller's work is serialised with the other
        runs' except in :meth:`train`)."""
        with self._baton:
            self._in_call += 1
            try:
                yield
            finally:
                self._in_call -= 1
                self._baton.notify_all()

    def train(self, slot: int, jobs: list[VectorizedJob]) -> list[JobResult]:
        """Hand in one run's jobs and wait (baton released) until they are trained, possibly in
        one call with other runs' jobs; must be called inside :meth:`holding`."""
        handed = _Handed(slot, jobs)
        if not self._waiting:
            self._first_arrival = time.monotonic()
        self._waiting.append(handed)
        self._baton.notify_all()
        while handed.results is None:
            if handed.error is not None:
                raise RuntimeError("another run's training on this worker failed") \
                    from handed.error
            due = self._due_in()
            if due is not None and due <= 0:
                self._train_waiting()
            else:
                self._baton.wait(due)
        return handed.results

    def _due_in(self) -> float | None:
        """Seconds until the waiting jobs are to be trained (<= 0: now); None: not while
        another call of a run is still working."""
        if len(self._waiting) < self._in_call:
            return None
        if {h.slot for h in self._waiting} >= self._bound:
            return 0.0
        return self._first_arrival + self.window_s - time.monotonic()

    def _train_waiting(self) -> None:
        waiting, self._waiting = self._waiting, []
        jobs = [job for handed in waiting for job in handed.jobs]
        try:
            results, shared = train_merged(jobs)
        except BaseException as error:  # every waiting run sees the failure, none waits forever
            for handed in waiting:
                handed.error = error
            self._baton.notify_all()
            raise
        start = 0
        for handed in waiting:
            stop = start + len(handed.jobs)
            handed.results = results[start:stop]
            stats = self.stats[handed.slot]
            stats.jobs += len(handed.jobs)
            stats.merged_jobs += sum(shared[start:stop])
            stats.calls += 1
            start = stop
        self._baton.notify_all()
