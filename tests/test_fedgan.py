"""FedGAN: clients train a class-conditional GAN beside the classifier, the server averages all
three networks, and the classifier also learns from the global generator's images; without
them (synthetic_weight 0) the classifier is FedAvg's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algorithm_configs import contract_raw
from inprocess import fedavg_equivalent, simulate

from raysim.configuration.experiment import parse_config
from raysim.models.conditional_gan import (
    ConditionalGenerator,
    ProjectionDiscriminator,
    pixel_scale,
)
from raysim.training.adversarial import AdversarialSettings, train_gan


def _run(data_root, **algorithm):
    raw = contract_raw(data_root, "fedgan")
    raw["algorithm"] = {**raw["algorithm"], **algorithm}
    raw["engine"] = {"vectorize": "never"}  # FedAvg below on the same per-client loop
    return simulate(parse_config(raw))


@pytest.fixture(scope="module")
def default_run(data_root):
    """The contract config: 3 rounds, 3 GAN steps a round, lambda 1."""
    return _run(data_root)


def test_without_the_generated_images_the_classifier_is_fedavgs(data_root, default_run):
    raw = contract_raw(data_root, "fedavg")
    raw["engine"] = {"vectorize": "never"}
    fedavg_equivalent(_run(data_root, synthetic_weight=0.0).server_state["model"],
                      simulate(parse_config(raw)).server_state,
                      default_run.server_state["model"])


def test_the_classifier_learns_from_the_generators_images(data_root, default_run):
    """From round 1 the classifier's extra images come from the global generator: a generator
    trained for a few steps a round gives another classifier than an untrained one (images
    that did not depend on the generator, e.g. noise, would give the same)."""
    trained = default_run.server_state["model"]
    untrained = _run(data_root, gan_steps=0).server_state["model"]
    assert any(not np.allclose(trained[key], untrained[key], atol=1e-5) for key in trained)


def test_the_gan_learns_each_class_not_noise():
    """Class 0 is dark, class 1 bright (8x8 grey images): after local training the
    generator's class-1 images are brighter than its class-0 images, which an untrained or a
    noise-emitting generator does not give."""
    torch.manual_seed(0)
    shape = (1, 8, 8)
    labels = torch.tensor([0, 1] * 64)
    images = torch.where(labels[:, None, None, None] == 1, 0.6, -0.6) + 0.1 * torch.randn(
        128, *shape)
    generator = ConditionalGenerator(shape, 2, noise_dim=8, width=8)
    discriminator = ProjectionDiscriminator(shape, 2, width=8)

    def brightness_gap() -> float:
        with torch.no_grad():
            z = generator.noise(64, torch.Generator().manual_seed(1))
            return float(generator(z, torch.ones(64)).mean() - generator(z, torch.zeros(64)).mean())

    before = brightness_gap()
    train_gan(generator, discriminator, images.clamp(-1, 1), labels,
              AdversarialSettings(steps=80, batch_size=32, lr=2e-3),
              torch.Generator().manual_seed(0))
    assert brightness_gap() > 0.5 > abs(before)


def test_pixel_scale_inverts_the_generators_normalisation():
    x = torch.rand(2, 3, 4, 4) * 2 - 1
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)
    generator = ConditionalGenerator((3, 4, 4), 2, noise_dim=4, width=4)
    torch.testing.assert_close(pixel_scale(generator.normalised(x, mean, std), mean, std), x)


def test_all_three_networks_cross_both_ways_and_are_averaged(default_run):
    trace = default_run
    rows = trace.rows["communication"]
    kinds = {(row["direction"], row["message_type"]) for row in rows}
    assert {(d, m) for d in ("up", "down") for m in ("model", "generator", "discriminator")} \
        <= kinds
    state, initial = trace.server_state, trace.algorithm.init_server_state({})
    for name in ("generator", "discriminator"):
        assert any(not np.allclose(state[name][k], initial[name][k]) for k in initial[name])
    metrics = trace.metrics[-1]
    assert all(np.isfinite(m["discriminator_loss"]) for m in metrics.values())
