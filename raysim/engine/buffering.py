"""FedBuff's round totals on the driver (:mod:`raysim.algorithms.buffered`): A, the sum of
the trained clients' weights a_c, and W_v, the sum of a_c s_c by start version, computed from
the clock's plan of the round while the workers train, in the order in which the fixed
reduction tree (:mod:`raysim.engine.reduction_tree`) adds the group partials. The workers'
partials then carry only the weighted sum of the trained models, reduced as FedAvg's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.algorithms.buffered import BufferTotals


@dataclass(frozen=True)
class BufferWeighting:
    """What the driver computes each FedBuff round's totals from: every client's weight a_c
    (:meth:`~raysim.algorithms.base.Algorithm.buffer_client_weights`) and client group."""

    client_weights: np.ndarray
    group_of_client: np.ndarray

    def totals(self, clients: np.ndarray, versions: np.ndarray, staleness: np.ndarray
               ) -> BufferTotals | None:
        """The round's totals from its trained clients (ascending) with their start versions
        and staleness weights (None: no client trained).

        Each sum adds the same numbers in the same order as the workers' group partials
        merged along the reduction tree would: per group in client order (``bincount`` adds
        its inputs in order), then pairwise up the tree's levels, left first (a group or
        version without clients adds an exact 0.0 where the tree would skip it)."""
        if not len(clients):
            return None
        groups = self.group_of_client[clients]
        client_weights = self.client_weights[clients]
        distinct, column = np.unique(versions, return_inverse=True)
        leaves = 1 << int(groups.max()).bit_length()  # the tree's width (a power of two)
        totals = np.bincount(groups, client_weights, minlength=leaves)
        shares = np.bincount(groups * len(distinct) + column, client_weights * staleness,
                             minlength=leaves * len(distinct)).reshape(leaves, len(distinct))
        while len(totals) > 1:
            totals, shares = totals[0::2] + totals[1::2], shares[0::2] + shares[1::2]
        return BufferTotals(float(totals[0]), dict(zip(distinct.tolist(), shares[0].tolist(),
                                                       strict=True)))
