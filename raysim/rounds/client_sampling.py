"""Who takes part in a round: the round loop asks its sampler. Uniform sampling without
replacement (the default), Poisson sampling (each client independently, as DP's accountant
assumes) and the simulated clock's choice (``system:``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raysim.privacy.sampling import poisson_sample
from raysim.seeding import numpy_rng
from raysim.system.records import ClockRecords


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


@dataclass(frozen=True)
class PoissonSampler:
    """Every client independently with probability ``rate`` (a round may have none: the
    algorithm still aggregates it)."""

    seed: int
    num_clients: int
    rate: float
    skip_empty_rounds = False

    def clients(self, round_: int) -> np.ndarray:
        return poisson_sample(self.seed, round_, self.num_clients, self.rate)


@dataclass(frozen=True)
class ClockSampler:
    """The clients the simulated clock let finish in time (or buffered) in each round; a round
    where none did leaves the server state as it was."""

    records: ClockRecords
    skip_empty_rounds = True

    def clients(self, round_: int) -> np.ndarray:
        return self.records.trained(round_)
