"""One client's round of local training under a method's own objective: the shell that MOON,
FedMix, FedGen, FedGAN and DESA share. The method says only what a batch's loss is; the
client's model, its start, the optimizer of the run's config, the shared training loop
(:meth:`~raysim.training.runtime.ClientRuntime.fit`: batch order and random streams per
client and round) and the trained weights are the same for all of them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raysim.training.runtime import ClientRuntime, make_optimizer
from raysim.vectors.weights import Weights, get_weights, set_weights

BatchLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""A batch's loss: (inputs, targets) -> scalar tensor."""


@dataclass(frozen=True)
class FitOutcome:
    """What one client's local training produced: the trained model (the client's module,
    reused for the next client: read it before training another), its weights (copied),
    the mean reported loss, the samples it holds and the steps taken (the fields
    :meth:`~raysim.algorithms.base.ClientResult.trained` reads)."""

    model: nn.Module
    weights: dict[str, np.ndarray]
    mean_loss: float
    num_samples: int
    steps: int


def fit_client(runtime: ClientRuntime, client: int, round_: int, start: Weights,
               objective: Callable[[nn.Module], BatchLoss], *,
               data: tuple[torch.Tensor, torch.Tensor] | None = None) -> FitOutcome:
    """Train ``client``'s model from ``start`` for the run's local epochs or steps on the loss
    ``objective(model)`` returns for that model (a closure over the method's extra terms),
    with a fresh optimizer of the run's config; ``data``: train on these (inputs, targets)
    instead of the client's own data."""
    training = runtime.training
    model = runtime.client_model(client)
    set_weights(model, start)
    optimizer = make_optimizer(model.parameters(), training.optimizer)
    batch_loss = objective(model)
    model.train()
    loss, samples, steps = runtime.fit(client, round_, optimizer, batch_loss,
                                       epochs=training.epochs, steps=training.local_steps,
                                       data=data)
    return FitOutcome(model, get_weights(model), loss, samples, steps)
