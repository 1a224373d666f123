"""MH-pFLID (Xie et al., ICML 2024): model-heterogeneous personalized FL through a shared
messenger, with an information receiver and transmitter per client.

Every client keeps, resident on its worker, its own local model (any architecture of the zoo,
split into body and head), its receiver and transmitter and their Adam states. A round:

1. *Injection* (messenger frozen, ``injection_epochs`` epochs, Adam ``injection_lr``): loss =
   ``injection_local_weight`` * CE(L_h(L_b(x)), y) + ``injection_messenger_weight`` *
   CE(M_h(R(L_b(x), M_b(x))), y); gradients reach the local model and the receiver.
2. *Distillation* (local model frozen, ``distillation_epochs`` epochs, Adam
   ``distillation_lr``): loss = ``distillation_messenger_weight`` * CE(M_h(T(L_b(x), M_b(x))), y)
   + ``distillation_kl_weight`` * KL(softmax(local) || softmax(messenger)); gradients reach the
   messenger and the transmitter.
3. The client uploads its messenger (body and head); the server averages them (sample-weighted,
   BatchNorm buffers included) and sends the average back next round.

Inference uses the local model alone (``personal_weights``). The ablations of the paper's Table
6 are switches: ``share_messenger_body`` / ``share_messenger_head`` (false: that part stays on
the client and is never averaged), ``receiver`` / ``transmitter: add`` (feature addition instead
of attention). Rounds use ``training.batch_size`` and the two Adam optimizers above
(``training.optimizer`` and ``training.local_epochs`` do not apply).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import MHpFLIDParams
from raysim.algorithms.supports import Supports
from raysim.errors import field_error
from raysim.models import build_model, segmentation_models
from raysim.models.messenger import InformationExchange, Messenger, SegmentationMessenger, fit_to, grid_of
from raysim.models.registry import SIGNAL_MODELS
from raysim.models.split import ZOO, SplitModel
from raysim.seeding import torch_generator
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weighted_sum import WeightedSum, mean_partial, weighted_mean
from raysim.vectors.weights import Weights, get_weights, release_state, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

def _seeded_weights(module_factory: Any, seed: int, purpose: str, client: int = -1) -> Weights:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(torch_generator(seed, purpose, client=client).initial_seed())
        return get_weights(module_factory())


@register_algorithm
class MHpFLID(Algorithm[MHpFLIDParams, Weights]):
    """Injection and distillation through a shared, server-averaged messenger."""

    params_class = MHpFLIDParams
    supports: ClassVar[Supports] = Supports(
        asynchronous_refusal="its messenger is averaged over the clients of one synchronous round",
        privacy_refusal=("its clients upload a messenger model trained by distillation from their private "
            "models; privatizing it is not implemented"),
        heterogeneous=True,
        multi_label_refusal=("its messenger is trained by softmax distillation (KL between class "
            "distributions), which has no per-label counterpart here"),
        volume_refusal=("its messenger (cross-attention receiver/transmitter over 2D feature maps) and "
            "its heterogeneous zoo are 2D models"),
        needs_images=("its local models and its messenger are convolutional or sequence networks "
            "split into a body and a head"),
        takes_signals=True, segmentation_refusal=None)
    personalized = True
    headline_metric = "personal_accuracy"  # the paper's tables: each client's own test share

    def __init__(self, params: MHpFLIDParams, context: RunContext):
        super().__init__(params, context)
        for client in range(context.num_clients):
            architecture = context.architecture(client)
            if not isinstance(build_model(architecture, context.info), SplitModel):
                where = "clients.architectures" if context.architectures else "model.name"
                raise field_error(where, architecture.name,  # type: ignore[attr-defined]
                                  "MH-pFLID needs local models split into body and head; "
                                  f"use one of {', '.join(ZOO)} for images, "
                                  f"{SIGNAL_MODELS} for signals, or "
                                  f"{', '.join(segmentation_models())} for masks")
        if not params.share_messenger_body and not params.share_messenger_head:
            raise field_error("algorithm.share_messenger_body", False,
                              "with neither the messenger body nor its head shared nothing is "
                              "averaged and clients never communicate; use algorithm `local` "
                              "for that baseline")
        if context.info.segmentation and params.tokens == "channel":
            raise field_error("algorithm.tokens", "channel", "a segmentation messenger decodes "
                              "a map of spatial tokens; use tokens: spatial")
        self.segmentation = context.info.segmentation
        # the stages' supervised loss: cross-entropy on labels, the run's loss on masks
        self.task_loss: Any = (loss_function(training_loss(context.training.loss, context.info))
                               if self.segmentation else F.cross_entropy)
        self._messenger: Messenger | SegmentationMessenger | None = None
        self._exchanges: dict[tuple[str, int], InformationExchange] = {}

    # ----- shared pieces -----
    def build_messenger(self) -> Messenger | SegmentationMessenger:
        """A fresh messenger for this run's data (Table 10's for a segmentation task)."""
        info = self.context.info
        if self.segmentation:
            return SegmentationMessenger(info.input_shape[0], info.num_classes,
                                         self.params.segmentation_messenger_widths,
                                         self.params.segmentation_messenger_decoder)
        return Messenger(info.input_shape[0], info.num_classes, self.params.messenger_widths,
                         self.params.messenger_hidden, self.params.messenger_input_size,
                         dims=1 if info.kind == "signal" else 2)

    def shared_models(self) -> dict[str, nn.Module]:
        return {"messenger": self.build_messenger()}

    def _shared(self, name: str) -> bool:
        return (self.params.share_messenger_body if name.startswith("body.")
                else self.params.share_messenger_head)

    def _build_exchange(self, role: str, local_channels: int) -> InformationExchange:
        p = self.params
        width = p.segmentation_messenger_widths[-1] if self.segmentation else p.messenger_widths[2]
        return InformationExchange(
            local_channels, width,
            query_from="messenger" if role == "receiver" else "local",
            mode=p.receiver if role == "receiver" else p.transmitter,
            tokens=p.tokens, grid=p.token_grid, dense=self.segmentation)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> Weights:
        return _seeded_weights(self.build_messenger, self.context.seed, "messenger-init")

    def broadcast(self, state: Weights, round_: int) -> dict[str, Any]:
        return {"messenger": {k: v for k, v in state.items() if self._shared(k)}}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        return mean_partial([r.upload["messenger"] for _, r in results],
                            [r.num_samples for _, r in results], self.weights_by_samples)

    def aggregate(self, state: Weights, partials: Sequence[WeightedSum], round_: int) -> Weights:
        return {**state, **weighted_mean(partials)} if partials else state

    # ----- client -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        return [self._client_round(runtime, c, round_, message["messenger"], s)
                for c, s in zip(clients, states, strict=True)]

    def _initial_state(self, runtime: ClientRuntime, client: int) -> dict[str, Any]:
        channels = _split_model(runtime, client).feature_channels
        seed = self.context.seed
        messenger = _seeded_weights(self.build_messenger, seed, "messenger-init")
        return {
            "local": runtime.client_initial_weights(client),
            "receiver": _seeded_weights(lambda: self._build_exchange("receiver", channels),
                                        seed, "receiver-init", client),
            "transmitter": _seeded_weights(lambda: self._build_exchange("transmitter", channels),
                                           seed, "transmitter-init", client),
            "private_messenger": {k: v for k, v in messenger.items() if not self._shared(k)},
            "injection_adam": None, "distillation_adam": None,
        }

    def _modules(self, runtime: ClientRuntime, client: int
                 ) -> tuple[SplitModel, Messenger | SegmentationMessenger, InformationExchange,
                            InformationExchange]:
        local = _split_model(runtime, client)
        if self._messenger is None:
            self._messenger = runtime.place(self.build_messenger())
        exchange = []
        for role in ("receiver", "transmitter"):
            key = (role, local.feature_channels)
            if key not in self._exchanges:
                self._exchanges[key] = runtime.place(self._build_exchange(role, key[1]))
            exchange.append(self._exchanges[key])
        return local, self._messenger, exchange[0], exchange[1]

    def _client_round(self, runtime: ClientRuntime, client: int, round_: int,
                      shared_messenger: Weights, state: dict[str, Any] | None) -> ClientResult:
        state = dict(state or self._initial_state(runtime, client))
        local, messenger, receiver, transmitter = self._modules(runtime, client)
        set_weights(local, state["local"])
        set_weights(messenger, {**shared_messenger, **state["private_messenger"]})
        set_weights(receiver, state["receiver"])
        set_weights(transmitter, state["transmitter"])
        injection_loss, samples, injection_steps = self._inject(
            runtime, client, round_, local, messenger, receiver, state)
        distillation_loss, _, distillation_steps = self._distill(
            runtime, client, round_, local, messenger, transmitter, state)
        trained = get_weights(messenger)
        change = _relative_change(shared_messenger, trained)
        state.update(local=release_state(local), receiver=release_state(receiver),
                     transmitter=release_state(transmitter),  # stay on the device
                     private_messenger={k: v for k, v in trained.items() if not self._shared(k)})
        upload = {"messenger": {k: v for k, v in trained.items() if self._shared(k)}}
        metrics = {"distillation_loss": distillation_loss, "messenger_change": change,
                   "steps": float(injection_steps + distillation_steps)}
        return ClientResult(upload, state, metrics, samples, injection_loss)

    def _inject(self, runtime: ClientRuntime, client: int, round_: int, local: SplitModel,
                messenger: Messenger | SegmentationMessenger, receiver: InformationExchange,
                state: dict[str, Any]
                ) -> tuple[float, int, int]:
        """Knowledge injection: train the local model and the receiver, messenger frozen."""
        p = self.params
        optimizer = torch.optim.Adam([*local.parameters(), *receiver.parameters()],
                                     lr=p.injection_lr)
        if state["injection_adam"] is not None:
            optimizer.load_state_dict(state["injection_adam"])
        local.train()
        receiver.train()
        messenger.eval()
        x, y = runtime.client_data(client)
        # the frozen messenger (eval mode) maps each sample the same way in every epoch:
        # computed once per stage, not once per batch and epoch
        messenger_maps = _frozen_outputs(messenger.feature_map, x, runtime.training.batch_size)

        def loss(index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            features = local.body(x[index])
            messenger_logits = messenger.head(receiver(features, messenger_maps[index]))
            if self.segmentation:
                messenger_logits = fit_to(messenger_logits, y)
            return (p.injection_local_weight * self.task_loss(local.head(features), y)
                    + p.injection_messenger_weight * self.task_loss(messenger_logits, y))

        with _frozen(messenger):
            outcome = _stage(runtime, client, round_, optimizer, loss, p.injection_epochs,
                             "mhpflid-injection", y)
        state["injection_adam"] = optimizer.state_dict()
        return outcome

    def _distill(self, runtime: ClientRuntime, client: int, round_: int, local: SplitModel,
                 messenger: Messenger | SegmentationMessenger, transmitter: InformationExchange,
                 state: dict[str, Any]) -> tuple[float, int, int]:
        """Knowledge distillation: train the messenger and the transmitter, local model frozen."""
        p = self.params
        optimizer = torch.optim.Adam([*messenger.parameters(), *transmitter.parameters()],
                                     lr=p.distillation_lr)
        if state["distillation_adam"] is not None:
            optimizer.load_state_dict(state["distillation_adam"])
        local.eval()
        messenger.train()
        transmitter.train()
        x, y = runtime.client_data(client)
        # the frozen local model (eval mode): its features and predictions once per stage
        features, local_log_probs = self._frozen_local(local, messenger, x,
                                                       runtime.training.batch_size)

        def loss(index: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            messenger_logits = messenger.head(transmitter(features[index],
                                                          messenger.feature_map(x[index])))
            if self.segmentation:  # per-pixel KL, averaged over the pixels
                messenger_logits = fit_to(messenger_logits, y)
                kl = F.kl_div(F.log_softmax(messenger_logits, dim=1), local_log_probs[index],
                              reduction="none", log_target=True).sum(dim=1).mean()
            else:
                kl = F.kl_div(F.log_softmax(messenger_logits, dim=1), local_log_probs[index],
                              reduction="batchmean", log_target=True)
            return (p.distillation_messenger_weight * self.task_loss(messenger_logits, y)
                    + p.distillation_kl_weight * kl)

        with _frozen(local):
            outcome = _stage(runtime, client, round_, optimizer, loss, p.distillation_epochs,
                             "mhpflid-distillation", y)
        state["distillation_adam"] = optimizer.state_dict()
        return outcome

    def _frozen_local(self, local: SplitModel, messenger: Messenger | SegmentationMessenger,
                      x: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The frozen local model's body features and log-probabilities for every sample; for
        a segmentation task the features pooled to the messenger's grid (all the dense
        transmitter reads), so full-resolution maps are never held for the whole share."""
        if not self.segmentation:
            features = _frozen_outputs(local.body, x, batch_size)
            return features, F.log_softmax(_frozen_outputs(local.head, features, batch_size),
                                           dim=1)
        with torch.no_grad():
            grid = grid_of(messenger.feature_map(x[:1]))
            pooled, log_probs = [], []
            for start in range(0, len(x), batch_size):
                body = local.body(x[start:start + batch_size])
                pooled.append(F.adaptive_avg_pool2d(body, grid))
                log_probs.append(F.log_softmax(local.head(body), dim=1))
        return torch.cat(pooled), torch.cat(log_probs)

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state["local"]


def _stage(runtime: ClientRuntime, client: int, round_: int, optimizer: torch.optim.Optimizer,
           loss: Any, epochs: int, stream: str, y: torch.Tensor) -> tuple[float, int, int]:
    """One training stage of ``epochs`` epochs with its own batch stream (0 epochs: skipped);
    ``loss(index, y)`` gets each batch's sample positions in the client's data."""
    if epochs == 0:
        return math.nan, len(y), 0
    positions = torch.arange(len(y), device=y.device)
    return runtime.fit(client, round_, optimizer, loss, epochs=epochs, stream=stream,
                       data=(positions, y))


def _frozen_outputs(module: Any, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A frozen module's outputs for every sample, computed in batches without gradients."""
    with torch.no_grad():
        return torch.cat([module(x[start:start + batch_size])
                          for start in range(0, len(x), batch_size)])


def _relative_change(before: Weights, after: Weights) -> float:
    """||after - before|| / ||before|| over the trainable tensors both hold (BatchNorm running
    statistics, which jump in the first batches whatever the learning rate, left out)."""
    keys = [k for k in before if k in after and before[k].dtype.kind == "f"
            and ".running_" not in k]
    moved = sum(float(np.sum((after[k].astype(np.float64) - before[k]) ** 2)) for k in keys)
    size = sum(float(np.sum(before[k].astype(np.float64) ** 2)) for k in keys)
    return math.sqrt(moved / size) if size > 0 else math.nan


def _split_model(runtime: ClientRuntime, client: int) -> SplitModel:
    """A client's resident model (MH-pFLID's clients run split architectures)."""
    return cast(SplitModel, runtime.client_model(client))


class _frozen:
    """Context manager: the module's parameters take no gradients inside the block."""

    def __init__(self, module: nn.Module):
        self.parameters = [p for p in module.parameters() if p.requires_grad]

    def __enter__(self) -> None:
        for parameter in self.parameters:
            parameter.requires_grad_(False)

    def __exit__(self, *_: object) -> None:
        for parameter in self.parameters:
            parameter.requires_grad_(True)
