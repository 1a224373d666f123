"""FedGen (Zhu, Hong and Zhou, "Data-Free Knowledge Distillation for Heterogeneous Federated
Learning", ICML 2021): FedAvg whose clients are regularised by a generator of latent features
that the server learns from the ensemble of the clients' classifiers, without any data.

A round, as the authors' code runs it (``zhuangdizhu/FedGen``, ``serverpFedGen.py`` and
``userpFedGen.py``):

1. the server broadcasts the global model and, once it has trained one, the generator
   G(eps, y) (:mod:`raysim.models.feature_generator`) with the labels it knows of;
2. each sampled client trains the global model on its data with

       loss = CE(f(x), y) + (B_gen / B) * alpha_t * CE(h(G(eps, y')), y')
              + beta_t * KL(softmax(h(G(eps, y))) || softmax(f(x)))

   where h is the model's classifier layer (the features' reader), y' are ``generated_batch_size``
   labels drawn uniformly from the known ones, and alpha_t, beta_t decay by
   ``regularizer_decay`` per round (floored at 1e-4); it uploads its model and its label
   counts;
3. the server averages the models (FedAvg) and trains the generator for ``generator_steps``
   Adam steps: labels drawn uniformly from those some client holds, and the loss
   sum_k mean_i(CE(h_k(G(eps_i, y_i)), y_i) * w_k(y_i)) + eta * diversity, where h_k is
   client k's classifier after its local training and w_k(y) its share of the round's samples
   of label y, each sample weighted by its own label's share as the paper's objective reads
   (the authors' code broadcasts the weights so that every client teaches every label,
   weighted by its mean share over the batch: docs/methods.md's deviation table). The
   generator and its Adam moments are server state (checkpointed).

What crosses is counted as it is sent: the model and the label counts up, the model, the
generator and the label list down. With ``generative_alpha`` and ``generative_beta`` both 0 the
clients never use the generator and FedGen is FedAvg.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import FedGenParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.models import build_model
from raysim.models.feature_generator import FeatureGenerator, diversity_loss
from raysim.models.registry import embedding_parts, require_embedding
from raysim.seeding import torch_generator
from raysim.state_codec import persistable
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.vectors.weighted_sum import WeightedSum, merge_partials, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

HEAD = ("classifier.weight", "classifier.bias")
"""The classifier layer's entries of a model's weights: the teacher each client gives the
server's generator."""


@persistable
@dataclass
class FedGenState:
    """The server's model, its generator with Adam's moments, and the labels it knows of."""

    model: Weights
    generator: Weights | None = None
    """None until the first round's uploads trained it."""
    moments: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    """Adam's first and second moments of each generator parameter, by parameter name."""
    generator_steps: int = 0
    """Adam steps taken so far (its bias correction)."""
    labels: list[int] = field(default_factory=list)
    """Labels some client reported holding, sorted."""


def label_weights(counts: np.ndarray) -> np.ndarray:
    """w_k(y): each client's share (rows) of the round's samples of each label (columns); a
    label no client holds has zero weight everywhere."""
    totals = counts.sum(axis=0, keepdims=True)
    return np.divide(counts, totals, out=np.zeros_like(counts, dtype=np.float64),
                     where=totals > 0)


def teacher_loss(features: torch.Tensor, labels: torch.Tensor,
                 heads: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 weights: torch.Tensor) -> torch.Tensor:
    """sum_k mean_i(CE(h_k(features_i), labels_i) * weights[k, labels_i]): the ensemble's
    weighted cross-entropy on generated features (``heads``: each client's classifier weight
    and bias)."""
    total = features.new_zeros(())
    for k, (weight, bias) in enumerate(heads):
        losses = F.cross_entropy(F.linear(features, weight, bias), labels, reduction="none")
        total = total + (losses * weights[k, labels]).mean()
    return total


@register_algorithm
class FedGen(Algorithm[FedGenParams, FedGenState]):
    """FedAvg with a server-learnt feature generator regularising every client's training."""

    params_class: ClassVar[type[StrictModel]] = FedGenParams
    supports: ClassVar[Supports] = Supports(
        cross_entropy_only="FedGen's clients and generator learn with cross-entropy on class labels",
        privacy_refusal=("its clients upload their label counts and the server trains its generator on "
            "each client's own classifier, which client-level DP here does not clip or noise"),
        asynchronous_refusal="its server trains the generator on the classifiers of one synchronous round",
        multi_label_refusal="its generator is conditioned on one class label per sample")
    mean_uploads: ClassVar[tuple[str, ...]] = ()  # (its server step also trains the generator)
    per_client_loop: ClassVar[str | None] = (
        "its local objective reads the generator's features through each client's classifier")

    def __init__(self, params: FedGenParams, context: RunContext):
        super().__init__(params, context)
        require_embedding(context.model, context.info,
                          "FedGen's generator produces the features a model's classifier reads")
        _, classifier = embedding_parts(build_model(context.model, context.info))
        self.feature_dim = int(cast(torch.nn.Linear, classifier).in_features)

    def _generator(self, weights: Weights | None, device: torch.device) -> FeatureGenerator:
        """The generator module (initial weights from the run's seed when ``weights`` is
        None), on ``device``."""
        p = self.params
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_generator(self.context.seed, "fedgen-init").initial_seed())
            module = FeatureGenerator(self.context.info.num_classes, self.feature_dim,
                                      p.noise_dim, p.generator_hidden)
        if weights is not None:
            set_weights(module, weights)
        return module.to(device)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> FedGenState:
        return FedGenState(initial_weights)

    def broadcast(self, state: FedGenState, round_: int) -> dict[str, Any]:
        message: dict[str, Any] = {"model": state.model}
        if state.generator is not None:
            message["generator"] = state.generator
            message["labels"] = np.asarray(state.labels, dtype=np.int64)
        return message

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        return {"model": WeightedSum.of([r.upload["model"] for _, r in results],
                                        [r.weight for _, r in results]),
                "teachers": [(client, {key: np.asarray(r.upload["model"][key]) for key in HEAD},
                              r.upload["label_counts"]) for client, r in results]}

    def aggregate(self, state: FedGenState, partials: Sequence[Any],
                  round_: int) -> FedGenState:
        if not partials:
            return state
        merged = functools.reduce(merge_partials, partials)
        teachers = sorted(merged["teachers"], key=lambda teacher: teacher[0])
        counts = np.stack([teacher[2] for teacher in teachers]).astype(np.float64)
        labels = sorted(set(state.labels) | set(np.flatnonzero(counts.sum(0)).tolist()))
        generator, moments, steps = self._train_generator(
            state, [teacher[1] for teacher in teachers], counts, round_)
        return FedGenState(weighted_mean([merged["model"]]), generator, moments, steps, labels)

    def _train_generator(self, state: FedGenState, heads: Sequence[Weights],
                         counts: np.ndarray, round_: int
                         ) -> tuple[Weights, dict[str, dict[str, np.ndarray]], int]:
        """The generator after this round's Adam steps against the round's classifiers
        (module docstring, step 3), with its moments and step count."""
        p = self.params
        module = self._generator(state.generator, torch.device("cpu"))
        named = dict(module.named_parameters())
        optimizer = torch.optim.Adam(named.values(),
                                     lr=p.generator_lr * p.generator_lr_decay ** round_,
                                     weight_decay=p.generator_weight_decay)
        for name, moment in state.moments.items():  # resume Adam where the last round left it
            optimizer.state[named[name]] = {
                "step": torch.tensor(float(state.generator_steps)),
                "exp_avg": torch.from_numpy(moment["exp_avg"].copy()),
                "exp_avg_sq": torch.from_numpy(moment["exp_avg_sq"].copy())}
        held = torch.from_numpy(np.flatnonzero(counts.sum(0)))
        weights = torch.from_numpy(label_weights(counts)).to(torch.float32)
        teachers = [(torch.from_numpy(np.asarray(h[HEAD[0]], dtype=np.float32)),
                     torch.from_numpy(np.asarray(h[HEAD[1]], dtype=np.float32))) for h in heads]
        draws = torch_generator(self.context.seed, "fedgen-generator", round_)
        module.train()
        for _ in range(p.generator_steps):
            labels = held[torch.randint(len(held), (p.generator_batch_size,), generator=draws)]
            noise = module.noise(len(labels), draws)
            features = module(labels, noise)
            loss = teacher_loss(features, labels, teachers, weights)
            if p.diversity_weight:
                loss = loss + p.diversity_weight * diversity_loss(noise, features)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        moments = {name: {"exp_avg": optimizer.state[parameter]["exp_avg"].numpy().copy(),
                          "exp_avg_sq": optimizer.state[parameter]["exp_avg_sq"].numpy().copy()}
                   for name, parameter in named.items() if parameter in optimizer.state}
        return get_weights(module), moments, state.generator_steps + p.generator_steps

    def global_weights(self, state: FedGenState) -> Weights:
        return state.model

    # ----- clients -----
    def regularizer_weights(self, round_: int) -> tuple[float, float]:
        """(alpha_t, beta_t): the clients' generator weights in round ``round_``."""
        p = self.params
        decay = p.regularizer_decay ** round_
        return (max(1e-4, p.generative_alpha * decay) if p.generative_alpha else 0.0,
                max(1e-4, p.generative_beta * decay) if p.generative_beta else 0.0)

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        training, p = self.context.training, self.params
        alpha, beta = self.regularizer_weights(round_)
        generator, known = None, torch.zeros(0, dtype=torch.long)
        if "generator" in message and (alpha or beta):
            generator = self._generator(message["generator"], runtime.device)
            generator.eval()
            for parameter in generator.parameters():
                parameter.requires_grad_(False)
            known = torch.as_tensor(message["labels"])
        ratio = p.generated_batch_size / training.batch_size
        results = []
        for client in clients:
            draws = torch_generator(self.context.seed, "fedgen-client", round_, client)

            def objective(model: torch.nn.Module,
                          draws: torch.Generator = draws) -> BatchLoss:
                _, classifier = embedding_parts(model)

                def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                    logits = model(inputs)
                    loss = F.cross_entropy(logits, targets)
                    if generator is None:
                        return loss
                    with torch.no_grad():  # the generator's features of the batch's own labels
                        same = generator(targets, generator.noise(len(targets), draws))
                        target = F.softmax(classifier(same), dim=1)
                    latent = F.kl_div(F.log_softmax(logits, dim=1), target,
                                      reduction="batchmean")
                    sampled = known[torch.randint(len(known), (p.generated_batch_size,),
                                                  generator=draws)].to(inputs.device)
                    with torch.no_grad():
                        features = generator(sampled, generator.noise(len(sampled), draws))
                    teacher = F.cross_entropy(classifier(features), sampled)
                    return loss + ratio * alpha * teacher + beta * latent

                return batch_loss

            fitted = fit_client(runtime, client, round_, message["model"], objective)
            labels = runtime.train_y[runtime.client_indices[client]].reshape(-1)
            counts = np.bincount(labels, minlength=self.context.info.num_classes).astype(np.int64)
            results.append(ClientResult.trained(
                {"model": fitted.weights, "label_counts": counts}, None, fitted,
                self.client_weight(fitted.num_samples)))
        return results
