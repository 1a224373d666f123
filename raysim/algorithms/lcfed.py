"""LC-Fed (Wang, Jin and Wang, ECCV 2022, "Personalizing federated medical image segmentation
via local calibration"), after the authors' code (github.com/jcwang123/FedLC).

Every client trains LC-Fed's network (``model.name: lcfed_unet``,
:mod:`raysim.models.local_calibration`) with its own site's one-hot vector in the channel
selection. The segmentation head, the head calibration and the site vector stay on the client;
every other layer (the U-Net and the channel selection's embedding and gates) is averaged by
the server, a plain mean by default as in the authors' code.

A round, first stage: the head trains alone for ``head_steps`` steps, then the shared layers
with the head frozen for the run's local work, on the run's loss plus ``contrast_weight``
times the contrastive site-embedding term (minus the mean squared distance of the own site's
channel gates from the other sites' on the same features). Second stage, the last
``calibration_rounds`` rounds: the head calibration trains alone, on features and predictions
of the frozen U-Net, with the heads every site held at the round's start (sent by the
server), for the run's local work. A client's model is the round's shared layers with its own
head, calibration and site.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.params import LCFedParams
from raysim.algorithms.partial_sharing import PartialSharing
from raysim.configuration.schema import StrictModel
from raysim.errors import ConfigError
from raysim.models.layer_split import head_entries
from raysim.models.local_calibration import LocalCalibrationNet, SiteChannelSelection
from raysim.training.client_fit import BatchLoss, FitOutcome, fit_client
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weighted_sum import WeightedSum, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.context import RunContext
    from raysim.training.runtime import ClientRuntime

HEAD_WEIGHT, HEAD_BIAS = "head.weight", "head.bias"


@register_algorithm
class LCFed(PartialSharing[LCFedParams]):
    """Shared U-Net and channel selection; each client's head, calibration and site its own;
    the head calibration trained in the run's last ``calibration_rounds`` rounds."""

    params_class: ClassVar[type[StrictModel]] = LCFedParams
    per_client_loop: ClassVar[str | None] = (
        "its head and shared layers are trained in phases with different frozen layers")

    def __init__(self, params: LCFedParams, context: RunContext):
        model = context.model
        if getattr(model, "name", None) != "lcfed_unet":
            raise ConfigError(
                f"Invalid config field `model.name` = {getattr(model, 'name', None)!r}: LC-Fed "
                "trains its own network (a U-Net with a site-conditioned channel selection and "
                "a head calibration). Set `model.name: lcfed_unet` (with the U-Net's channels "
                "and `sites` = the number of clients).")
        if model.sites != context.num_clients:  # type: ignore[attr-defined]
            raise ConfigError(
                f"Invalid config field `model.sites` = {model.sites}: LC-Fed gives each of "  # type: ignore[attr-defined]
                f"the run's {context.num_clients} clients its own site, so the network must "
                f"know {context.num_clients} sites. Set `model.sites: {context.num_clients}`.")
        if params.calibration_rounds > context.training.rounds:
            raise ConfigError(
                f"Invalid config field `algorithm.calibration_rounds` = "
                f"{params.calibration_rounds}: the run has {context.training.rounds} rounds. "
                "Set it to at most training.rounds.")
        super().__init__(params, context)

    @classmethod
    def tail_phase(cls, params: Any) -> tuple[str, int] | None:
        return (("algorithm.calibration_rounds", params.calibration_rounds)
                if params.calibration_rounds else None)

    def private_entries(self, model: nn.Module) -> frozenset[str]:
        head, site = _head_and_site(model)
        return head | {site, "calibrating"} | {
            name for name in model.state_dict() if name.startswith("calibration.")}

    def _layout(self) -> tuple[frozenset[str], str]:
        """The run's head entries and its channel selection's site entry (cached: the
        architecture is the run's constant)."""
        cached = self.__dict__.get("_head_and_site")
        if cached is None:
            from raysim.models import build_model

            cached = _head_and_site(build_model(self.context.model, self.context.info))
            self.__dict__["_head_and_site"] = cached
        return cached

    def _calibrating(self, round_: int) -> bool:
        return round_ >= self.context.training.rounds - self.params.calibration_rounds

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> dict[str, Any]:
        sites = self.context.num_clients
        bias = np.asarray(initial_weights[HEAD_BIAS], np.float32)
        head = np.asarray(initial_weights[HEAD_WEIGHT], np.float32).reshape(len(bias), -1)
        return {"model": dict(initial_weights), "heads": np.repeat(head[None], sites, 0),
                "biases": np.repeat(bias[None], sites, 0)}

    def broadcast(self, state: Any, round_: int) -> dict[str, Any]:
        message: dict[str, Any] = {"model": self.shared_part(state["model"])}
        if self._calibrating(round_):
            message["heads"] = (state["heads"], state["biases"])
        return message

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return {"mean": WeightedSum.of([r.upload["model"] for _, r in results],
                                       [r.weight for _, r in results]),
                "heads": [(client, r.upload["head"]) for client, r in results]}

    def aggregate(self, state: Any, partials: Sequence[Any], round_: int) -> Any:
        if not partials:
            return state
        heads, biases = state["heads"].copy(), state["biases"].copy()
        for client, (weight, bias) in partials[0]["heads"]:
            heads[client], biases[client] = weight, bias
        return {"model": {**state["model"], **weighted_mean([partials[0]["mean"]])},
                "heads": heads, "biases": biases}

    def personal_base(self, state: Any) -> Weights | None:
        return self.shared_part(state["model"])

    def global_weights(self, state: Any) -> Weights | None:
        return None

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        results = []
        for client, state in zip(clients, states, strict=True):
            own = (self.private_part(runtime.client_initial_weights(client)) if state is None
                   else dict(state))
            own = {**own, **self._site_entries(client, own, round_, message)}
            weights, outcome = self._train(runtime, client, round_, {**message["model"], **own})
            head = (np.array(weights[HEAD_WEIGHT]).reshape(len(weights[HEAD_BIAS]), -1),
                    np.array(weights[HEAD_BIAS]))
            results.append(ClientResult.trained(
                {"model": self.shared_part(weights), "head": head}, self.private_part(weights),
                outcome, weight=self.client_weight(outcome.num_samples)))
        return results

    def _site_entries(self, client: int, own: Weights, round_: int,
                      message: dict[str, Any]) -> dict[str, np.ndarray]:
        """The client's site vector, the stage flag and (second stage) the sites' heads."""
        site_name = self._layout()[1]
        site = np.zeros(self.context.num_clients, np.float32)
        site[client] = 1
        entries = {site_name: site, "calibration.site": site,
                   "calibrating": np.asarray(float(self._calibrating(round_)), np.float32)}
        if "heads" in message:
            heads, biases = message["heads"]
            entries["calibration.peer_weight"] = np.asarray(heads, np.float32).reshape(
                np.shape(own["calibration.peer_weight"]))
            entries["calibration.peer_bias"] = np.asarray(biases, np.float32)
        return entries

    def _train(self, runtime: ClientRuntime, client: int, round_: int, start: Weights
               ) -> tuple[Weights, FitOutcome]:
        loss_fn = loss_function(training_loss(self.context.training.loss, self.context.info))
        weight = self.params.contrast_weight

        def objective(model: nn.Module) -> BatchLoss:
            assert isinstance(model, LocalCalibrationNet)
            selection = model.selection

            def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                loss = loss_fn(model(inputs), targets)
                if weight == 0 or float(model.calibrating) == 1:
                    return loss
                return loss + weight * contrastive_site_term(selection, client)

            return batch_loss

        private = self._private()
        if self._calibrating(round_):
            tuned = fit_client(runtime, client, round_, start, objective,
                               trainable=lambda name: name.startswith("calibration."))
            return tuned.weights, tuned
        head = self._layout()[0]
        if self.params.head_steps:
            start = fit_client(runtime, client, round_, start, objective,
                               trainable=lambda name: name in head, steps=self.params.head_steps,
                               stream="lcfed-head").weights
        shared = fit_client(runtime, client, round_, start, objective,
                            trainable=lambda name: name not in private)
        return shared.weights, shared


def _head_and_site(model: nn.Module) -> tuple[frozenset[str], str]:
    """LC-Fed's network's head entries and the state entry of its channel selection's site."""
    assert isinstance(model, LocalCalibrationNet)
    site = next(f"{name}.site" for name, module in model.named_modules()
                if isinstance(module, SiteChannelSelection))
    return head_entries(model), site


def contrastive_site_term(selection: SiteChannelSelection, site: int) -> torch.Tensor:
    """Minus the mean over the other sites of the squared distance between the channel gates
    of the last forward pass (the client's own site) and those of another site's embedding on
    the same features (no gradient through the other sites' gates)."""
    assert selection.last_input is not None and selection.last_gate is not None
    sites = len(selection.site)
    distances = []
    for other in range(sites):
        if other == site:
            continue
        one_hot = torch.zeros(sites, device=selection.site.device)
        one_hot[other] = 1
        with torch.no_grad():
            gate = selection.channel_gate(selection.last_input, one_hot)
        distances.append(F.mse_loss(selection.last_gate, gate))
    return -torch.stack(distances).mean()
