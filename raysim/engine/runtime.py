"""What a client's local work runs on: the worker's data, resident model and local trainer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from raysim.data.dataset import DataInfo, to_tensor
from raysim.engine.weights import Weights
from raysim.models import build_model
from raysim.schema import OptimizerConfig, StrictModel, TrainingConfig
from raysim.seeding import numpy_rng, seed_sequence


@dataclass
class TrainOutcome:
    """The result of one client's local training."""

    mean_loss: float
    num_samples: int
    steps: int
    optimizer_state: dict[str, Any]

    def metrics(self) -> dict[str, float]:
        """Per-client numbers for the results (train_loss, num_samples, steps)."""
        return {"train_loss": self.mean_loss, "num_samples": float(self.num_samples),
                "steps": float(self.steps)}


def make_optimizer(parameters: Any, config: OptimizerConfig) -> torch.optim.Optimizer:
    """Build the configured optimizer."""
    if config.name == "sgd":
        return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    optimizer_class = torch.optim.Adam if config.name == "adam" else torch.optim.AdamW
    return optimizer_class(parameters, lr=config.lr, weight_decay=config.weight_decay)


def batch_plan(num_samples: int, batch_size: int, epochs: int | None, steps: int | None,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Positions (into a client's local data) of every minibatch of one round.

    Each epoch is a fresh permutation; a round of ``steps`` runs through as many epochs as it
    needs. A trailing batch of a single sample joins the previous batch (BatchNorm cannot
    train on one sample).
    """
    def one_epoch() -> list[np.ndarray]:
        order = rng.permutation(num_samples)
        batches = [order[i:i + batch_size] for i in range(0, num_samples, batch_size)]
        if len(batches) > 1 and len(batches[-1]) == 1:
            batches[-2:] = [np.concatenate(batches[-2:])]
        return batches

    plan: list[np.ndarray] = []
    if steps is None:
        for _ in range(epochs or 1):
            plan.extend(one_epoch())
        return plan
    while len(plan) < steps:
        plan.extend(one_epoch())
    return plan[:steps]


def rng_seed(seed: int, purpose: str, round_: int, client: int) -> int:
    """A 63-bit integer seed for the stream (seed, purpose, round, client)."""
    return int(seed_sequence(seed, purpose, round_, client).generate_state(1, np.uint64)[0] >> 1)


def warm_up(model: nn.Module, info: DataInfo, config: OptimizerConfig, device: torch.device) -> None:
    """Run one throw-away optimizer step so lazy imports and kernel selection happen before
    round 0 (keeps first-round timings honest). Leaves the model's weights as they were."""
    saved = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    optimizer = make_optimizer(model.parameters(), config)
    model.train()
    batch = torch.zeros((2, *info.input_shape), device=device)
    model(batch).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.load_state_dict(saved)


class ClientRuntime:
    """Per-worker services for the algorithms' client code.

    Holds the training arrays (zero-copy from the object store), the partition, one resident
    model per architecture (weights are loaded into it for each client, never a model per
    client) and the local training loop shared by every algorithm.
    """

    def __init__(self, *, seed: int, info: DataInfo, model_params: StrictModel,
                 training: TrainingConfig, train_x: np.ndarray, train_y: np.ndarray,
                 client_indices: list[np.ndarray], initial_weights: Weights,
                 device: torch.device):
        self.seed = seed
        self.info = info
        self.training = training
        self.train_x = train_x
        self.train_y = train_y
        self.client_indices = client_indices
        self.initial_weights = initial_weights
        self.device = device
        self._model_params = model_params
        self._models: dict[str, nn.Module] = {}

    @property
    def model(self) -> nn.Module:
        """The resident model of the run's configured architecture."""
        return self.model_for(self._model_params)

    def model_for(self, params: StrictModel) -> nn.Module:
        """The resident model for an architecture config, built on first use."""
        key = params.model_dump_json()
        if key not in self._models:
            self._models[key] = build_model(params, self.info).to(self.device)
        return self._models[key]

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's whole training set as normalised tensors on the worker's device."""
        indices = self.client_indices[client]
        x = to_tensor(self.train_x[indices], self.info).to(self.device)
        y = torch.from_numpy(self.train_y[indices]).to(self.device)
        return x, y

    def train(self, model: nn.Module, client: int, round_: int, *,
              regularizer: Callable[[], torch.Tensor] | None = None,
              optimizer_state: dict[str, Any] | None = None,
              steps_scale: int = 1) -> TrainOutcome:
        """Train ``model`` in place on the client's data for the round's local work.

        Batch order comes from the stream (seed, "batches", round, client), so the result is
        the same on any worker.
        """
        x, y = self.client_data(client)
        torch.manual_seed(int(rng_seed(self.seed, "torch", round_, client)))  # dropout etc.
        steps = None if self.training.local_steps is None else self.training.local_steps * steps_scale
        rng = numpy_rng(self.seed, "batches", round_, client)
        plan = batch_plan(len(y), self.training.batch_size, self.training.epochs, steps, rng)
        optimizer = make_optimizer(model.parameters(), self.training.optimizer)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        total_loss = torch.zeros((), device=self.device)
        seen = 0
        for positions in plan:
            index = torch.from_numpy(positions).to(self.device)
            inputs, targets = x[index], y[index]
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(inputs), targets)
            total_loss += loss.detach() * len(positions)
            if regularizer is not None:
                loss = loss + regularizer()
            loss.backward()
            optimizer.step()
            seen += len(positions)
        mean_loss = float(total_loss) / max(seen, 1)
        return TrainOutcome(mean_loss, len(y), len(plan), optimizer.state_dict())
