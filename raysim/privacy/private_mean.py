"""The server's private mean (DP-FedAvg with a fixed denominator, McMahan et al. 2018):

    new = broadcast + (sum of the clipped updates + central noise) / expected

where ``expected`` = rate x N is the expected number of sampled clients (Poisson sampling
makes the actual number random; dividing by it would leak it). Computed from the sum S of the
uploaded (clipped) models of the n sampled clients as (S + noise + (expected - n) broadcast) /
expected, so that with no noise, no clipping and every client sampled it is FedAvg's unweighted
mean to the bit.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raysim.privacy.mechanism import gaussian_noise
from raysim.state_codec import persistable
from raysim.vectors.weighted_sum import WeightedSum
from raysim.vectors.weights import Weights


def private_mean(partials: Sequence[WeightedSum], broadcast: Weights, expected: float,
                 noise_std: float, seed: int, round_: int,
                 stream: str = "dp-central-noise") -> dict[str, np.ndarray]:
    """The private mean of a round's uploads (see the module docstring); ``partials``: the
    merged sums of the sampled clients' uploads, each client with weight 1 (none: no client
    was sampled); ``noise_std``: the central noise on the sum (0 in local mode), drawn from
    the stream (seed, ``stream``, round): each upload of an algorithm with several gets its
    own."""
    sampled = sum(partial.total_weight for partial in partials)
    rest = WeightedSum.of([broadcast], [expected - sampled])  # (expected - n) broadcast
    total = functools.reduce(WeightedSum.merge, [*partials, rest])  # S first, in order
    if noise_std > 0:
        floats = total.float_count
        noise = gaussian_noise(floats, noise_std, seed, stream, round_)
        total.vector[:floats] += noise.to(total.vector.device)
    total.total_weight = expected
    return total.mean()


@persistable
@dataclass(frozen=True)
class AdaptivelyClipped:
    """A server state under adaptive clipping: the global model and the next round's clip."""

    model: Weights
    clip: float


def count_noise(std: float, seed: int, round_: int) -> float:
    """The Gaussian noise on a round's count of clients within the clip, from the stream
    (seed, "dp-count-noise", round)."""
    return float(gaussian_noise(1, std, seed, "dp-count-noise", round_)[0]) if std > 0 else 0.0
