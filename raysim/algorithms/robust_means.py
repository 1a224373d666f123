"""Robust means of models for FedDC's aggregators: the coordinate-wise median and the iterated
Radon point (Clarkson et al. 1996), over models flattened to float64 vectors."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raysim.vectors.weights import Weights


def flatten(model: Weights) -> np.ndarray:
    """All floating-point entries of a model as one float64 vector (sorted by name)."""
    return np.concatenate([np.asarray(model[name], dtype=np.float64).ravel()
                           for name in sorted(model) if np.issubdtype(model[name].dtype,
                                                                      np.floating)])


def unflatten(vector: np.ndarray, template: Weights) -> Weights:
    """Inverse of :func:`flatten`; non-float entries are copied from ``template``."""
    result: dict[str, np.ndarray] = {}
    offset = 0
    for name in sorted(template):
        array = template[name]
        if np.issubdtype(array.dtype, np.floating):
            result[name] = vector[offset:offset + array.size].reshape(array.shape).astype(array.dtype)
            offset += array.size
        else:
            result[name] = np.array(array, copy=True)
    return {name: result[name] for name in template}


def coordinate_median(models: Sequence[Weights]) -> Weights:
    """Coordinate-wise median of models (robust aggregation)."""
    stacked = np.stack([flatten(m) for m in models])
    return unflatten(np.median(stacked, axis=0), models[0])


def radon_number(num_parameters: int) -> int:
    """Radon number of R^D: D + 2 points always have a Radon partition."""
    return num_parameters + 2


def radon_point(points: np.ndarray) -> np.ndarray:
    """The Radon point of r = D + 2 points in R^D (rows of ``points``).

    Solves sum_i a_i s_i = 0, sum_i a_i = 0 for a non-trivial a (the right singular vector of
    the smallest singular value); the Radon point is sum_{a_i > 0} a_i s_i / sum_{a_i > 0} a_i.
    """
    system = np.vstack([points.T, np.ones(len(points))])
    a = np.linalg.svd(system)[2][-1]
    positive = a > 0
    return (a[positive] @ points[positive]) / a[positive].sum()


def iterated_radon_point(models: Sequence[Weights]) -> Weights:
    """The iterated Radon point (Clarkson et al. 1996) of models, as in FedDC's Radon machine.

    With r = D + 2 and height h = floor(log m / log r), the first r^h models are grouped into
    r-tuples, each replaced by its Radon point, h times; the remaining models are dropped.
    """
    points = np.stack([flatten(m) for m in models])
    r = radon_number(points.shape[1])
    if len(points) < r:
        raise ValueError(f"{len(points)} models < Radon number {r}")
    height = int(np.floor(np.log(len(points)) / np.log(r) + 1e-12))
    points = points[: r ** height]
    for _ in range(height):
        points = np.stack([radon_point(group) for group in points.reshape(-1, r, points.shape[1])])
    return unflatten(points[0], models[0])
