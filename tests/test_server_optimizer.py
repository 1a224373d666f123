"""The server's step as a layer (Reddi et al. 2021, Algorithm 2): FedAvgM, FedAdagrad, FedAdam
and FedYogi on the round's mean; plain averaging to the bit at lr 1 without momentum; each
optimizer's first steps as the paper writes them; under DP the optimizer sees the private mean
only; its state survives a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import flatten, simulate, through_state_file

from raysim.config import parse_config
from raysim.errors import ConfigError
from raysim.layers import server_optimizer
from raysim.layers.server_optimizer import ServerMoments, server_step
from raysim.schema import ServerOptimizerConfig
from raysim.vectors.weights import FlatWeights

LAYOUT = (("w", (3,)),)


def _flat(values) -> FlatWeights:
    return FlatWeights(np.asarray(values, dtype=np.float32), LAYOUT)


def _same(a, b) -> bool:
    left, right = flatten(a), flatten(b)
    return len(left) == len(right) and all(np.array_equal(x, y) for x, y in zip(left, right, strict=True))


def test_sgd_at_lr_one_without_momentum_is_fedavg_to_the_bit(data_root):
    raw = contract_raw(data_root, "fedavg")
    plain = simulate(parse_config(raw))
    stepped = simulate(parse_config({**raw, "server_optimizer": {"name": "sgd"}}))
    assert _same(plain.server_state, stepped.server_state.model)
    moved = simulate(parse_config({**raw, "server_optimizer": {"name": "sgd", "lr": 0.5}}))
    assert not _same(plain.server_state, moved.server_state.model)


def _steps(settings: ServerOptimizerConfig, means: list[list[float]], start: list[float]):
    current, moments, models = _flat(start), ServerMoments(), []
    for mean in means:
        current, moments = server_step(settings, current, _flat(mean), moments)
        models.append(np.asarray(current["w"], dtype=np.float64))
    return models


MEANS = [[1.0, -0.5, 0.25], [0.5, 0.5, -0.25], [2.0, 0.0, 0.125]]
START = [0.0, 0.0, 0.0]


def _by_hand(kind: str, lr: float, beta1=0.9, beta2=0.99, tau=1e-3, momentum=0.0):
    x = np.array(START, dtype=np.float64)
    m, v, models = np.zeros(3), np.full(3, tau ** 2), []
    for mean in MEANS:
        delta = np.array(mean) - x
        if kind == "sgd":
            m = momentum * m + delta
            x = x + lr * m
        else:
            m = beta1 * m + (1 - beta1) * delta
            if kind == "adagrad":
                v = v + delta ** 2
            elif kind == "adam":
                v = beta2 * v + (1 - beta2) * delta ** 2
            else:
                v = v - (1 - beta2) * delta ** 2 * np.sign(v - delta ** 2)
            x = x + lr * m / (np.sqrt(v) + tau)
        x = x.astype(np.float32).astype(np.float64)  # the model is stored in float32
        models.append(x.copy())
    return models


@pytest.mark.parametrize("kind, options", [
    ("sgd", {"lr": 0.7, "momentum": 0.9}), ("adagrad", {"lr": 0.1}), ("adam", {"lr": 0.1}),
    ("yogi", {"lr": 0.1}), ("adam", {"lr": 0.05, "beta1": 0.5, "beta2": 0.9, "tau": 0.1})])
def test_each_optimizers_first_steps_are_reddi_et_als_algorithm_2(kind, options):
    settings = ServerOptimizerConfig(name=kind, **options)
    extra = {k: v for k, v in options.items() if k != "lr"}
    expected = _by_hand(kind, options["lr"], **extra)
    for got, want in zip(_steps(settings, MEANS, START), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_adams_second_moment_shapes_its_trajectory(monkeypatch):
    settings = ServerOptimizerConfig(name="adam", lr=0.1)
    with_second = _steps(settings, MEANS, START)
    frozen = ServerMoments()

    def without_second(settings, current, mean, moments):  # v held at tau^2
        model, after = original(settings, current, mean, moments)
        held = np.full_like(after.second, settings.tau ** 2)
        first = after.first
        now = np.asarray(current["w"], dtype=np.float64)
        model = _flat(now + settings.step_size * first / (np.sqrt(held) + settings.tau))
        return model, ServerMoments(first, held, after.steps)

    original = server_step
    current, moments = _flat(START), frozen
    trajectory = []
    for mean in MEANS:
        current, moments = without_second(settings, current, _flat(mean), moments)
        trajectory.append(np.asarray(current["w"], dtype=np.float64))
    assert not all(np.allclose(a, b) for a, b in zip(with_second, trajectory, strict=True))


def test_under_dp_the_optimizer_steps_on_the_private_mean_only(data_root, monkeypatch):
    raw = {**contract_raw(data_root, "fedavg"),
           "privacy": {"clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3},
           "server_optimizer": {"name": "adam"}}
    seen = []
    original = server_optimizer.server_step

    def recording(settings, current, mean, moments):
        seen.append(np.array(flatten(mean)[0], copy=True))
        return original(settings, current, mean, moments)

    monkeypatch.setattr(server_optimizer, "server_step", recording)
    trace = simulate(parse_config(raw))
    layer = trace.algorithm
    assert type(layer).__name__ == "ServerOptimizer"
    assert type(layer.inner).__name__ == "PrivateMean"  # the mean it reads is the private one
    assert len(seen) == 3
    noiseless = simulate(parse_config({**raw, "privacy": {**raw["privacy"],
                                                          "noise_multiplier": 0.0}}))
    assert not _same(trace.server_state.model, noiseless.server_state.model)


def test_the_optimizer_state_survives_a_checkpoint_bit_for_bit(data_root):
    raw = {**contract_raw(data_root, "fedavg"), "server_optimizer": {"name": "yogi"}}
    config = parse_config(raw)
    reference = simulate(config)
    assert reference.server_state.moments.steps == 3
    assert _same(reference.server_state, through_state_file(reference.server_state))
    resumed = simulate(config, fresh_objects=True)  # states through a state file every round
    assert _same(reference.server_state, resumed.server_state)


def test_a_method_without_a_mean_model_is_refused(data_root):
    from raysim.preparation import prepare

    raw = {**contract_raw(data_root, "scaffold"), "server_optimizer": {"name": "adam"}}
    with pytest.raises(ConfigError, match="server_optimizer"):
        prepare(parse_config(raw), None)


def test_fedbuff_takes_its_server_step_from_the_optimizer_layer(data_root):
    """Under FedBuff the buffered mean goes through the server step: system.server_lr is the
    layer's SGD step, and a server optimizer moves the model elsewhere than the mean."""
    raw = {**contract_raw(data_root, "fedavg"),
           "system": {"tiers": {"cpu_server": 0.5, "constrained_site": 0.5},
                      "policy": "fedbuff", "buffer_size": 2},
           "partition": {"scheme": "iid", "num_clients": 6}}
    plain = simulate(parse_config(raw)).server_state.model
    halved = simulate(parse_config({**raw, "system": {**raw["system"], "server_lr": 0.5}}))
    adam = simulate(parse_config({**raw, "server_optimizer": {"name": "adam"}}))
    assert type(halved.algorithm.inner).__name__ == "ServerOptimizer"
    assert not _same(plain, halved.server_state.model.model)
    assert not _same(plain, adam.server_state.model.model)
