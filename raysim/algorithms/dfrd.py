"""DFRD (Luo, Wang, Fu, Li, Lan and Gao, "DFRD: Data-Free Robustness Distillation for
Heterogeneous Federated Learning", NeurIPS 2023): FedAvg whose server, without any data, trains a
conditional generator on the round's client models and distils their ensemble into the averaged
model on the generator's images and on those of an exponential moving average (EMA) of it.

A round:

1. the server broadcasts the global model; each sampled client trains it on its data as FedAvg
   does and uploads its model and its label counts n_i^y;
2. the server averages the models (FedAvg) into theta, takes the dynamic weights
   tau_{i,y} = n_i^y / sum_j n_j^y (client i's share of the round's samples of label y) and the
   label distribution p(y) ~ sum_i n_i^y (label sampling), and runs ``server_iterations``
   times:

   - ``generator_steps`` Adam steps on the conditional generator G(z, y), y ~ p(y),
     s = G(z, y), on

         L_gen = CE(e(s), y) - beta_tran * mean(eps * KL(softmax(e(s)) || softmax(f_theta(s))))
                 + beta_div * diversity(z, s)

     where e(s) = sum_i tau_{i,y} f_i(s) is the weighted ensemble of the client models (the
     fidelity term), eps = 1 where the ensemble and the global model still predict the same
     class and 0 where they disagree (the transferability term pushes images to their decision
     boundary and stops there), and the diversity term is FedGen's (different noise, different
     images);
   - ``distillation_steps`` Adam steps on theta on

         L_md = (1 - lambda) * KL(e(s) || f_theta(s)) + lambda * KL(e(s~) || f_theta(s~))

     with s from G and s~ from the EMA generator G~ (robust distillation: G~ changes slowly
     across rounds, so the global model keeps what earlier rounds' images taught it);

   then G~ <- alpha * G~ + (1 - alpha) * G.

The generator, its EMA copy and the global model are server state; only the model goes down and
the model and the label counts come up, counted as every method's messages. The global model is
distilled with its BatchNorm statistics frozen at the clients' average (the generated images
never enter them). With ``distillation_steps: 0`` or ``server_iterations: 0`` nothing is
distilled and DFRD is FedAvg.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.fedgen import label_weights
from raysim.algorithms.params import DFRDParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.models import build_model
from raysim.models.conditional_gan import ConditionalGenerator
from raysim.models.feature_generator import diversity_loss
from raysim.seeding import torch_generator
from raysim.state_codec import persistable
from raysim.training.memory_format import place
from raysim.vectors.weighted_sum import WeightedSum, merge_partials, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@persistable
@dataclass
class DFRDState:
    """The server's model, its conditional generator and the generator's EMA copy."""

    model: Weights
    generator: Weights
    ema_generator: Weights


def ensemble_logits(models: Sequence[nn.Module], images: torch.Tensor, labels: torch.Tensor,
                    weights: torch.Tensor) -> torch.Tensor:
    """e(s) = sum_i tau_{i,y} f_i(s): the client models' logits, each image's weighted by its
    conditioning label's column of ``weights`` (clients x labels)."""
    total = torch.zeros(())
    for i, model in enumerate(models):
        total = total + weights[i, labels].unsqueeze(1) * model(images)
    return total


def transferability_loss(ensemble: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """-mean(eps * KL(softmax(ensemble) || softmax(student))), eps = 1 on the images the two
    assign to the same class: maximising the divergence moves them towards the boundary between
    the ensemble's and the global model's decisions, and an image that crossed it stops
    counting."""
    agree = (ensemble.argmax(1) == student.argmax(1)).to(ensemble.dtype)
    divergence = F.kl_div(F.log_softmax(student, dim=1), F.log_softmax(ensemble, dim=1),
                          reduction="none", log_target=True).sum(1)
    return -(agree * divergence).mean()


def distillation_loss(ensemble: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ensemble) || softmax(student)), averaged over the images."""
    return F.kl_div(F.log_softmax(student, dim=1), F.log_softmax(ensemble, dim=1),
                    reduction="batchmean", log_target=True)


@register_algorithm
class DFRD(Algorithm[DFRDParams, DFRDState]):
    """FedAvg, then data-free distillation of the round's client ensemble into the average on a
    server-trained conditional generator's images and on its EMA copy's."""

    params_class: ClassVar[type[StrictModel]] = DFRDParams
    supports: ClassVar[Supports] = Supports(
        cross_entropy_only="DFRD's generator and distillation use class labels and softmax outputs",
        needs_images="its server's generator produces images",
        privacy_refusal=("its server distils from every client's own model and their label counts, which "
            "client-level DP here does not clip or noise"),
        asynchronous_refusal="its server distils the ensemble of one synchronous round's client models",
        multi_label_refusal="its generator is conditioned on one class label per image",
        volume_refusal="its generator is 2D")
    mean_uploads: ClassVar[tuple[str, ...]] = ()  # (its server step reads every client model)


    def _generator(self, weights: Weights | None) -> ConditionalGenerator:
        """The conditional generator (initial weights from the run's seed when ``weights``
        is None), on the CPU."""
        p, info = self.params, self.context.info
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_generator(self.context.seed, "dfrd-init").initial_seed())
            module = ConditionalGenerator(info.input_shape, info.num_classes, p.noise_dim,
                                          p.generator_width)
        if weights is not None:
            set_weights(module, weights)
        return module

    def _model(self, weights: Weights) -> nn.Module:
        """A model of the run's architecture holding ``weights``, on the CPU, in eval mode
        (BatchNorm reads its running statistics)."""
        module = place(build_model(self.context.model, self.context.info),
                       torch.device("cpu"), self.context.memory_format)
        set_weights(module, weights)
        return module.eval()

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> DFRDState:
        generator = get_weights(self._generator(None))
        return DFRDState(initial_weights, generator, dict(generator))

    def broadcast(self, state: DFRDState, round_: int) -> dict[str, Any]:
        return {"model": state.model}

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start = message["model"]
        trained = runtime.train_many(clients, round_, [start] * len(clients),
                                     [None] * len(clients))
        results = []
        for client, (weights, outcome) in zip(clients, trained, strict=True):
            labels = runtime.train_y[runtime.client_indices[client]].reshape(-1)
            counts = np.bincount(labels, minlength=self.context.info.num_classes)
            results.append(ClientResult.trained(
                {"model": weights, "label_counts": counts.astype(np.int64)}, None, outcome,
                weight=self.client_weight(outcome.num_samples)))
        return results

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        return {"model": WeightedSum.of([r.upload["model"] for _, r in results],
                                        [r.weight for _, r in results]),
                "clients": [(client, r.upload["model"], r.upload["label_counts"])
                            for client, r in results]}

    def aggregate(self, state: DFRDState, partials: Sequence[Any],
                  round_: int) -> DFRDState:
        if not partials:
            return state
        merged = functools.reduce(merge_partials, partials)
        uploads = sorted(merged["clients"], key=lambda upload: upload[0])
        average = weighted_mean([merged["model"]])
        counts = np.stack([upload[2] for upload in uploads]).astype(np.float64)
        return self._distill(state, average, [upload[1] for upload in uploads], counts, round_)

    def _distill(self, state: DFRDState, average: Weights, client_models: Sequence[Weights],
                 counts: np.ndarray, round_: int) -> DFRDState:
        """The round's server step (module docstring, step 2)."""
        p = self.params
        if p.server_iterations == 0 or p.distillation_steps == 0:  # nothing is distilled
            return DFRDState(average, state.generator, state.ema_generator)
        generator, ema = self._generator(state.generator), self._generator(state.ema_generator)
        teachers = [self._model(weights) for weights in client_models]
        for teacher in teachers:
            teacher.requires_grad_(False)
        student = self._model(average)
        ema.requires_grad_(False)
        tau = torch.from_numpy(label_weights(counts)).to(torch.float32)
        label_share = torch.from_numpy(counts.sum(0) / counts.sum())
        info = self.context.info
        draws = torch_generator(self.context.seed, "dfrd-server", round_)
        generator_optimizer = torch.optim.Adam(generator.parameters(), lr=p.generator_lr)
        student_optimizer = torch.optim.Adam(student.parameters(), lr=p.distillation_lr)

        def sample(module: ConditionalGenerator) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
            labels = torch.multinomial(label_share, p.batch_size, replacement=True,
                                       generator=draws)
            noise = module.noise(p.batch_size, draws)
            return module.normalised(module(noise, labels), info.mean, info.std), labels, noise

        for _ in range(p.server_iterations):
            student.requires_grad_(False)  # the generator's steps move only the generator
            for _ in range(p.generator_steps):
                images, labels, noise = sample(generator)
                ensemble = ensemble_logits(teachers, images, labels, tau)
                loss = F.cross_entropy(ensemble, labels)
                if p.transferability_weight:
                    loss = loss + p.transferability_weight * transferability_loss(
                        ensemble, student(images))
                if p.diversity_weight:
                    loss = loss + p.diversity_weight * diversity_loss(noise, images)
                generator_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                generator_optimizer.step()
            student.requires_grad_(True)
            for _ in range(p.distillation_steps):
                loss = torch.zeros(())
                for module, share in ((generator, 1.0 - p.ema_weight), (ema, p.ema_weight)):
                    if not share:
                        continue
                    with torch.no_grad():
                        images, labels, _ = sample(module)
                        ensemble = ensemble_logits(teachers, images, labels, tau)
                    loss = loss + share * distillation_loss(ensemble, student(images))
                student_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                student_optimizer.step()
        trained = get_weights(generator)
        moved = {key: p.ema_decay * np.asarray(state.ema_generator[key])
                 + (1.0 - p.ema_decay) * np.asarray(trained[key]) for key in trained}
        return DFRDState(get_weights(student), trained, moved)

    def global_weights(self, state: DFRDState) -> Weights:
        return state.model
