"""SCAFFOLD (Karimireddy et al. 2020): local steps corrected by control variates.

Each client keeps a control variate c_i, the server one c (both start at zero). In a round a
sampled client starts from the server model x, takes its K local steps with every gradient
corrected by c - c_i, refreshes c_i (option I: its gradient at x over its whole training
set; option II: c_i - c + (x - y_i) / (K lr)), and uploads its model y_i and the change
c_i+ - c_i. The server moves x by ``server_lr`` times the mean model difference and c by
|S|/N times the mean change of the control variates.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import ScaffoldParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.state_codec import persistable
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weighted_sum import WeightedSum, mean_partial, merge_partials
from raysim.vectors.weights import Weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime, TrainOutcome

ControlVariate = dict[str, np.ndarray]
"""One float32 array per trainable parameter of the model, by parameter name."""


@persistable
@dataclass
class ScaffoldState:
    """The server's model x and control variate c."""

    model: Weights
    control: ControlVariate


@register_algorithm
class Scaffold(Algorithm[ScaffoldParams, ScaffoldState]):
    """Model averaging with control variates that correct each client's drift."""

    params_class: ClassVar[type[StrictModel]] = ScaffoldParams
    params: ScaffoldParams
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    per_client_loop: ClassVar[str | None] = (
        "SCAFFOLD's control variates shift every step's gradient, which only the per-client "
        "path applies")
    supports: ClassVar[Supports] = Supports(
        privacy_refusal=("its control-variate uploads depend on the client's data and client-level DP "
            "here clips and noises weight updates only, so an epsilon would not cover them"),
        asynchronous_refusal=("its control variates are defined relative to one synchronous round's "
            "server model"),
        segmentation_refusal=None)

    @classmethod
    def config_warnings(cls, params: Any, training: Any) -> list[str]:
        optimizer = training.optimizer
        if optimizer.name == "sgd" and optimizer.momentum == 0:
            return []
        setting = (f"momentum {optimizer.momentum:g}" if optimizer.name == "sgd"
                   else f"optimizer {optimizer.name}")
        return [f"SCAFFOLD with {setting}: its control variates (option II) assume plain SGD "
                "steps, so here they only approximate the drift correction and runs can do "
                "worse than FedAvg; set training.optimizer.momentum=0 (and name: sgd) for the "
                "method as published."]

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> ScaffoldState:
        return ScaffoldState(initial_weights, zero_control(initial_weights,
                                                           self._parameter_names()))

    def broadcast(self, state: ScaffoldState, round_: int) -> dict[str, Any]:
        return {"model": state.model, "control": state.control}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return {"model": mean_partial([r.upload["model"] for _, r in results],
                                      [r.num_samples for _, r in results], self.weights_by_samples),
                "control": WeightedSum.of([r.upload["control"] for _, r in results],
                                          [1.0] * len(results))}

    def aggregate(self, state: ScaffoldState, partials: Sequence[Any],
                  round_: int) -> ScaffoldState:
        if not partials:
            return state
        merged = functools.reduce(merge_partials, partials)
        models: WeightedSum = merged["model"]
        controls: WeightedSum = merged["control"]
        sampled = controls.total_weight  # |S|: each client's change counts once
        mean_model = models.mean()
        lr = self.params.server_lr
        model = mean_model if lr == 1.0 else {  # x + eta_g (mean y - x)
            name: (np.asarray(state.model[name]) + lr * (mean_model[name] - np.asarray(
                state.model[name]))).astype(mean_model[name].dtype) for name in mean_model}
        mean_change = controls.mean()
        share = sampled / self.context.num_clients
        control = {name: (value + share * mean_change[name]).astype(np.float32)
                   for name, value in state.control.items()}
        return ScaffoldState(model, control)

    def global_weights(self, state: ScaffoldState) -> Weights:
        return state.model

    # ----- clients -----
    def corrections(self, server: ControlVariate, clients: Sequence[ControlVariate]
                    ) -> list[ControlVariate] | None:
        """Each client's gradient correction c - c_i (None: train uncorrected)."""
        return [{name: value - own[name] for name, value in server.items()} for own in clients]

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start, server_control = message["model"], message["control"]
        own = [zero_control(start, list(server_control)) if s is None else s for s in states]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients),
                                     gradient_shifts=self.corrections(server_control, own))
        results = []
        for client, control, (weights, outcome) in zip(clients, own, trained, strict=True):
            refreshed = (self._gradient_at(runtime, client, start, list(server_control))
                         if self.params.control_update == "I" else
                         self._from_steps(control, server_control, start, weights, outcome))
            change = {name: refreshed[name] - control[name] for name in control}
            results.append(ClientResult.trained({"model": weights, "control": change},
                                                refreshed, outcome))
        return results

    def _from_steps(self, control: ControlVariate, server: ControlVariate, start: Weights,
                    trained: Weights, outcome: TrainOutcome) -> ControlVariate:
        """Option II: c_i - c + (x - y_i) / (K lr)."""
        scale = 1.0 / (max(outcome.steps, 1) * self.context.training.optimizer.lr)
        return {name: (control[name] - server[name] + scale * (
            np.asarray(start[name], dtype=np.float32) - np.asarray(trained[name],
                                                                   dtype=np.float32))
                       ).astype(np.float32) for name in control}

    def _gradient_at(self, runtime: ClientRuntime, client: int, start: Weights,
                     names: list[str]) -> ControlVariate:
        """Option I: the gradient of the client's mean training loss at the server model,
        over its whole training set (in chunks of the batch size)."""
        model = runtime.client_model(client)
        set_weights(model, start)
        model.train()
        model.zero_grad(set_to_none=True)
        x, y = runtime.client_data(client)
        loss_fn = loss_function(training_loss(self.context.training.loss,
                                              self.context.info))
        size, step = len(y), self.context.training.batch_size
        for begin in range(0, size, step):
            chunk = slice(begin, min(begin + step, size))
            (loss_fn(model(x[chunk]), y[chunk]) * ((chunk.stop - begin) / size)).backward()
        parameters = dict(model.named_parameters())
        gradient = {name: _host(parameters[name].grad) for name in names}
        model.zero_grad(set_to_none=True)
        return gradient

    def _parameter_names(self) -> list[str]:
        """The trainable parameters of the run's model, in the model's order."""
        from raysim.models import build_model

        module = build_model(self.context.model, self.context.info)
        return [name for name, p in module.named_parameters() if p.requires_grad]


def zero_control(model: Weights, names: Sequence[str]) -> ControlVariate:
    """A zero control variate over the named parameters of ``model``."""
    return {name: np.zeros(np.shape(model[name]), dtype=np.float32) for name in names}


def _host(gradient: torch.Tensor | None) -> np.ndarray:
    if gradient is None:
        raise RuntimeError("a trainable parameter received no gradient")
    return gradient.detach().to("cpu", torch.float32).numpy().copy()
