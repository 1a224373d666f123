"""FedProx (Li et al. 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2."""

from __future__ import annotations

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.params import FedProxParams
from raysim.vectors.weights import Weights


@register_algorithm
class FedProx(FedAvg[FedProxParams]):
    """FedAvg whose clients minimise the local loss plus the proximal term."""

    params_class = FedProxParams

    def proximal(self, global_weights: Weights) -> tuple[Weights, float] | None:
        return (global_weights, self.params.mu) if self.params.mu > 0 else None
