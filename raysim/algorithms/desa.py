"""DESA (Huang et al., "Overcoming Data and Model Heterogeneities in Decentralized Federated
Learning via Synthetic Anchors", ICML 2024): clients share synthetic anchor data once, then
each trains its own model against the anchors and the other clients' logits on them; no model
is ever averaged. As the authors' code runs it (``ubc-tea/DESA``, ``iterative_desa.py``):

- **Anchors** (round 0): every client condenses ``images_per_class`` images for every class
  from N(0, 1) noise by distribution matching: each step draws a freshly initialised model of
  its architecture and moves the synthetic images so that their mean embedding matches that
  of a real batch per class (the same augmentation on both; SGD, ``image_lr`` 1, momentum
  0.5). A class the client holds no sample of keeps its noise. The server averages the
  clients' images slot by slot (same class, same position): the global anchor set, which every
  client then trains with.
- **Rounds 1..**: each client trains its own model (its persistent state; from its
  architecture's initial weights) for the round's local work on its data joined with the
  anchors: lambda_ori CE on the batch, + lambda_kd [(1 - w) CE + w T^2 KL(student/T,
  teacher/T)] on the next anchor batch, where the teacher is the mean of the other clients'
  logits on those anchors (sent at the end of their previous round: the logits their models
  give at the start of this one; none in round 1, whose teachers would be untrained models),
  + lambda_reg times the supervised contrastive loss (temperature 0.07) between the batch's
  features and the (detached) features of a random anchor batch. It then sends its logits on
  the anchors.

Each client's model is evaluated on its own test share and on the global test set (the mean
over clients), as for local training. Where raysim differs from the authors' code (the random
model of the client's own architecture in condensation, a teacher of every peer seen so far):
docs/methods.md's deviation table.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import DESAParams
from raysim.algorithms.supports import Supports
from raysim.condensation.matching import MatchingSettings, RealData, condense, split_by_class
from raysim.condensation.synthetic import noise_images
from raysim.configuration.schema import StrictModel
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.registry import embedding_parts, require_embedding
from raysim.seeding import numpy_rng, torch_generator
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def supervised_contrastive(features: torch.Tensor, labels: torch.Tensor,
                           temperature: float) -> torch.Tensor:
    """The supervised contrastive loss (Khosla et al. 2020; the authors' ``SupConLoss`` with one
    view, ``contrast_mode='all'`` and base temperature = temperature) of L2-normalised
    ``features``: for each sample, minus the mean log-probability of its positives (same
    label, itself excluded) among all other samples; 0 for a sample without positives."""
    features = F.normalize(features, dim=1)
    logits = features @ features.T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    others = 1.0 - torch.eye(len(features), device=features.device)
    positives = (labels[:, None] == labels[None, :]).to(features.dtype) * others
    log_prob = logits - torch.log((torch.exp(logits) * others).sum(1, keepdim=True))
    counts = positives.sum(1).clamp(min=1.0)
    return -((positives * log_prob).sum(1) / counts).mean()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
                      temperature: float, weight: float) -> torch.Tensor:
    """The authors' ``calculate_kd_loss``: (1 - weight) CE(student, labels) + weight T^2
    KL(softmax(teacher / T) || softmax(student / T)), the KL averaged over every entry (their
    ``nn.KLDivLoss()``)."""
    target = F.log_softmax(teacher / temperature, dim=1)
    soft = (target.exp() * (target - F.log_softmax(student / temperature, dim=1))).mean()
    return (1 - weight) * F.cross_entropy(student, labels) + weight * temperature ** 2 * soft


def peer_teacher(peer_logits: dict[int, np.ndarray], client: int) -> np.ndarray | None:
    """The distillation target of ``client``: the mean of the other clients' logits on the
    anchors (None when no other client has sent any yet)."""
    others = [logits for other, logits in sorted(peer_logits.items()) if other != client]
    return np.mean(others, axis=0).astype(np.float32) if others else None


@register_algorithm
class DESA(Algorithm[DESAParams, dict[str, Any]]):
    """Synthetic anchors shared once, then per-client training with distillation towards the
    other clients' logits on them and a contrastive pull towards their features."""

    params_class: ClassVar[type[StrictModel]] = DESAParams
    supports: ClassVar[Supports] = Supports(
        cross_entropy_only="DESA trains with cross-entropy and distils class softmaxes",
        heterogeneous=True,
        needs_images="its anchors are images condensed per class",
        privacy_refusal=("its anchors are condensed from raw data and its logits are released every "
            "round, and client-level DP here clips and noises weight updates only"),
        asynchronous_refusal=("its clients distil towards the logits their peers sent in the previous "
            "synchronous round"),
        multi_label_refusal="its anchors are condensed per class and distilled with class softmaxes",
        volume_refusal="its anchor condensation augments 2D images")
    personalized: ClassVar[bool] = True
    per_client_loop: ClassVar[str | None] = (
        "its local objective joins the client's data with the anchors and distils towards "
        "the other clients' logits")

    def __init__(self, params: DESAParams, context: RunContext):
        super().__init__(params, context)
        if context.downsample and any(factor != 1 for factor in context.downsample):
            raise ConfigError(
                "DESA's clients share one anchor set at the dataset's resolution, so every "
                "client must train at that resolution; remove the per-client downsampling "
                "from clients.architectures for DESA.")
        for client in range(context.num_clients):
            require_embedding(context.architecture(client), context.info,
                              "DESA's contrastive term compares the models' features")

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> dict[str, Any]:
        return {"anchors": None, "logits": {}}

    def broadcast(self, state: dict[str, Any], round_: int) -> dict[str, Any]:
        if state["anchors"] is None:
            return {}
        return {"anchors": state["anchors"], "peer_logits": state["logits"]}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> list[dict[str, Any]]:
        return [{"client": client, **result.upload} for client, result in results]

    def aggregate(self, state: dict[str, Any], partials: Sequence[list[dict[str, Any]]],
                  round_: int) -> dict[str, Any]:
        uploads = sorted((u for partial in partials for u in partial),
                         key=lambda upload: upload["client"])
        if not uploads:
            return state
        if state["anchors"] is None:  # round 0: the slot-by-slot mean of the clients' anchors
            images = np.mean([u["anchors"]["x"] for u in uploads], axis=0, dtype=np.float64)
            anchors = {"x": images.astype(np.float32), "y": uploads[0]["anchors"]["y"]}
            return {"anchors": anchors, "logits": {}}
        logits = dict(state["logits"])
        logits.update({u["client"]: u["logits"] for u in uploads})
        return {**state, "logits": logits}

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        results = []
        for client, state in zip(clients, states, strict=True):
            start = runtime.client_initial_weights(client) if state is None else state
            if "anchors" not in message:
                model = runtime.client_model(client)
                set_weights(model, start)
                results.append(self._condense(runtime, model, client))
            else:
                results.append(self._train(runtime, start, client, round_, message))
        return results

    def _condense(self, runtime: ClientRuntime, model: torch.nn.Module,
                  client: int) -> ClientResult:
        """Round 0: the client's anchors (every class, noise where it holds no sample)."""
        p, info, seed = self.params, runtime.info, self.context.seed
        indices = runtime.client_indices[client]
        labels = runtime.train_y[indices].reshape(-1)
        sizes = {c: p.images_per_class for c in range(info.num_classes)}
        start = noise_images(sizes, info.input_shape,
                             torch_generator(seed, "anchor-init", client=client))
        synthetic = {c: torch.tensor(start[c], device=runtime.device, requires_grad=True)
                     for c in sizes if np.any(labels == c)}
        loss = float("nan")
        if synthetic:
            settings = MatchingSettings(p.iterations, p.image_lr, p.momentum, p.real_per_class,
                                        clip=math.inf, augmentation=p.augmentation.operations,
                                        augmentation_mode=p.augmentation.mode)
            real = RealData(runtime.train_x, {c: indices[labels == c] for c in synthetic})
            loss = condense(synthetic, real, info, settings,
                            self._random_model_loss(runtime, client),
                            numpy_rng(seed, "anchor-batches", client=client),
                            numpy_rng(seed, "anchor-augment", client=client).integers(
                                0, 2**62, size=settings.iterations))
        images = np.concatenate([synthetic[c].detach().cpu().numpy() if c in synthetic
                                 else start[c] for c in sorted(sizes)])
        anchor_labels = np.repeat(sorted(sizes), p.images_per_class).astype(np.int64)
        state = get_weights(model)
        upload = {"anchors": {"x": images.astype(np.float32), "y": anchor_labels}}
        return ClientResult(upload, state, {"matching_loss": loss}, len(indices))

    def _random_model_loss(self, runtime: ClientRuntime, client: int) -> Any:
        """The distribution-matching loss of one step: the squared distance of the class means
        of the real and synthetic embeddings under a freshly drawn model of the client's
        architecture (train mode), one per step."""
        architecture, info, seed = runtime.architecture(client), runtime.info, self.context.seed
        steps = iter(range(2**62))

        def loss(real: torch.Tensor, syn: torch.Tensor, real_sizes: list[int],
                 syn_sizes: list[int]) -> torch.Tensor:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(torch_generator(seed, "anchor-model", next(steps),
                                                  client).initial_seed())
                network = runtime.place(build_model(architecture, info))
            network.train().requires_grad_(False)
            embed = embedding_parts(network)[0]
            real_embedding = embed(real).detach()
            syn_embedding = embed(syn)
            return sum((r.mean(0) - s.mean(0)).pow(2).sum() for r, s in zip(
                split_by_class(real_embedding, real_sizes),
                split_by_class(syn_embedding, syn_sizes), strict=True))  # type: ignore[return-value]

        return loss

    def _anchor_logits(self, runtime: ClientRuntime, model: torch.nn.Module,
                       images: np.ndarray) -> np.ndarray:
        """The model's float32 logits on the anchors, in eval mode."""
        model.eval()
        with torch.no_grad():
            logits = model(torch.from_numpy(images).to(runtime.device)).float().cpu().numpy()
        model.train()
        return logits  # type: ignore[no-any-return]

    def _train(self, runtime: ClientRuntime, start: Weights, client: int, round_: int,
               message: dict[str, Any]) -> ClientResult:
        """A training round on the client's data joined with the anchors (module docstring)."""
        p, training = self.params, self.context.training
        anchors_x = torch.from_numpy(message["anchors"]["x"]).to(runtime.device)
        anchors_y = torch.from_numpy(message["anchors"]["y"]).to(runtime.device)
        peers = peer_teacher(message["peer_logits"], client)
        teacher = None if peers is None else torch.from_numpy(peers).to(runtime.device)
        x, y = runtime.client_data(client)
        joined = (torch.cat([x, anchors_x.to(x.dtype)]), torch.cat([y.long(), anchors_y]))
        rng = numpy_rng(self.context.seed, "desa-anchors", round_, client)
        order = rng.permutation(len(anchors_y))  # the distillation batches, in a fixed order
        batch = training.batch_size
        kd_steps = iter(range(2**62))

        def objective(model: torch.nn.Module) -> BatchLoss:
            embed, classify = embedding_parts(model)

            def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                features = embed(inputs)
                loss = p.lambda_ori * F.cross_entropy(classify(features), targets)
                if teacher is not None and p.lambda_kd:
                    step = next(kd_steps) % max(1, math.ceil(len(order) / batch))
                    rows = torch.from_numpy(order[step * batch:(step + 1) * batch]).to(
                        anchors_x.device)
                    loss = loss + p.lambda_kd * distillation_loss(
                        model(anchors_x[rows]), teacher[rows], anchors_y[rows],
                        p.kd_temperature, p.kd_weight)
                if p.lambda_reg:
                    rows = torch.from_numpy(rng.choice(len(anchors_y),
                                                       min(batch, len(anchors_y)),
                                                       replace=False)).to(anchors_x.device)
                    anchor_features = embed(anchors_x[rows]).detach()
                    loss = loss + p.lambda_reg * supervised_contrastive(
                        torch.cat([features, anchor_features]),
                        torch.cat([targets, anchors_y[rows]]), p.supcon_temperature)
                return loss

            return batch_loss

        fitted = fit_client(runtime, client, round_, start, objective, data=joined)
        upload = {"logits": self._anchor_logits(runtime, fitted.model,
                                                message["anchors"]["x"])}
        return ClientResult(upload, fitted.weights, {"steps": float(fitted.steps)}, len(y),
                            fitted.mean_loss)

    def personal_weights(self, state: Any) -> Weights | None:
        return state
