"""FedBuff's round totals on the driver (:mod:`raysim.algorithms.buffered`): A, the sum of
the trained clients' weights a_c, and W_v, the sum of a_c s_c by start version, computed from
the clock's plan of the round while the workers train, in the order in which the fixed
reduction tree (:mod:`raysim.engine.reduction_tree`) adds the group partials. The workers'
partials then carry only the weighted sum of the trained models, reduced as FedAvg's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.algorithms.buffered import BufferTotals, group_totals
from raysim.engine.reduction_tree import Subtree, combine


@dataclass(frozen=True)
class BufferWeighting:
    """What the driver computes each FedBuff round's totals from: every client's weight a_c
    (:meth:`~raysim.algorithms.base.Algorithm.buffer_client_weights`) and client group."""

    client_weights: list[float]
    group_of_client: np.ndarray

    def totals(self, clients: np.ndarray, versions: np.ndarray, staleness: np.ndarray
               ) -> BufferTotals | None:
        """The round's totals from its trained clients (ascending) with their start versions
        and staleness weights: per group in client order, then merged along the reduction
        tree, so that each sum adds the same numbers in the same order as if the workers'
        group partials carried it (None: no client trained)."""
        weights = self.client_weights
        ids: list[int] = clients.tolist()
        groups: list[int] = self.group_of_client[clients].tolist()
        versions_of: list[int] = versions.tolist()
        staleness_of: list[float] = staleness.tolist()
        leaves = []
        start = 0
        for stop in range(1, len(ids) + 1):
            if stop == len(ids) or groups[stop] != groups[start]:
                leaves.append(Subtree((groups[start], groups[start] + 1), group_totals(
                    [weights[c] for c in ids[start:stop]], staleness_of[start:stop],
                    versions_of[start:stop])))
                start = stop
        return combine(leaves, BufferTotals.merge)
