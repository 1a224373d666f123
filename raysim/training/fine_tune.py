"""Fine-tuning after training ("+FT" in the personalisation literature's tables): a client
continues the final global model on its own training share for a few local epochs, with a
fresh optimizer of the run's config and the run's loss, its batches from their own stream."""

from __future__ import annotations

from torch import nn

from raysim.training.client_fit import BatchLoss, fit_client
from raysim.training.losses import loss_function, training_loss
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import Weights

FINE_TUNE_STREAM = "fine-tune"
"""The random stream of the fine-tuning batches (apart from the rounds' own)."""


def fine_tuned(runtime: ClientRuntime, client: int, round_: int, start: Weights,
               epochs: int) -> nn.Module:
    """``client``'s model after ``epochs`` epochs of the run's local training from ``start``
    on its own training share (the client's resident module: read it before another client
    trains); ``round_``: the round the batch stream is drawn for (the run's last)."""
    loss_fn = loss_function(training_loss(runtime.training.loss, runtime.info))

    def objective(model: nn.Module) -> BatchLoss:
        return lambda inputs, targets: loss_fn(model(inputs), targets)

    return fit_client(runtime, client, round_, start, objective, epochs=epochs,
                      stream=FINE_TUNE_STREAM).model
