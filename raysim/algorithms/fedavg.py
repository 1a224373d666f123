"""FedAvg (McMahan et al. 2017): clients train the global model; the server averages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.base import Algorithm, ClientResult, ParamsT, register_algorithm
from raysim.algorithms.params import FedAvgParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.vectors.weighted_sum import WeightedSum, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedAvg(Algorithm[ParamsT, Weights]):
    """Sample-weighted model averaging of the sampled clients' models every round; generic
    over its parameters, so that a method built on it (FedProx, MOON, Ditto) types its own
    (``class FedProx(FedAvg[FedProxParams])``)."""

    params_class: ClassVar[type[StrictModel]] = FedAvgParams
    mean_uploads: ClassVar[tuple[str, ...]] = ("model",)
    supports: ClassVar[Supports] = Supports(
        server_optimizers=True, segmentation_refusal=None)

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": state}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients), prox=self.proximal(start))
        return [ClientResult.trained({"model": weights}, None, outcome,
                                     weight=self.client_weight(outcome.num_samples))
                for weights, outcome in trained]

    def proximal(self, global_weights: Weights) -> tuple[Weights, float] | None:
        """(anchor, mu) of a proximal term mu/2 ||w - anchor||^2 in the local objective
        (none for FedAvg)."""
        return None

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        return WeightedSum.of([r.upload["model"] for _, r in results],
                              [r.weight for _, r in results])

    def aggregate(self, state: Weights, partials: Sequence[Any], round_: int) -> Weights:
        return weighted_mean(partials) if partials else state

    def global_weights(self, state: Weights) -> Weights | None:
        return state
