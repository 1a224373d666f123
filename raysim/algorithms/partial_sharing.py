"""The shell of the methods that federate part of a model and keep the rest on each client
(FedBN, FedRep, LG-FedAvg): the server averages the shared entries only, every client keeps
its private entries from round to round, and its personal model is the round's shared part
with its own private part on top.

A method names its private entries (:meth:`PartialSharing.private_entries`, from the model's
layer split in :mod:`raysim.models.layer_split`) and, where its local work is not the run's
plain local training, overrides :meth:`PartialSharing.train_clients`."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from torch import nn

from raysim.algorithms.base import ClientResult, ParamsT
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.supports import Supports
from raysim.vectors.weighted_sum import weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.client_fit import FitOutcome
    from raysim.training.context import RunContext
    from raysim.training.runtime import ClientRuntime, TrainOutcome


class PartialSharing(FedAvg[ParamsT]):
    """FedAvg over the entries a method shares; each client keeps the others (its state: the
    private entries as numpy arrays) and is evaluated with the round's shared entries and its
    own private ones. There is no one global model (the server's private entries are never
    trained), so the personal models are the run's models."""

    personalized = True
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    supports: ClassVar[Supports] = replace(
        FedAvg.supports, server_optimizers=False,
        privacy_refusal=("each client's private layers are trained on its data and evaluated "
                         "per client, outside what client-level DP on the shared upload "
                         "would cover"),
        asynchronous_refusal=("a client's private layers are trained beside the shared ones "
                              "of the round's one broadcast"))

    def __init__(self, params: ParamsT, context: RunContext):
        super().__init__(params, context)
        self._private()  # a model without the layers the method keeps is refused here

    @abstractmethod
    def private_entries(self, model: nn.Module) -> frozenset[str]:
        """The state entries of ``model`` (the run's architecture) that each client keeps."""

    def _private(self) -> frozenset[str]:
        """The run's private entries (cached: the architecture is the run's constant)."""
        cached = self.__dict__.get("_private_entries")
        if cached is None:
            from raysim.models import build_model

            cached = self.private_entries(build_model(self.context.model, self.context.info))
            self.__dict__["_private_entries"] = cached
        return cached

    def shared_part(self, weights: Weights) -> dict[str, np.ndarray]:
        """The entries of ``weights`` the server averages."""
        private = self._private()
        return {name: weights[name] for name in weights if name not in private}

    def private_part(self, weights: Weights) -> dict[str, np.ndarray]:
        """The entries of ``weights`` a client keeps (copies)."""
        return {name: np.array(weights[name]) for name in sorted(self._private())}

    # ----- server -----
    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"model": self.shared_part(state)}

    def aggregate(self, state: Weights, partials: Sequence[Any], round_: int) -> Weights:
        return {**state, **weighted_mean(partials)} if partials else state

    def global_weights(self, state: Weights) -> Weights | None:
        return None

    def personal_base(self, state: Weights) -> Weights | None:
        return self.shared_part(state)

    def compose_personal(self, state: Any, base: Weights | None) -> Weights | None:
        return None if state is None or base is None else {**base, **state}

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """None: an upload holds the shared layers only, not a model the loss attack can run
        (the client's private layers never leave it)."""
        return None

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        shared = message["model"]
        starts = [{**shared, **(self.private_part(runtime.client_initial_weights(client))
                                if state is None else state)}
                  for client, state in zip(clients, states, strict=True)]
        trained = self.train_clients(runtime, clients, round_, starts)
        return [ClientResult.trained({"model": self.shared_part(weights)},
                                     self.private_part(weights), outcome,
                                     weight=self.client_weight(outcome.num_samples))
                for weights, outcome in trained]

    def train_clients(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      starts: Sequence[Weights]
                      ) -> list[tuple[Weights, TrainOutcome | FitOutcome]]:
        """Each client's round of local work from its start (the shared entries with its own
        private ones); default: the run's local training of the whole model."""
        return list(runtime.train_many(clients, round_, starts, [None] * len(clients)))
