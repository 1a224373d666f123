"""A worked plug-in method: FedNova (Wang, Liu, Liang, Joshi and Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020), the walk-through
of docs/plugins.md.

    raysim run experiments/plugins/fednova.yaml       # the config names `plugins: [fednova]`
    raysim run CONFIG --plugin fednova --set algorithm.name=fednova

Clients that take different numbers of local steps pull FedAvg's mean towards the objectives
of those that take more. FedNova normalises each client's update by its steps before averaging
and rescales the mean by the effective number of steps:

    d_i = (w - w_i) / tau_i,    w <- w - tau_eff * sum_i p_i d_i,    tau_eff = sum_i p_i tau_i

with p_i the clients' sample shares and tau_i their local steps (the paper's FedNova with
plain SGD as the local solver, a_i = (1, ..., 1)). With equal steps it is FedAvg.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.vectors.weighted_sum import WeightedSum
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


class FedNovaParams(StrictModel):
    """FedNova has no settings of its own beyond its name (the local work is `training:`)."""

    name: Literal["fednova"] = "fednova"


@register_algorithm
class FedNova(Algorithm[FedNovaParams, Weights]):
    """Normalised averaging: each client's update divided by its local steps, the mean
    rescaled by the effective steps."""

    params_class: ClassVar[type[StrictModel]] = FedNovaParams
    # Its uploads are normalised updates, not models: client-level DP and FedBuff (which wrap
    # mean uploads) and the server optimizers refuse it, each with this method's reason.
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    supports: ClassVar[Supports] = Supports(
        privacy_refusal=("its server rescales the mean of normalised updates by the clients' step counts, "
            "which client-level DP here does not clip or noise"),
        asynchronous_refusal="its effective step count is a property of one synchronous round's clients")

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": state}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients))
        results = []
        for weights, outcome in trained:
            steps = max(outcome.steps, 1)
            update = {name: ((np.asarray(start[name], np.float64)
                              - np.asarray(weights[name], np.float64)) / steps
                             ).astype(np.float32) for name in start}
            results.append(ClientResult.trained({"update": update, "steps": steps}, None,
                                                outcome, weight=outcome.num_samples))
        return results

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        """One partial per client group: the sample-weighted sum of the normalised updates,
        and the sample-weighted sum of the steps (the engine's default ``merge`` adds both
        along its reduction tree)."""
        return {"update": WeightedSum.of([r.upload["update"] for _, r in results],
                                         [r.weight for _, r in results]),
                "weighted_steps": float(sum(r.weight * r.upload["steps"] for _, r in results))}

    def aggregate(self, state: Weights, partials: Sequence[Any], round_: int) -> Weights:
        if not partials:  # no client this round
            return state
        partial = partials[0]
        update = partial["update"]
        direction = update.mean()  # sum_i p_i d_i
        effective_steps = partial["weighted_steps"] / update.total_weight  # tau_eff
        return {name: (np.asarray(value, np.float64) - effective_steps * direction[name]
                       ).astype(np.asarray(value).dtype) for name, value in state.items()}

    def global_weights(self, state: Weights) -> Weights:
        return state
