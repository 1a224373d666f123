"""Poisson sampling of a round's clients (what the DP accountant's PoissonSampledDpEvent
assumes): every client takes part independently with probability ``rate``."""

from __future__ import annotations

import numpy as np

from raysim.seeding import numpy_rng


def poisson_sample(seed: int, round_: int, num_clients: int, rate: float) -> np.ndarray:
    """The sorted ids of the clients sampled in ``round_`` (possibly none): one uniform draw
    per client from the stream (seed, "dp-sample", round), so the sample does not depend on
    the number of workers."""
    draws = numpy_rng(seed, "dp-sample", round_).random(num_clients)
    return np.flatnonzero(draws < rate)
