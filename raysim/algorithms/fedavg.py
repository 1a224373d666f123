"""FedAvg (McMahan et al. 2017): clients train the global model; the server averages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from raysim.algorithms.aggregators import WeightedSum, weighted_mean
from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.engine.weights import Weights, get_weights, set_weights
from raysim.schema import StrictModel

if TYPE_CHECKING:
    from raysim.engine.runtime import ClientRuntime


class FedAvgParams(StrictModel):
    name: Literal["fedavg"] = "fedavg"
    weighted: bool = True
    """Weight client models by their sample counts (False: plain mean)."""


@register_algorithm
class FedAvg(Algorithm):
    """Sample-weighted model averaging of the sampled clients' models every round."""

    params_class = FedAvgParams

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": state}

    def client_update(self, runtime: ClientRuntime, client: int, round_: int,
                      message: dict[str, Any], state: Any) -> ClientResult:
        model = runtime.model
        set_weights(model, message["model"])
        outcome = runtime.train(model, client, round_,
                                regularizer=self.regularizer(model, message["model"]))
        return ClientResult({"model": get_weights(model)}, None, outcome.metrics())

    def regularizer(self, model: nn.Module, global_weights: Weights
                    ) -> Callable[[], torch.Tensor] | None:
        """An extra loss term ``() -> tensor`` added to every local step (none for FedAvg)."""
        return None

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        weights = [r.metrics["num_samples"] if self.params.weighted else 1.0 for _, r in results]
        return WeightedSum.of([r.upload["model"] for _, r in results], weights)

    def aggregate(self, state: Weights, partials: Sequence[WeightedSum], round_: int) -> Weights:
        return weighted_mean(partials)

    def global_weights(self, state: Weights) -> Weights:
        return state
