"""FedMix: each client uploads its mashed (averaged) samples once, the server broadcasts the
global set, and clients train on the approximate mixup loss against it; without the mixed
terms (lam = 0) FedMix is FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from algorithm_configs import contract_raw
from inprocess import fedavg_equivalent, simulate

from raysim.algorithms.fedmix import fedmix_loss, mash
from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError


def _run(data_root, **algorithm):
    raw = contract_raw(data_root, "fedmix")
    raw["algorithm"] = {"name": "fedmix", "mash_size": 8, **algorithm}
    raw["engine"] = {"vectorize": "never"}  # FedAvg below on the same per-client loop
    return simulate(parse_config(raw))


def test_mashed_samples_are_means_of_consecutive_groups():
    x = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    y = torch.tensor([0, 1, 1, 2, 2])
    groups = mash(x, y, 3, 2)
    np.testing.assert_allclose(groups["x"], [[1, 2], [5, 6], [8, 9]])
    np.testing.assert_allclose(groups["y"], [[0.5, 0.5, 0], [0, 0.5, 0.5], [0, 0, 1]])
    whole = mash(x, y, 3, None)
    np.testing.assert_allclose(whole["y"], [[0.2, 0.4, 0.4]])


def test_the_loss_is_the_first_order_approximation_of_mixup():
    """On a linear model the three terms are computed by hand: the own and the mixed
    cross-entropy at (1 - lam) x, and lam times the input gradient of the weighted own loss
    dotted with the mashed input."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3, bias=False)
    x, y = torch.randn(5, 4), torch.tensor([0, 1, 2, 1, 0])
    mashed_x, mashed_y = torch.randn(5, 4), torch.softmax(torch.randn(5, 3), 1)
    lam = 0.3
    logits = model((1 - lam) * x)
    probabilities = torch.softmax(logits, 1)
    own = F.cross_entropy(logits, y)
    mixed = -(mashed_y * torch.log_softmax(logits, 1)).sum(1).mean()
    # d [(1 - lam) mean_i CE_i] / d u_i
    gradient = (1 - lam) * (probabilities - F.one_hot(y, 3).float()) @ model.weight / len(x)
    taylor = (gradient * mashed_x).sum(1).mean()
    expected = (1 - lam) * own + lam * mixed + lam * taylor
    loss = fedmix_loss(model, x, y, mashed_x, mashed_y, lam)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()  # the input-gradient term is differentiable in the weights
    assert model.weight.grad is not None and torch.isfinite(model.weight.grad).all()
    assert fedmix_loss(model, x, y, mashed_x, mashed_y, 0.0).item() == pytest.approx(
        F.cross_entropy(model(x), y).item(), rel=1e-6)


def test_without_the_mixed_terms_fedmix_is_fedavg(data_root):
    raw = contract_raw(data_root, "fedavg")
    raw["engine"] = {"vectorize": "never"}
    fedavg_equivalent(_run(data_root, lam=0.0).server_state.model,
                      simulate(parse_config(raw)).server_state,
                      _run(data_root, lam=0.3).server_state.model)


def test_each_client_uploads_its_mashed_samples_once_and_the_set_goes_down(data_root):
    trace = _run(data_root, lam=0.2)
    assert sorted(trace.server_state.mashed) == [0, 1, 2]
    rows = trace.rows["communication"]
    up = {row["round"]: row["bytes"] for row in rows
          if row["direction"] == "up" and row["message_type"] == "mashed"}
    down = {row["round"] for row in rows
            if row["direction"] == "down" and row["message_type"] == "mashed"}
    assert set(up) == {0}  # every client takes part in round 0 here: uploaded then, once
    assert down == {1, 2}  # the global set travels with the model once it exists
    total = sum(len(s["x"]) for s in trace.server_state.mashed.values())
    sizes = [len(trace.runtime.client_indices[c]) for c in range(3)]
    assert total == sum(-(-n // 8) for n in sizes)  # ceil(n / M) each
    assert not any(row["message_type"] == "mashed_from" for row in rows)  # bookkeeping


def test_a_loss_other_than_cross_entropy_is_refused(data_root):
    raw = contract_raw(data_root, "fedmix")
    raw["training"]["loss"] = "hinge"
    with pytest.raises(ConfigError, match="FedMix's loss is cross-entropy"):
        simulate(parse_config(raw))
