"""SCAFFOLD: the control variates are its mechanism. Without the correction it is FedAvg, with
it the runs part; the server's control variate is the mean of the clients' under full
participation; option I refreshes c_i to the gradient at the server model."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import flatten, simulate

from raysim.algorithms import ALGORITHMS
from raysim.algorithms.scaffold import Scaffold
from raysim.configuration.experiment import parse_config
from raysim.preparation import initial_weights
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weights import set_weights


def _config(root, **algorithm):
    raw = contract_raw(root, "scaffold")
    raw["algorithm"] = {"name": "scaffold", **algorithm}
    return parse_config(raw)


def _fedavg(root):
    raw = contract_raw(root, "scaffold")
    raw["algorithm"] = {"name": "fedavg"}
    return parse_config(raw)


class Uncorrected(Scaffold):
    """SCAFFOLD with its mechanism switched off: no gradient correction."""

    def corrections(self, server, clients):
        return None


def _equal(a, b) -> bool:
    left, right = flatten(a), flatten(b)
    return len(left) == len(right) and all(
        np.array_equal(x, y) for x, y in zip(left, right, strict=True))


def test_scaffold_without_its_correction_is_fedavg_and_with_it_is_not(data_root, monkeypatch):
    fedavg = simulate(_fedavg(data_root)).server_state
    scaffold = simulate(_config(data_root)).server_state
    assert not _equal(scaffold.model, fedavg)
    monkeypatch.setitem(ALGORITHMS, "scaffold", Uncorrected)
    uncorrected = simulate(_config(data_root)).server_state
    assert _equal(uncorrected.model, fedavg)


@pytest.mark.parametrize("option", ["I", "II"])
def test_the_server_control_variate_is_the_mean_of_the_clients_under_full_participation(
        data_root, option):
    trace = simulate(_config(data_root, control_update=option))
    server = trace.server_state.control
    clients = [trace.client_states[c] for c in sorted(trace.client_states)]
    assert len(clients) == 3 and any(np.abs(v).max() > 0 for v in server.values())
    for name, value in server.items():
        mean = np.mean([c[name] for c in clients], axis=0)
        np.testing.assert_allclose(value, mean, rtol=1e-4, atol=1e-6)


def test_option_two_refreshes_c_i_from_the_model_difference(data_root):
    # after one round from c = c_i = 0: c_i = (x - y_i) / (K lr), so under full participation
    # with equal client sizes the clients' mean is (x - mean y_i) / (K lr)
    raw = contract_raw(data_root, "scaffold")
    raw["training"].update(rounds=1, local_steps=2)
    config = parse_config(raw)
    trace = simulate(config)
    x = initial_weights(config, trace.dataset, 0)
    y = trace.server_state.model
    for name in trace.server_state.control:
        mean = np.mean([trace.client_states[c][name] for c in trace.client_states], axis=0)
        expected = (np.asarray(x[name]) - np.asarray(y[name])) / (2 * 0.05)
        np.testing.assert_allclose(mean, expected, rtol=1e-3, atol=1e-4)


def test_option_one_refreshes_c_i_to_the_gradient_at_the_server_model(data_root):
    raw = contract_raw(data_root, "scaffold")
    raw["algorithm"]["control_update"] = "I"
    raw["training"]["rounds"] = 1
    config = parse_config(raw)
    trace = simulate(config)
    runtime = trace.runtime
    model = runtime.client_model(1)
    set_weights(model, initial_weights(config, trace.dataset, 0))
    model.train()
    x, y = runtime.client_data(1)
    loss = loss_function(training_loss(trace.algorithm.context.training.loss,
                                       trace.algorithm.context.info))
    loss(model(x), y).backward()
    for name, parameter in model.named_parameters():
        np.testing.assert_allclose(trace.client_states[1][name], parameter.grad.numpy(),
                                   rtol=1e-4, atol=1e-6)


def test_momentum_is_warned_about_and_the_per_client_path_is_reported_as_scaffolds(tmp_path):
    raw = contract_raw(tmp_path, "scaffold")
    plain = parse_config({**raw, "training": {**raw["training"],
                                              "optimizer": {"name": "sgd", "lr": 0.1}}})
    assert Scaffold.config_warnings(plain.algorithm, plain.training) == []
    heavy = parse_config({**raw, "training": {**raw["training"], "optimizer": {
        "name": "sgd", "lr": 0.1, "momentum": 0.9}}})
    (line,) = Scaffold.config_warnings(heavy.algorithm, heavy.training)
    assert "momentum 0.9" in line and "momentum=0" in line
    assert Scaffold.per_client_loop is not None and "control variates" in Scaffold.per_client_loop
