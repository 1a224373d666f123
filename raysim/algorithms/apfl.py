"""APFL (Deng, Kamani and Mahdavi 2020, "Adaptive personalized federated learning"): each
client mixes a personal model with the global one, by a weight it learns.

A client holds a personal model v and a mixing weight alpha. On every minibatch of its local
work it steps the global model's copy w on its own loss f(w), and the personal model on the
loss of the mixed model v_bar = alpha v + (1 - alpha) w (gradient alpha grad f(v_bar)); with
``adaptive`` it steps alpha too, by <v - w, grad f(v_bar)> (the paper's eq. for alpha's
gradient), kept in [0, 1]. It uploads w; the server averages the uploads as FedAvg. A client's
model is alpha v + (1 - alpha) w of the round's global model w (parameters mixed; running
statistics the personal model's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.params import APFLParams
from raysim.algorithms.supports import PERSONAL_MODELS_PRIVACY_REFUSAL, Supports
from raysim.configuration.schema import StrictModel
from raysim.models import build_model
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def mix(personal: Weights, global_: Weights, alpha: float,
        parameters: frozenset[str]) -> dict[str, np.ndarray]:
    """alpha v + (1 - alpha) w of the named parameters; every other entry (running
    statistics, counters) the personal model's."""
    return {name: (alpha * np.asarray(value, np.float32)
                   + (1 - alpha) * np.asarray(global_[name], np.float32)).astype(np.float32)
            if name in parameters else np.array(value)
            for name, value in personal.items()}


@register_algorithm
class APFL(FedAvg[APFLParams]):
    """FedAvg's global model plus a personal model per client, mixed with it by a learned
    alpha; each client is evaluated with its mixture."""

    params_class: ClassVar[type[StrictModel]] = APFLParams
    personalized = True
    mean_uploads: ClassVar[tuple[str, ...]] = ()
    supports: ClassVar[Supports] = replace(
        FedAvg.supports,
        privacy_refusal=PERSONAL_MODELS_PRIVACY_REFUSAL,
        asynchronous_refusal=("its personal models are mixed with the round's global model, "
                              "which clients starting from different versions do not share"))
    per_client_loop: ClassVar[str | None] = (
        "its global and personal models train together on every minibatch")

    def _parameter_names(self) -> frozenset[str]:
        cached = self.__dict__.get("_parameters")
        if cached is None:
            model = build_model(self.context.model, self.context.info)
            cached = frozenset(name for name, _ in model.named_parameters())
            self.__dict__["_parameters"] = cached
        return cached

    def _personal_module(self, runtime: ClientRuntime) -> nn.Module:
        """A second model of the run's architecture on the worker's device (v's)."""
        module = self.__dict__.get("_personal")
        if module is None:
            module = runtime.place(build_model(self.context.model, self.context.info))
            self.__dict__["_personal"] = module
        return module

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        loss_fn = loss_function(training_loss(self.context.training.loss, self.context.info))
        personal = self._personal_module(runtime)
        optimizer = self.context.training.optimizer
        names = [name for name, _ in personal.named_parameters()]
        own_parameters = list(personal.parameters())  # (set_weights copies into them)
        results = []
        for client, state in zip(clients, states, strict=True):
            own, alpha_start = ((runtime.client_initial_weights(client), self.params.alpha)
                                if state is None else state)
            set_weights(personal, own)
            personal.train()
            alpha = nn.Parameter(torch.tensor(float(alpha_start), device=runtime.device))

            def objective(model: nn.Module, alpha: nn.Parameter = alpha) -> BatchLoss:
                global_parameters = dict(model.named_parameters())

                def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                    # alpha kept in [0, 1] in the forward pass; its gradient passes through,
                    # so an alpha past a bound returns when the gradient points back
                    weight = alpha + (alpha.clamp(0.0, 1.0) - alpha).detach()
                    mixed = {name: weight * v + (1 - weight) * global_parameters[name].detach()
                             for name, v in zip(names, own_parameters, strict=True)}
                    mixed_loss = loss_fn(functional_call(personal, mixed, (inputs,)), targets)
                    return loss_fn(model(inputs), targets) + mixed_loss

                return batch_loss

            groups: list[dict[str, Any]] = [{"params": own_parameters}]
            if self.params.adaptive:
                groups.append({"params": [alpha], "lr": self.params.alpha_lr or optimizer.lr,
                               "weight_decay": 0.0})
            fitted = fit_client(runtime, client, round_, start, objective, extra_groups=groups)
            learned = float(alpha.detach().clamp(0.0, 1.0))
            results.append(ClientResult.trained(
                {"model": fitted.weights}, (get_weights(personal), learned), fitted,
                self.client_weight(fitted.num_samples), alpha=learned))
        return results

    def personal_base(self, state: Weights) -> Weights | None:
        return state

    def compose_personal(self, state: Any, base: Weights | None) -> Weights | None:
        if state is None or base is None:
            return None
        own, alpha = state
        return mix(own, base, alpha, self._parameter_names())
