"""Reusable aggregation operators over :data:`~raysim.engine.weights.Weights`.

Aggregation is split into a per-worker ``reduce`` (clients of one fixed group, in client order)
and a server-side ``combine`` (groups in group order), so the result does not depend on how many
workers there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raysim.engine.weights import Weights


@dataclass
class WeightedSum:
    """A float64 weighted sum of models and the total weight (the partial of a weighted mean)."""

    sums: dict[str, np.ndarray]
    total_weight: float
    dtypes: dict[str, np.dtype]

    @classmethod
    def of(cls, models: Sequence[Weights], weights: Sequence[float]) -> WeightedSum:
        """Sum ``weights[i] * models[i]`` in the given order."""
        if not models:
            raise ValueError("WeightedSum.of needs at least one model")
        first = models[0]
        sums = {name: np.zeros(array.shape, dtype=np.float64) for name, array in first.items()}
        for model, weight in zip(models, weights, strict=True):
            for name, total in sums.items():
                total += weight * model[name].astype(np.float64, copy=False)
        dtypes = {name: array.dtype for name, array in first.items()}
        return cls(sums, float(sum(weights)), dtypes)

    def merge(self, other: WeightedSum) -> WeightedSum:
        """The sum of two partials (self first)."""
        sums = {name: self.sums[name] + other.sums[name] for name in self.sums}
        return WeightedSum(sums, self.total_weight + other.total_weight, self.dtypes)

    def mean(self) -> Weights:
        """The weighted mean cast back to each entry's dtype (integers rounded)."""
        result: Weights = {}
        for name, total in self.sums.items():
            average = total / self.total_weight
            dtype = self.dtypes[name]
            if np.issubdtype(dtype, np.integer):
                average = np.rint(average)
            result[name] = average.astype(dtype)
        return result


def weighted_mean(partials: Sequence[WeightedSum]) -> Weights:
    """Combine per-group partial sums in order and return the weighted mean."""
    if not partials:
        raise ValueError("weighted_mean needs at least one partial sum")
    total = partials[0]
    for partial in partials[1:]:
        total = total.merge(partial)
    return total.mean()
