"""FedGen: the server learns a feature generator from the clients' classifiers, weighted by
their label counts, and clients train against its features; without the generator's
regularizer (alpha = beta = 0) FedGen is FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algorithm_configs import contract_raw
from inprocess import fedavg_equivalent, simulate

from raysim.algorithms.fedgen import label_weights, teacher_loss
from raysim.configuration.experiment import parse_config
from raysim.models.feature_generator import FeatureGenerator, diversity_loss


def _run(data_root, **algorithm):
    raw = contract_raw(data_root, "fedgen")
    raw["algorithm"] = {**raw["algorithm"], **algorithm}
    raw["engine"] = {"vectorize": "never"}  # FedAvg below on the same per-client loop
    return simulate(parse_config(raw))


def test_without_the_generators_regularizer_fedgen_is_fedavg(data_root):
    raw = contract_raw(data_root, "fedavg")
    raw["engine"] = {"vectorize": "never"}
    fedavg_equivalent(_run(data_root, generative_alpha=0.0, generative_beta=0.0).server_state.model,
                      simulate(parse_config(raw)).server_state,
                      _run(data_root).server_state.model)


def test_each_regularizer_term_moves_the_clients(data_root):
    """The cross-entropy on generated features (alpha) and the KL towards the classifier's
    view of them (beta) each change the trained model on their own."""
    off = _run(data_root, generative_alpha=0.0, generative_beta=0.0).server_state.model
    for terms in ({"generative_alpha": 10.0, "generative_beta": 0.0},
                  {"generative_alpha": 0.0, "generative_beta": 10.0}):
        on = _run(data_root, **terms).server_state.model
        assert any(not np.allclose(on[key], off[key], atol=1e-4) for key in off), terms


def test_label_weights_are_each_clients_share_of_a_label():
    counts = np.array([[3, 0, 1], [1, 0, 0]], dtype=float)
    np.testing.assert_allclose(label_weights(counts), [[0.75, 0, 1], [0.25, 0, 0]])


def test_the_teacher_loss_weights_each_classifier_by_its_label_share():
    """A hand computation: client 0 holds only label 0, client 1 only label 1, so each
    sample's cross-entropy is taken under the classifier of the client holding its label."""
    torch.manual_seed(0)
    features, labels = torch.randn(6, 4), torch.tensor([0, 1, 1, 0, 1, 0])
    heads = [(torch.randn(2, 4), torch.randn(2)) for _ in range(2)]
    weights = torch.tensor(label_weights(np.array([[5, 0], [0, 7]], dtype=float)),
                           dtype=torch.float32)
    own = torch.stack([F.cross_entropy(F.linear(features[i:i + 1], *heads[int(labels[i])]),
                                       labels[i:i + 1]) for i in range(6)])
    expected = own.sum() / 6  # each client's term is a mean over all 6 draws
    assert teacher_loss(features, labels, heads, weights).item() == pytest.approx(
        expected.item(), rel=1e-5)


def test_the_server_trains_the_generator_towards_the_clients_classifiers(data_root):
    """After the rounds, the final clients' ensemble reads the generator's features of label
    y as y far more often than it reads those of an untrained generator; without the
    teacher loss (generator_steps 0) the generator is left as initialised."""
    trace = _run(data_root, generator_steps=40)
    state, algorithm = trace.server_state, trace.algorithm
    assert state.generator_steps == 3 * 40 and state.labels == [0, 1]
    assert set(state.moments) == {name for name, _ in
                                  algorithm._generator(None, torch.device("cpu"))
                                  .named_parameters()}
    head = (torch.from_numpy(np.asarray(state.model["classifier.weight"])),
            torch.from_numpy(np.asarray(state.model["classifier.bias"])))

    def agreement(weights) -> float:
        module = algorithm._generator(weights, torch.device("cpu")).eval()
        labels = torch.tensor([0, 1] * 100)
        with torch.no_grad():
            features = module(labels, module.noise(len(labels), torch.Generator().manual_seed(1)))
        return float((F.linear(features, *head).argmax(1) == labels).float().mean())

    assert agreement(state.generator) > agreement(None) + 0.2
    untrained = _run(data_root, generator_steps=0).server_state
    initial = algorithm._generator(None, torch.device("cpu")).state_dict()
    for key, value in untrained.generator.items():
        np.testing.assert_array_equal(value, initial[key].numpy())


def test_the_diversity_loss_prefers_features_that_follow_the_noise():
    noise = torch.rand(8, 3, generator=torch.Generator().manual_seed(0))
    collapsed = torch.zeros(8, 5)
    spread = torch.cat([noise, noise[:, :2]], dim=1) * 10
    assert diversity_loss(noise, collapsed).item() == pytest.approx(1.0)
    assert diversity_loss(noise, spread).item() < 0.9


def test_the_diversity_term_shapes_the_servers_generator(data_root):
    """The generator the server learns depends on its diversity term: without it
    (diversity_weight 0) the same rounds give another generator."""
    with_term = _run(data_root, generator_steps=10).server_state.generator
    without = _run(data_root, generator_steps=10, diversity_weight=0.0).server_state.generator
    assert any(not np.allclose(with_term[key], without[key], atol=1e-6) for key in with_term)


def test_what_crosses_is_counted(data_root):
    rows = _run(data_root).rows["communication"]
    kinds = {(row["direction"], row["message_type"]) for row in rows}
    assert {("up", "model"), ("up", "label_counts"), ("down", "model"),
            ("down", "generator"), ("down", "labels")} <= kinds
    down = {row["round"] for row in rows if row["message_type"] == "generator"}
    assert down == {1, 2}  # the generator goes down once the first round trained it


def test_generator_shape_follows_the_model():
    module = FeatureGenerator(num_classes=3, feature_dim=7, noise_dim=4, hidden=5)
    out = module(torch.tensor([0, 2]), module.noise(2, torch.Generator().manual_seed(0)))
    assert out.shape == (2, 7)
