"""MOON: the model-contrastive term pulls a client's representation towards the global
model's and away from its own previous model's; without it (mu = 0) MOON is FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from algorithm_configs import contract_raw
from inprocess import fedavg_equivalent, simulate

from raysim.algorithms.moon import contrastive_term
from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError


def _run(data_root, **algorithm):
    raw = contract_raw(data_root, "moon")
    raw["algorithm"] = {"name": "moon", **algorithm}
    raw["engine"] = {"vectorize": "never"}  # FedAvg below on the same per-client loop
    return simulate(parse_config(raw))


def test_the_contrastive_term_prefers_the_global_representation():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    near, far = z.clone(), -z
    low = contrastive_term(z, near, far, 0.5)
    high = contrastive_term(z, far, near, 0.5)
    assert low < 0.05 < 1.0 < high  # positive aligned, negative opposite: a small loss
    expected = -torch.log_softmax(torch.tensor([1.0, -1.0]) / 0.5, dim=0)[0]
    assert low.item() == pytest.approx(expected.item(), rel=1e-6)


def test_without_the_contrastive_term_moon_is_fedavg(data_root):
    raw = contract_raw(data_root, "fedavg")
    raw["engine"] = {"vectorize": "never"}
    fedavg_equivalent(_run(data_root, mu=0.0).server_state, simulate(parse_config(raw)).server_state,
                      _run(data_root, mu=5.0).server_state)


def test_the_previous_model_is_the_clients_own_last_model(data_root):
    """Each client keeps the model it trained as its state: the next round's negative."""
    trace = _run(data_root, mu=1.0)
    assert set(trace.client_states) == {0, 1, 2}
    states = [trace.client_states[c] for c in range(3)]
    key = next(iter(states[0]))
    assert not np.allclose(states[0][key], states[1][key])  # each client's own model


def test_a_model_without_an_embedding_is_refused(data_root):
    raw = contract_raw(data_root, "moon")
    raw["model"] = {"name": "mlp", "hidden": [16]}
    with pytest.raises(ConfigError, match="MOON contrasts the representations"):
        simulate(parse_config(raw))


def test_the_negative_is_the_state_a_client_kept(data_root):
    """A client without a previous model contrasts against the global model itself (no pull
    at all: both similarities are equal); with its kept model the result moves."""
    trace = _run(data_root, mu=5.0)
    algorithm, runtime = trace.algorithm, trace.runtime
    start = trace.server_state
    kept = trace.client_states[1]
    fresh = algorithm.local_updates(runtime, [0], 3, {"model": start}, [None])[0]
    remembered = algorithm.local_updates(runtime, [0], 3, {"model": start}, [kept])[0]
    plain = _run(data_root, mu=0.0).algorithm.local_updates(runtime, [0], 3,
                                                             {"model": start}, [None])[0]
    key = next(iter(start))
    np.testing.assert_allclose(fresh.upload["model"][key], plain.upload["model"][key],
                               rtol=1e-5, atol=1e-6)
    assert not np.allclose(remembered.upload["model"][key], fresh.upload["model"][key])
