"""FedRep (Collins et al., ICML 2021): a representation shared by all clients and a personal
head per client, trained in turn.

Each round a client starts from the round's representation and its own head, trains the head
alone for ``head_epochs`` epochs (the representation frozen), then the representation alone
for the run's local work (the head frozen), uploads the representation and keeps its head; the
server averages the representations. ``head_layers`` says how many of the model's last layers
with parameters form the head (:mod:`raysim.models.layer_split`). A client's model is the
round's representation with its own head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.params import FedRepParams
from raysim.algorithms.partial_sharing import PartialSharing
from raysim.configuration.schema import StrictModel
from raysim.models.layer_split import head_entries
from raysim.training.client_fit import BatchLoss, FitOutcome, fit_client
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime, TrainOutcome


@register_algorithm
class FedRep(PartialSharing[FedRepParams]):
    """FedAvg of the representation; each client's head is trained first each round, alone."""

    params_class: ClassVar[type[StrictModel]] = FedRepParams
    per_client_loop: ClassVar[str | None] = (
        "its head and representation are trained in two phases with different frozen layers")

    def private_entries(self, model: nn.Module) -> frozenset[str]:
        return head_entries(model, self.params.head_layers)

    def train_clients(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      starts: Sequence[Weights]
                      ) -> list[tuple[Weights, TrainOutcome | FitOutcome]]:
        loss_fn = loss_function(training_loss(self.context.training.loss, self.context.info))

        def objective(model: nn.Module) -> BatchLoss:
            return lambda inputs, targets: loss_fn(model(inputs), targets)

        private = self._private()
        trained: list[tuple[Weights, TrainOutcome | FitOutcome]] = []
        for client, start in zip(clients, starts, strict=True):
            head = fit_client(runtime, client, round_, start, objective,
                              trainable=lambda name: name in private,
                              epochs=self.params.head_epochs, stream="fedrep-head")
            body = fit_client(runtime, client, round_, head.weights, objective,
                              trainable=lambda name: name not in private)
            trained.append((body.weights, body))
        return trained
