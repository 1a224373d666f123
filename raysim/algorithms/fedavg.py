"""FedAvg (McMahan et al. 2017): clients train the global model; the server averages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.aggregators import WeightedSum, mean_partial, weighted_mean
from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import FedAvgParams, FedProxParams
from raysim.algorithms.private_mean import private_mean
from raysim.schema import StrictModel
from raysim.training.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedAvg(Algorithm[FedAvgParams | FedProxParams, Weights]):
    """Sample-weighted model averaging of the sampled clients' models every round."""

    params_class: ClassVar[type[StrictModel]] = FedAvgParams
    private_uploads: ClassVar[tuple[str, ...]] = ("model",)

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": state}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients), prox=self.proximal(start))
        return [ClientResult.trained({"model": weights}, None, outcome)
                for weights, outcome in trained]

    def proximal(self, global_weights: Weights) -> tuple[Weights, float] | None:
        """(anchor, mu) of a proximal term mu/2 ||w - anchor||^2 in the local objective
        (none for FedAvg)."""
        return None

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        weighted = self.params.weighted and self.context.privacy is None  # DP: one vote each
        return mean_partial([r.upload["model"] for _, r in results],
                            [r.num_samples for _, r in results], weighted)

    def aggregate(self, state: Weights, partials: Sequence[WeightedSum], round_: int) -> Weights:
        privacy = self.context.privacy
        if privacy is not None:  # DP-FedAvg: fixed denominator, central noise on the sum
            noise = privacy.noise_std if privacy.mode == "central" else 0.0
            return private_mean(partials, state, privacy.expected_clients, noise,
                                self.context.seed, round_)
        return weighted_mean(partials)

    def global_weights(self, state: Weights) -> Weights:
        return state
