"""Centralized training on the pooled data of all clients: the upper bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.local_only import LocalOnly
from raysim.algorithms.params import CentralizedParams
from raysim.algorithms.supports import Supports
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class Centralized(LocalOnly):
    """One model trained on the union of the clients' training data with the same budget:
    ``local_epochs`` epochs per round, or, when rounds are counted in steps, as many steps as
    all sampled clients of a federated round take together.

    The model is handed to the server after every round (not counted as communication) so
    it is evaluated like a global model: on the pooled test set and on every client's share.
    """

    params_class = CentralizedParams
    supports: ClassVar[Supports] = replace(
        LocalOnly.supports,
        privacy_refusal="it trains on the pooled data of every client (no federated upload to protect)",
        heterogeneous=False)
    params: CentralizedParams
    pooled = True
    per_client_loop = "one pooled client: nothing to batch"
    personalized = False
    evaluation_uploads = ("model",)

    def local_work_scale(self) -> int:
        return self.context.clients_per_round

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        results = super().local_updates(runtime, clients, round_, message, states)
        for result in results:
            result.upload = {"model": result.state[0]}
        return results

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Weights:
        return results[0][1].upload["model"]  # the one pooled client

    def aggregate(self, state: Weights, partials: Sequence[Weights], round_: int) -> Weights:
        return partials[0] if partials else state

    def global_weights(self, state: Weights) -> Weights:
        return state
