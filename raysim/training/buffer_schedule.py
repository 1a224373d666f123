"""A worker's part of FedBuff's plan (:mod:`raysim.algorithms.buffered`), held by its
:class:`~raysim.training.runtime.ClientRuntime` for the run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BufferSchedule:
    """One worker's part of FedBuff's plan, sent to it once before the rounds (not with every
    round's message): each round's trained clients of this worker (ascending), each one's
    start version and staleness weight, and the server versions a later round still starts
    clients from (what the worker keeps after the round)."""

    clients: np.ndarray
    """int64, by round, then client."""
    start_versions: np.ndarray
    """int64, aligned with ``clients``."""
    staleness_weights: np.ndarray
    """float64, aligned with ``clients``."""
    bounds: np.ndarray
    """Round r's rows are ``bounds[r]:bounds[r + 1]``."""
    kept_after: tuple[tuple[int, ...], ...]

    def starts(self, round_: int, clients: Sequence[int]) -> tuple[list[int], np.ndarray]:
        """The start versions (as ints) and staleness weights of ``clients`` (ascending, all
        trained in round ``round_`` on this worker)."""
        lo, hi = int(self.bounds[round_]), int(self.bounds[round_ + 1])
        index = lo + np.searchsorted(self.clients[lo:hi], clients)
        return self.start_versions[index].tolist(), self.staleness_weights[index]
