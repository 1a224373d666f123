"""DFRD: the server trains a conditional generator on the round's client models and distils
their label-weighted ensemble into the averaged model on its images and on an EMA copy's;
without the robust distillation DFRD is FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algorithm_configs import contract_raw
from inprocess import fedavg_equivalent, simulate

from raysim.algorithms.dfrd import ensemble_logits, transferability_loss
from raysim.configuration.experiment import parse_config


def _run(data_root, **algorithm):
    raw = contract_raw(data_root, "dfrd")
    raw["algorithm"] = {**raw["algorithm"], **algorithm}
    return simulate(parse_config(raw))


def _different(left, right) -> bool:
    return any(not np.allclose(left[key], right[key], atol=1e-6) for key in left)


def test_without_its_robust_distillation_dfrd_is_fedavg(data_root):
    fedavg = simulate(parse_config(contract_raw(data_root, "fedavg"))).server_state
    fedavg_equivalent(_run(data_root, distillation_steps=0).server_state.model, fedavg,
                      _run(data_root).server_state.model)


def test_the_ensemble_weights_each_client_by_its_share_of_the_images_label():
    """A hand computation: client 0 holds only label 0 and client 1 only label 1, so an image
    of label y is read by the client holding y alone."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 2) for _ in range(2)]
    images, labels = torch.randn(5, 4), torch.tensor([0, 1, 1, 0, 1])
    tau = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    with torch.no_grad():
        expected = torch.stack([models[int(y)](x) for x, y in zip(images, labels, strict=True)])
        # float32 logits: a batched and a per-image product differ in their last bits
        np.testing.assert_allclose(ensemble_logits(models, images, labels, tau), expected,
                                   rtol=1e-6, atol=1e-6)


def test_transferability_counts_only_images_the_two_models_still_agree_on():
    ensemble = torch.tensor([[2.0, 0.0], [2.0, 0.0]])
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # agrees on the first, not the second
    first = F.kl_div(F.log_softmax(student[:1], 1), F.log_softmax(ensemble[:1], 1),
                     reduction="sum", log_target=True)
    assert transferability_loss(ensemble, student).item() == pytest.approx(-first.item() / 2)


def test_each_generator_term_and_the_ema_copy_change_the_outcome(data_root):
    """The transferability and diversity terms shape the generator, and the EMA generator's
    images move the distilled model: switching any one off gives other weights."""
    base = _run(data_root).server_state
    no_transfer = _run(data_root, transferability_weight=0.0).server_state
    no_diversity = _run(data_root, diversity_weight=0.0).server_state
    no_ema = _run(data_root, ema_weight=0.0).server_state
    assert _different(base.generator, no_transfer.generator)
    assert _different(base.generator, no_diversity.generator)
    assert _different(base.model, no_ema.model)


def test_the_ema_generator_trails_the_generator(data_root):
    """After the rounds the EMA copy lies between its initial weights and the generator's:
    alpha 0 makes it the generator itself."""
    state = _run(data_root, ema_decay=0.0).server_state
    for key, value in state.generator.items():
        np.testing.assert_array_equal(state.ema_generator[key], value)
    trailing = _run(data_root).server_state
    assert _different(trailing.generator, trailing.ema_generator)


def test_what_crosses_is_counted(data_root):
    rows = _run(data_root).rows["communication"]
    kinds = {(row["direction"], row["message_type"]) for row in rows}
    assert kinds == {("up", "model"), ("up", "label_counts"), ("down", "model")}


def test_at_lambda_one_the_model_learns_from_the_ema_generators_images_alone(data_root):
    """With lambda = 1 the distilled model depends on the EMA generator and not on the
    generator (which still trains, against the model, but feeds no distillation step)."""
    trace = _run(data_root, ema_weight=1.0)
    algorithm, state = trace.algorithm, trace.server_state
    teachers = [state.model] * 3
    counts = np.array([[5.0, 1.0], [2.0, 4.0], [0.0, 3.0]])
    other = {key: np.asarray(value) * 0.5 for key, value in state.generator.items()}

    def distilled(generator, ema):
        start = type(state)(state.model, generator, ema)
        return algorithm._distill(start, state.model, teachers, counts, 7).model

    base = distilled(state.generator, state.ema_generator)
    for key, value in distilled(other, state.ema_generator).items():
        np.testing.assert_array_equal(value, base[key])
    assert _different(base, distilled(state.generator, other))
