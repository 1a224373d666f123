"""Ditto (Li et al. 2021): a global model trained as FedAvg, and on every client a personal
model regularised towards it.

In a round each sampled client trains the broadcast global model w for its local work and
uploads it (the server averages, as FedAvg), then trains its own personal model v on the same
minibatches with the local objective plus lambda/2 ||v - w||^2 and keeps it. lambda = 0 is
local training; a large lambda pulls every personal model to the global one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import DittoParams
from raysim.schema import StrictModel
from raysim.vectors.weighted_sum import mean_partial, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class Ditto(Algorithm[DittoParams, Weights]):
    """FedAvg's global model plus a personal model per client, pulled towards it by lambda;
    each personal model is evaluated on its client's own test share."""

    params_class: ClassVar[type[StrictModel]] = DittoParams
    params: DittoParams
    personalized = True
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    privacy_refusal: ClassVar[str] = (
        "its personal models are trained on the client's data without clipping or noise and "
        "are evaluated and recorded per client, so client-level DP on the global-model upload "
        "would not cover what the run releases")
    asynchronous_refusal: ClassVar[str | None] = (
        "its personal models are pulled towards the round's global model, which clients "
        "starting from different versions do not share")

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": state}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        global_model = message["model"]
        shared = runtime.train_many(clients, round_, [global_model] * len(clients),
                                    [None] * len(clients))
        starts = [runtime.client_initial_weights(c) if s is None else s[0]
                  for c, s in zip(clients, states, strict=True)]
        optimizer_states = [None if s is None else s[1] for s in states]
        pull = (global_model, self.params.lam) if self.params.lam > 0 else None
        personal = runtime.train_many(clients, round_, starts, optimizer_states, prox=pull)
        return [ClientResult.trained({"model": weights}, (own, own_outcome.optimizer_state),
                                     outcome, personal_loss=own_outcome.mean_loss)
                for (weights, outcome), (own, own_outcome) in zip(shared, personal,
                                                                   strict=True)]

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return mean_partial([r.upload["model"] for _, r in results],
                            [r.num_samples for _, r in results], self.params.weighted)

    def aggregate(self, state: Weights, partials: Sequence[Any], round_: int) -> Weights:
        return weighted_mean(partials) if partials else state

    def global_weights(self, state: Weights) -> Weights:
        return state

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
