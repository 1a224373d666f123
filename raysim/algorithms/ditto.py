"""Ditto (Li et al. 2021): a global model trained as FedAvg, and on every client a personal
model regularised towards it.

In a round each sampled client trains the broadcast global model w for its local work and
uploads it (the server averages: FedAvg's round, inherited), then trains its own personal
model v on the same minibatches with the local objective plus lambda/2 ||v - w||^2 and keeps
it. lambda = 0 is local training; a large lambda pulls every personal model to the global one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.params import DittoParams
from raysim.algorithms.supports import PERSONAL_MODELS_PRIVACY_REFUSAL, Supports
from raysim.configuration.schema import StrictModel
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class Ditto(FedAvg[DittoParams]):
    """FedAvg's global model plus a personal model per client, pulled towards it by lambda;
    each personal model is evaluated on its client's own test share."""

    params_class: ClassVar[type[StrictModel]] = DittoParams
    personalized = True
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    supports: ClassVar[Supports] = replace(
        FedAvg.supports,
        privacy_refusal=PERSONAL_MODELS_PRIVACY_REFUSAL,
        asynchronous_refusal=("its personal models are pulled towards the round's global model, which "
            "clients starting from different versions do not share"))

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        results = super().local_updates(runtime, clients, round_, message, states)
        starts = [runtime.client_initial_weights(c) if s is None else s[0]
                  for c, s in zip(clients, states, strict=True)]
        optimizer_states = [None if s is None else s[1] for s in states]
        pull = (message["model"], self.params.lam) if self.params.lam > 0 else None
        personal = runtime.train_many(clients, round_, starts, optimizer_states, prox=pull)
        for result, (own, outcome) in zip(results, personal, strict=True):
            result.state = (own, outcome.optimizer_state)
            result.metrics["personal_loss"] = outcome.mean_loss
        return results

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
