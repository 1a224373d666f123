"""MOON (Li, He and Song, "Model-Contrastive Federated Learning", CVPR 2021): FedAvg whose
local objective adds a contrastive term between model representations.

In a round each sampled client trains the broadcast global model w on its data with

    loss = CE(f_w(x), y) + mu * l_con,
    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )

where z, z_glob and z_prev are the representations of the batch by the model being trained,
by the round's global model and by the client's own model after its previous round (frozen),
and sim is the cosine similarity: the local model is pulled towards the global model's
representation and pushed away from its own previous one. Before a client's first round its
previous model is the global model it starts from, which makes the term constant (both
similarities equal): raysim's choice. The authors' code (``QinbinLi/MOON``) differs: its pool
of previous models is empty in round 0 (the term is zero then, also no gradient), and a client
first sampled in a later round contrasts with its own random initialisation, kept from before
the first round; raysim's clients have no initialisation of their own (every client starts
from the broadcast), so it matters only under partial participation (docs/methods.md). The
server averages (FedAvg's round, inherited). ``mu = 0`` is FedAvg.

The representation is the model's embedding (the features before its classifier: ConvNet,
ResNet18); the authors' networks add a two-layer projection head between them (see
docs/methods.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from raysim.algorithms.base import ClientResult, RunContext, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.params import MOONParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.models import build_model
from raysim.models.registry import embedding_parts, require_embedding
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weights import Weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def contrastive_term(z: torch.Tensor, z_global: torch.Tensor, z_previous: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """MOON's l_con, the batch mean: cross-entropy of the positive pair (z, z_global) against
    the negative pair (z, z_previous) over their cosine similarities divided by tau."""
    logits = torch.stack([F.cosine_similarity(z, z_global, dim=1),
                          F.cosine_similarity(z, z_previous, dim=1)], dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


@register_algorithm
class MOON(FedAvg[MOONParams]):
    """FedAvg with MOON's model-contrastive term in every client's local objective; each
    client keeps its last trained model as the next round's negative."""

    params_class: ClassVar[type[StrictModel]] = MOONParams
    supports: ClassVar[Supports] = replace(
        FedAvg.supports, segmentation_refusal=(
            "its contrastive term compares one representation vector per image"))
    mean_uploads: ClassVar[tuple[str, ...]] = ("model",)
    per_client_loop: ClassVar[str | None] = (
        "its local objective runs two frozen models beside the trained one")

    def __init__(self, params: MOONParams, context: RunContext):
        super().__init__(params, context)
        require_embedding(context.model, context.info,
                          "MOON contrasts the representations of three models")

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        frozen_global, frozen_previous = (self._frozen(runtime), self._frozen(runtime))
        set_weights(frozen_global, start)
        embed_global, _ = embedding_parts(frozen_global)
        embed_previous, _ = embedding_parts(frozen_previous)
        loss_fn = loss_function(training_loss(self.context.training.loss,
                                              self.context.info))
        mu, temperature = self.params.mu, self.params.temperature

        def objective(model: torch.nn.Module) -> BatchLoss:
            embed, classify = embedding_parts(model)

            def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                z = embed(inputs)
                loss = loss_fn(classify(z), targets)
                if mu == 0:
                    return loss
                with torch.no_grad():
                    z_global, z_previous = embed_global(inputs), embed_previous(inputs)
                return loss + mu * contrastive_term(z, z_global, z_previous, temperature)

            return batch_loss

        results = []
        for client, state in zip(clients, states, strict=True):
            set_weights(frozen_previous, start if state is None else state)
            fitted = fit_client(runtime, client, round_, start, objective)
            results.append(ClientResult.trained({"model": fitted.weights}, fitted.weights,
                                                fitted, self.client_weight(fitted.num_samples)))
        return results

    def _frozen(self, runtime: ClientRuntime) -> torch.nn.Module:
        """A model of the run's architecture on the worker's device, in eval mode and without
        gradients: the global or the previous model of the contrastive term."""
        module = runtime.place(build_model(self.context.model, self.context.info))
        module.eval()
        for parameter in module.parameters():
            parameter.requires_grad_(False)
        return module

    def personal_weights(self, state: Any) -> Weights | None:
        return None  # (the kept model is the next round's negative, not a personal model)
