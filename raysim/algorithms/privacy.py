"""Differential privacy for outgoing models: clip the update, add Gaussian noise."""

from __future__ import annotations

import numpy as np

from raysim.algorithms.aggregators import flatten, unflatten
from raysim.training.weights import Weights


def privatize(model: Weights, reference: Weights, clip: float, sigma: float,
              rng: np.random.Generator) -> Weights:
    """The Gaussian mechanism on a model update.

    update = model - reference is scaled to L2 norm <= ``clip`` (S), then N(0, (sigma*S)^2)
    noise is added to every coordinate (the textbook mechanism; FedDC's reference code uses
    standard deviation sigma^2 * S^2); returns reference + noisy clipped update.
    """
    base = flatten(reference)
    update = flatten(model) - base
    norm = float(np.linalg.norm(update.astype(np.float64)))  # float32 sums drift ~1e-5
    update /= max(1.0, norm / clip)
    update += rng.normal(0.0, sigma * clip, size=update.shape)
    return unflatten(base + update, model)
