"""FedVCK (Yan et al., AAAI 2025): federated learning by valuable condensed knowledge.

Client (see :mod:`raysim.algorithms.condensed` for the shared loop): synthetic images per class,
``max(min_images_per_class, ceil(percent% * n_c))`` for classes with at least
``min_class_samples`` local samples, N(0, 1)-initialised and warm-started across rounds,
condensed by MMD (``kernel``: linear, gaussian, polynomial) between embeddings of the frozen
global model, with the same differentiable augmentation on real and synthetic batches;
``latent_constraint``: real batches pass the model in train mode (BatchNorm batch statistics,
running statistics updated from real data), synthetic batches in eval mode (normalised with
those statistics); ``selection: model_guided``: real batches are drawn with replacement by
p = softmax within the class of w = sigmoid(gamma (CE(alpha z_t + (1 - alpha) z_{t-1}) - b)),
``uniform``: without replacement. Uploads: the synthetic set (uint8) and per-class logit
prototypes of the current model with their counts.

Server: keeps the synthetic sets of the last ``keep_rounds`` rounds (default max(10, R/2)) and
trains the global model on them (each batch augmented by one random operation, learning rates
x ``server_lr_decay`` from half the epochs) with cross-entropy plus ``beta`` x the relational
supervised contrastive loss (its weight also x ``server_lr_decay`` from half the epochs): a
projector h (Linear-BatchNorm-ReLU-Linear, new every round, Adam) on the embedding, feature
prototypes f_c of the synthetic data under the model before the update, hard negatives HN(c) =
the top ``hard_negatives`` (default min(5, classes - 1)) classes of the global logit prototype of
c (count-weighted mean of the clients' prototypes) except c, and -log(exp(h.f_c / tau) /
sum_{j in {c} + HN(c)} exp(h.f_j / tau)) on L2-normalised vectors. Deviations from the paper
and the authors' code: docs/fedvck.md.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import RunContext, register_algorithm
from raysim.algorithms.condensed import CondensedKnowledgeAlgorithm
from raysim.algorithms.params import FedVCKParams
from raysim.algorithms.supports import Supports
from raysim.condensation.importance import class_sampling_probabilities, importance_weights
from raysim.condensation.kernels import mmd
from raysim.condensation.matching import RealData, split_by_class
from raysim.condensation.synthetic import ServerTraining, images_per_class
from raysim.data.dataset import to_tensor
from raysim.errors import field_error
from raysim.models import build_model
from raysim.models.registry import embedding_parts
from raysim.seeding import torch_generator
from raysim.vectors.weights import set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

@register_algorithm
class FedVCK(CondensedKnowledgeAlgorithm[FedVCKParams]):
    """Model-guided condensation with latent constraints; relational server training."""

    params_class = FedVCKParams
    supports: ClassVar[Supports] = replace(
        CondensedKnowledgeAlgorithm.supports,
        privacy_refusal=("its clients upload condensed synthetic images and logit prototypes, not weight "
            "updates, and no accountable mechanism for them is implemented"))

    def __init__(self, params: FedVCKParams, context: RunContext):
        super().__init__(params, context)
        classes = context.info.num_classes
        if params.contrastive and params.hard_negatives is not None and \
                params.hard_negatives >= classes:
            raise field_error("algorithm.hard_negatives", params.hard_negatives,
                              f"K hard-negative classes must be fewer than the {classes} "
                              f"classes of {context.info.name} (at most {classes - 1}; unset, "
                              "it is min(5, classes - 1)), or set algorithm.contrastive=false")
        self.hard_negatives = params.hard_negatives or min(5, classes - 1)

    def synthetic_sizes(self, counts: np.ndarray) -> dict[int, int]:
        p = self.params
        return images_per_class(counts, p.percent, p.min_images_per_class, p.min_class_samples)

    def kept_rounds(self) -> int:
        return self.params.keep_rounds or max(10, self.context.training.rounds // 2)

    def sends_previous_model(self) -> bool:
        return self.params.selection == "model_guided"  # the self-ensemble's z_{t-1}

    # ----- client -----
    def sampling(self, runtime: ClientRuntime, model: torch.nn.Module, message: dict[str, Any],
                 client: int, real: RealData) -> tuple[RealData, dict[str, Any]]:
        p = self.params
        indices = runtime.client_indices[client]
        labels = torch.from_numpy(runtime.train_y[indices].astype(np.int64))
        classes = self.context.info.num_classes
        logits_now = _logits(runtime, model, message["model"], indices)
        counts = np.bincount(labels.numpy(), minlength=classes)
        prototypes = np.zeros((classes, classes), dtype=np.float32)
        for cls in np.flatnonzero(counts):
            prototypes[cls] = logits_now[labels == int(cls)].mean(0).numpy()
        uploads = {"prototypes": prototypes, "prototype_counts": counts.astype(np.int64)}
        if p.selection == "model_guided":
            logits_before = (None if "previous" not in message
                             else _logits(runtime, model, message["previous"], indices))
            set_weights(model, message["model"])
            weights = importance_weights(logits_now, logits_before, labels, p.alpha, p.gamma,
                                         p.offset)
            probabilities = class_sampling_probabilities(weights, labels, classes)
            real = RealData(real.x, real.by_class,
                            {c: probabilities[c] for c in real.by_class})
        return real, uploads

    def matching_loss(self, runtime: ClientRuntime, model: torch.nn.Module, client: int,
                      round_: int, message: dict[str, Any]) -> Any:
        p = self.params
        embed = embedding_parts(model)[0]

        def loss(real: torch.Tensor, syn: torch.Tensor, real_sizes: list[int],
                 syn_sizes: list[int]) -> torch.Tensor:
            model.train()
            with torch.no_grad():
                real_embedding = embed(real)
            if p.latent_constraint:
                model.eval()
            syn_embedding = embed(syn)
            model.train()
            return cast(torch.Tensor, sum(mmd(r, s, p.kernel) for r, s in zip(
                split_by_class(real_embedding, real_sizes),
                split_by_class(syn_embedding, syn_sizes), strict=True)))

        return loss

    # ----- server -----
    def server_settings(self) -> ServerTraining:
        return replace(super().server_settings(), extra_lr=self.params.projector_lr)

    def server_extra(self, state: dict[str, Any], uploads: list[dict[str, Any]], round_: int
                     ) -> tuple[Any, torch.nn.Module | None]:
        p = self.params
        if not p.contrastive or not uploads:
            return None, None
        info = self.context.info
        counts = np.stack([u["prototype_counts"] for u in uploads]).astype(np.float64)
        weighted = sum(c[:, None] * u["prototypes"].astype(np.float64)
                       for c, u in zip(counts, uploads, strict=True))
        totals = counts.sum(0)
        present = totals > 0
        global_prototypes = weighted / np.maximum(totals, 1)[:, None]
        model = build_model(self.context.model, info)
        set_weights(model, state["model"])
        model.eval()
        images = np.concatenate([b[1] for b in state["buffer"]])
        labels = torch.from_numpy(np.concatenate([b[2] for b in state["buffer"]]).astype(np.int64))
        with torch.no_grad():
            embeddings = embedding_parts(model)[0](to_tensor(images, info))
        dim = embeddings.shape[1]
        features = torch.zeros((info.num_classes, dim))
        has_feature = torch.zeros(info.num_classes, dtype=torch.bool)
        for cls in labels.unique().tolist():
            features[cls] = embeddings[labels == cls].mean(0)
            has_feature[cls] = True
        features = F.normalize(features, dim=1)
        candidates = torch.from_numpy(hard_negative_classes(
            global_prototypes, self.hard_negatives, present & has_feature.numpy()))
        with torch.random.fork_rng(devices=[]):  # a new projector every round, as the authors
            torch.manual_seed(torch_generator(self.context.seed, "projector-init",
                                              round_).initial_seed())
            projector = torch.nn.Sequential(
                torch.nn.Linear(dim, p.projector_hidden), torch.nn.BatchNorm1d(p.projector_hidden),
                torch.nn.ReLU(), torch.nn.Linear(p.projector_hidden, dim))

        def relational_loss(embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            rows = candidates[targets]  # (B, 1 + K): the class, then its hard negatives
            usable = (rows[:, 0] >= 0) & (rows[:, 1] >= 0)
            if usable.sum() < 2:  # the projector's BatchNorm needs two samples
                return torch.zeros(())
            z = F.normalize(projector(embeddings[usable]), dim=1)
            chosen = rows[usable]
            logits = (z[:, None, :] * features[chosen.clamp(min=0)]).sum(-1) / p.tau
            logits = logits.masked_fill(chosen < 0, float("-inf"))
            return p.beta * F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long))

        return relational_loss, projector


def hard_negative_classes(prototypes: np.ndarray, k: int, available: np.ndarray) -> np.ndarray:
    """(C, 1 + k) class indices: row c holds c, then HN(c) = the classes j != c with the top-k
    values of the global logit prototype p_c among the available classes (-1 pads a row with
    fewer, and fills the rows of unavailable classes)."""
    classes = len(prototypes)
    rows = np.full((classes, 1 + k), -1, dtype=np.int64)
    for cls in np.flatnonzero(available):
        scores = np.where((np.arange(classes) == cls) | ~available, -np.inf, prototypes[cls])
        ranked = [j for j in np.argsort(-scores, kind="stable") if np.isfinite(scores[j])]
        rows[cls, 0] = cls
        rows[cls, 1:1 + len(ranked[:k])] = ranked[:k]
    return rows


def _logits(runtime: ClientRuntime, model: torch.nn.Module, weights: Any,
            indices: np.ndarray) -> torch.Tensor:
    """Logits (CPU, float32) of a model on stored training samples, in chunks, eval mode."""
    set_weights(model, weights)
    model.eval()
    outputs = []
    with torch.no_grad():
        for start in range(0, len(indices), 512):
            batch = to_tensor(runtime.train_x[indices[start:start + 512]], runtime.info)
            outputs.append(model(batch.to(runtime.device)).float().cpu())
    return torch.cat(outputs) if outputs else torch.zeros((0, runtime.info.num_classes))
