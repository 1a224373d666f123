"""DESA: clients condense anchors once, the server averages them slot by slot, and each client
trains its own model on its data joined with the anchors, distilling towards the other
clients' logits on them and pulling its features towards theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algorithm_configs import contract_raw
from inprocess import simulate

from raysim.algorithms.desa import distillation_loss, peer_teacher, supervised_contrastive
from raysim.condensation.synthetic import noise_images
from raysim.configuration.experiment import parse_config
from raysim.seeding import torch_generator


def _run(data_root, rounds=3, **algorithm):
    raw = contract_raw(data_root, "desa")
    raw["algorithm"] = {**raw["algorithm"], **algorithm}
    raw["training"] = {**raw["training"], "rounds": rounds}
    return simulate(parse_config(raw))


def test_the_anchors_are_the_slot_mean_of_the_clients_condensed_images(data_root):
    """Round 0 only: every client condenses 2 images of each class it holds away from their
    noise start (a class it lacks keeps its noise), and the server's anchors are the mean of
    the three uploads, slot by slot."""
    trace = _run(data_root, rounds=1, iterations=5)
    anchors = trace.server_state["anchors"]
    assert anchors["x"].shape[0] == 4 and anchors["y"].tolist() == [0, 0, 1, 1]
    shape = trace.runtime.info.input_shape
    starts = [np.concatenate(list(noise_images({0: 2, 1: 2}, shape, torch_generator(
        0, "anchor-init", client=c)).values())) for c in range(3)]
    assert not np.allclose(anchors["x"], np.mean(starts, axis=0), atol=1e-3)
    assert trace.server_state["logits"] == {}
    runtime, algorithm = trace.runtime, trace.algorithm
    uploads = []
    for client in range(3):  # each client's upload again (its streams are its own)
        model = runtime.client_model(client)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in
                               runtime.client_initial_weights(client).items()})
        uploads.append(algorithm._condense(runtime, model, client).upload["anchors"]["x"])
    np.testing.assert_allclose(anchors["x"], np.mean(uploads, axis=0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(uploads[0], starts[0], atol=1e-3)
    uploads = trace.rows["communication"]
    assert {row["message_type"] for row in uploads if row["direction"] == "up"} == {"anchors"}


@pytest.fixture(scope="module")
def three_rounds(data_root):
    """Anchors in round 0, training rounds 1 and 2 (distillation from round 2)."""
    return _run(data_root)


def test_each_term_of_the_local_objective_moves_the_clients(data_root, three_rounds):
    """Distillation towards the peers' logits and the contrastive pull to the anchors'
    features each change the trained models."""
    base = three_rounds.client_states
    for switched_off in ({"lambda_kd": 0.0}, {"lambda_reg": 0.0}):
        other = _run(data_root, **switched_off).client_states
        assert any(not np.allclose(other[c][key], base[c][key], atol=1e-5)
                   for c in base for key in base[c]), switched_off


def test_without_its_anchors_desa_is_local_training(data_root):
    """With every anchor term off and the anchors' cross-entropy weighted out (lambda_ori 0
    leaves no loss at all), the clients' models stay where they started: nothing but the
    anchors teaches them."""
    trace = _run(data_root, rounds=3, lambda_ori=0.0, lambda_kd=0.0, lambda_reg=0.0)
    initial = trace.runtime.client_initial_weights(0)
    for key, value in trace.client_states[0].items():
        if np.issubdtype(np.asarray(value).dtype, np.floating) and "running" not in key:
            np.testing.assert_allclose(value, initial[key], atol=1e-7)


def test_the_peers_logits_go_down_and_each_client_sends_its_own(three_rounds):
    trace = three_rounds
    assert sorted(trace.server_state["logits"]) == [0, 1, 2]
    rows = trace.rows["communication"]
    up = {(row["round"], row["message_type"]) for row in rows if row["direction"] == "up"}
    assert up == {(0, "anchors"), (1, "logits"), (2, "logits")}
    down = {(row["round"], row["message_type"]) for row in rows if row["direction"] == "down"}
    assert {(1, "anchors"), (2, "anchors"), (2, "peer_logits")} <= down


def test_the_distillation_loss_is_the_authors():
    torch.manual_seed(0)
    student, teacher = torch.randn(4, 3), torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 0])
    t, w = 20.0, 0.9
    kl = (F.softmax(teacher / t, 1) * (F.log_softmax(teacher / t, 1)
                                       - F.log_softmax(student / t, 1))).sum() / 12
    expected = (1 - w) * F.cross_entropy(student, labels) + w * t * t * kl
    assert distillation_loss(student, teacher, labels, t, w).item() == pytest.approx(
        expected.item(), rel=1e-5)


def test_the_contrastive_loss_by_hand():
    """Two samples of class 0 and one of class 1: the lone sample has no positive (0), each
    class-0 sample's loss is minus the log-softmax of its partner among the others."""
    features = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    t = 0.5
    sim = F.normalize(features, dim=1) @ F.normalize(features, dim=1).T / t
    first = -(sim[0, 1] - torch.logsumexp(sim[0, [1, 2]], 0))
    second = -(sim[1, 0] - torch.logsumexp(sim[1, [0, 2]], 0))
    expected = (first + second) / 3
    assert supervised_contrastive(features, labels, t).item() == pytest.approx(
        expected.item(), rel=1e-5)


def test_the_teacher_is_the_mean_of_the_other_clients_logits():
    logits = {0: np.full((2, 2), 1.0), 1: np.full((2, 2), 3.0), 2: np.full((2, 2), 5.0)}
    np.testing.assert_allclose(peer_teacher(logits, 1), np.full((2, 2), 3.0))
    np.testing.assert_allclose(peer_teacher(logits, 0), np.full((2, 2), 4.0))
    assert peer_teacher({0: logits[0]}, 0) is None
