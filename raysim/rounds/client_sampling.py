"""Who takes part in a round: the round loop asks its sampler. Uniform sampling without
replacement is the default; a feature may replace it (DP's Poisson sampling,
:mod:`raysim.layers.client_dp`; the simulated clock's choice, :mod:`raysim.layers.simulated_clock`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.seeding import numpy_rng


@dataclass(frozen=True)
class UniformSampler:
    """``per_round`` of ``num_clients`` clients, a seeded draw without replacement each round
    (all of them when ``per_round`` covers them)."""

    seed: int
    num_clients: int
    per_round: int
    skip_empty_rounds = False

    def clients(self, round_: int) -> np.ndarray:
        count = min(self.per_round, self.num_clients)
        if count == self.num_clients:
            return np.arange(self.num_clients)
        return np.sort(numpy_rng(self.seed, "sample", round_).choice(self.num_clients, count,
                                                                     replace=False))
