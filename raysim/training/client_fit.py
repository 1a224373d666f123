"""One client's round of local training under a method's own objective: the shell that MOON,
FedMix, FedGen, FedGAN and DESA share. The method says only what a batch's loss is; the
client's model, its start, the optimizer of the run's config, the shared training loop
(:meth:`~raysim.training.runtime.ClientRuntime.fit`: batch order and random streams per
client and round) and the trained weights are the same for all of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
               data: tuple[torch.Tensor, torch.Tensor] | None = None,
               trainable: Callable[[str], bool] | None = None,
               epochs: int | None = None, steps: int | None = None,
               stream: str = "batches",
               extra_groups: Sequence[dict[str, Any]] = ()) -> FitOutcome:
    """Train ``client``'s model from ``start`` for the run's local epochs or steps on the loss
    ``objective(model)`` returns for that model (a closure over the method's extra terms),
    with a fresh optimizer of the run's config; ``data``: train on these (inputs, targets)
    instead of the client's own data. ``trainable``: which parameters (by state name) the
    optimizer steps, the others frozen for this fit (FedRep's head and body phases);
    ``epochs`` or ``steps``: this many epochs or steps instead of the run's local work, its
    batches drawn from ``stream``; ``extra_groups``: optimizer parameter groups outside the model that the
    objective trains too (APFL's personal model and mixing weight, each group's own options
    beside ``params`` overriding the run's optimizer config)."""
    training = runtime.training
    model = runtime.client_model(client)
    set_weights(model, start)
    frozen = [] if trainable is None else [
        parameter for name, parameter in model.named_parameters()
        if parameter.requires_grad and not trainable(name)]
    for parameter in frozen:
        parameter.requires_grad_(False)
    try:
        trained = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(
            [{"params": trained}, *extra_groups] if extra_groups else trained,
            training.optimizer)
        batch_loss = objective(model)
        model.train()
        loss, samples, steps = runtime.fit(
            client, round_, optimizer, batch_loss,
            epochs=training.epochs if epochs is None and steps is None else epochs,
            steps=training.local_steps if epochs is None and steps is None else steps,
            data=data, stream=stream)
    finally:
        for parameter in frozen:
            parameter.requires_grad_(True)
    return FitOutcome(model, get_weights(model), loss, samples, steps)
