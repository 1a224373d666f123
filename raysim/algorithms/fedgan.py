"""FedGAN as the FedVCK paper uses it (its Table 2 baseline; FedGAN of Rasouli, Sun and
Rajagopal 2020 for the GAN, used as Nguyen et al. 2021 use a shared GAN for COVID-19
detection): FedAvg of the classifier beside a class-conditional GAN that is federated the same
way, whose images of every class join each client's training.

A round:

1. the server broadcasts the global classifier, generator and discriminator;
2. each sampled client trains the classifier from the global one on its data with
   CE(f(x), y) + lambda CE(f(G(z, y')), y'), where G is the received global generator (frozen)
   and y' are classes drawn uniformly (from round 1 on: round 0's generator is untrained),
   then trains the GAN from the global pair for ``gan_steps`` local steps on its own images
   (:mod:`raysim.training.adversarial`, FedGAN's K local steps between synchronisations);
3. it uploads the three networks and the server takes each one's sample-weighted mean
   (FedGAN's intermediary averages generators and discriminators; FedAvg the classifier).

What crosses is counted as it is sent: ``model``, ``generator`` and ``discriminator`` both
ways every round, as the FedVCK paper counts FedGAN's uploads. ``synthetic_weight: 0`` is
FedAvg for the classifier.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import FedGANParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.models.conditional_gan import (
    ConditionalGenerator,
    ProjectionDiscriminator,
    pixel_scale,
)
from raysim.seeding import torch_generator
from raysim.training.adversarial import AdversarialSettings, train_gan
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.vectors.weighted_sum import WeightedSum, merge_partials, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

NETWORKS = ("model", "generator", "discriminator")
"""The three networks every client uploads and the server averages."""


@register_algorithm
class FedGAN(Algorithm[FedGANParams, dict[str, Weights]]):
    """FedAvg of a classifier and of a class-conditional GAN whose images of every class the
    clients also train the classifier on."""

    params_class: ClassVar[type[StrictModel]] = FedGANParams
    supports: ClassVar[Supports] = Supports(
        cross_entropy_only=("FedGAN trains its classifier with cross-entropy on generated images of a "
            "class"),
        needs_images="its generator and discriminator are image networks",
        privacy_refusal=("its generator and discriminator are trained on raw images and uploaded "
            "unclipped; client-level DP here noises one weight update per client"),
        asynchronous_refusal="its server averages three networks of one synchronous round",
        multi_label_refusal="its generator is conditioned on one class label per image",
        volume_refusal="its generator and discriminator are 2D")
    per_client_loop: ClassVar[str | None] = (
        "its clients train a GAN beside the classifier")

    def _networks(self, device: torch.device) -> tuple[ConditionalGenerator,
                                                       ProjectionDiscriminator]:
        """A generator and a discriminator of the run's shape, initialised from the run's
        seed, on ``device``."""
        p, info = self.params, self.context.info
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(torch_generator(self.context.seed, "fedgan-init").initial_seed())
            generator = ConditionalGenerator(info.input_shape, info.num_classes, p.noise_dim,
                                             p.gan_width)
            discriminator = ProjectionDiscriminator(info.input_shape, info.num_classes,
                                                    p.gan_width)
        return generator.to(device), discriminator.to(device)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> dict[str, Weights]:
        generator, discriminator = self._networks(torch.device("cpu"))
        return {"model": initial_weights, "generator": get_weights(generator),
                "discriminator": get_weights(discriminator)}

    def broadcast(self, state: dict[str, Weights], round_: int) -> dict[str, Any]:
        return dict(state)

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, WeightedSum]:
        return {name: WeightedSum.of([r.upload[name] for _, r in results],
                                     [r.weight for _, r in results]) for name in NETWORKS}

    def aggregate(self, state: dict[str, Weights], partials: Sequence[Any],
                  round_: int) -> dict[str, Weights]:
        if not partials:
            return state
        merged = functools.reduce(merge_partials, partials)
        return {name: weighted_mean([merged[name]]) for name in NETWORKS}

    def global_weights(self, state: dict[str, Weights]) -> Weights:
        return state["model"]

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        p, training, info = self.params, self.context.training, self.context.info
        generator, discriminator = self._networks(runtime.device)
        synthetic = p.synthetic_batch_size or training.batch_size
        use_synthetic = round_ > 0 and p.synthetic_weight > 0
        def objective(model: torch.nn.Module, draws: torch.Generator) -> BatchLoss:
            def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                loss = F.cross_entropy(model(inputs), targets)
                if not use_synthetic:
                    return loss
                classes = torch.randint(info.num_classes, (synthetic,), generator=draws).to(
                    inputs.device)
                with torch.no_grad():
                    images = generator.normalised(
                        generator(generator.noise(synthetic, draws), classes), info.mean,
                        info.std)
                return loss + p.synthetic_weight * F.cross_entropy(model(images), classes)

            return batch_loss

        results = []
        for client in clients:
            set_weights(generator, message["generator"])
            generator.eval()
            draws = torch_generator(self.context.seed, "fedgan-synthetic", round_, client)
            fitted = fit_client(runtime, client, round_, message["model"],
                                functools.partial(objective, draws=draws))
            set_weights(discriminator, message["discriminator"])
            x, y = runtime.client_data(client)
            d_loss, g_loss = train_gan(
                generator, discriminator, pixel_scale(x, info.mean, info.std), y.long(),
                AdversarialSettings(p.gan_steps, p.gan_batch_size, p.gan_lr),
                torch_generator(self.context.seed, "fedgan-gan", round_, client))
            upload = {"model": fitted.weights, "generator": get_weights(generator),
                      "discriminator": get_weights(discriminator)}
            results.append(ClientResult.trained(
                upload, None, fitted, self.client_weight(fitted.num_samples),
                discriminator_loss=d_loss, generator_loss=g_loss))
        return results
