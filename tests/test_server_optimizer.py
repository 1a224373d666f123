"""The server's step as a layer (Reddi et al. 2021, Algorithm 2): FedAvgM, FedAdagrad, FedAdam
and FedYogi on the round's mean; plain averaging to the bit at lr 1 without momentum; each
optimizer's first steps as the paper writes them; under DP the optimizer sees the private mean
only; its state survives a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import flatten, simulate, through_state_file

from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import ServerOptimizerConfig
from raysim.errors import ConfigError
from raysim.layers import server_optimizer
from raysim.layers.server_optimizer import ServerMoments, server_step
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

    def recording(settings, current, mean, moments, stepped=None):
        seen.append(np.array(flatten(mean)[0], copy=True))
        return original(settings, current, mean, moments, stepped)

    monkeypatch.setattr(server_optimizer, "server_step", recording)
    trace = simulate(parse_config(raw), cached=False)
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


# ----- running statistics take the mean; the optimizer steps trainable parameters only -----

STATS_LAYOUT = (("w", (2,)), ("bn.running_var", (1,)))


def _stats_flat(w: list[float], var: float) -> FlatWeights:
    return FlatWeights(np.asarray([*w, var], dtype=np.float32), STATS_LAYOUT)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi", "sgd"])
def test_a_small_running_variance_takes_the_mean_not_the_step(kind):
    """The constructed case: a running variance of 0.004 whose clients' mean is 0.001, lr
    0.01 (sgd: lr 0.5 with momentum). Stepped as a parameter it turns negative within five
    rounds under the adaptive optimizers (eval-mode BatchNorm then gives NaN); as a running
    statistic it is the mean every round, while the parameters still move by the step."""
    options = {"lr": 0.5, "momentum": 0.9} if kind == "sgd" else {"lr": 0.01}
    settings = ServerOptimizerConfig(name=kind, **options)
    kept = everything = _stats_flat([0.0, 0.0], 0.004)
    kept_moments = all_moments = ServerMoments()
    everything_vars = []
    for _ in range(5):
        mean = _stats_flat([1.0, -1.0], 0.001)
        kept, kept_moments = server_step(settings, kept, mean, kept_moments, stepped={"w"})
        everything, all_moments = server_step(settings, everything, mean, all_moments)
        assert float(kept["bn.running_var"][0]) == np.float32(0.001)
        assert not np.array_equal(kept["w"], mean["w"])  # the parameters are stepped
        everything_vars.append(float(everything["bn.running_var"][0]))
    np.testing.assert_array_equal(kept["w"], everything["w"])  # same step on the parameters
    if kind != "sgd":
        assert min(everything_vars) < 0  # what stepping the statistics would do


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_a_batchnorm_models_statistics_are_the_rounds_mean_under_each_optimizer(
        data_root, monkeypatch, kind):
    """A ConvNet with BatchNorm under each adaptive optimizer, through the run's layers: every
    round the next model's running means and variances are the clients' mean, its weights
    the optimizer's step away from it, and the model evaluates to finite numbers."""
    raw = {**contract_raw(data_root, "fedavg"),
           "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"},
           "engine": {"vectorize": "never"},
           "server_optimizer": {"name": kind, "lr": 0.05}}
    steps = []
    original = server_optimizer.server_step

    def recording(settings, current, mean, moments, stepped=None):
        result = original(settings, current, mean, moments, stepped)
        steps.append((dict(mean.items()), dict(result[0].items())))
        return result

    monkeypatch.setattr(server_optimizer, "server_step", recording)
    trace = simulate(parse_config(raw), cached=False)
    assert len(steps) == 3
    for mean, model in steps:
        statistics = [name for name in mean if "running_" in name]
        weights = [name for name in mean if name.endswith(".weight")]
        assert statistics and weights
        for name in statistics:
            np.testing.assert_array_equal(np.asarray(model[name]), np.asarray(mean[name]))
        assert any(not np.array_equal(model[name], mean[name]) for name in weights)
    assert all(np.isfinite(value) for row in trace.metrics[-1].values()
               for value in row.values() if isinstance(value, float))


# ----- Flower's equations (convention: flower) -----
# Flower's strategies, written out from adap/flower's framework/py/flwr/server/strategy/
# fedadagrad.py (FedAdagrad: FedOpt with beta_1 = beta_2 = 0), fedadam.py (FedAdam) and
# fedyogi.py (FedYogi), aggregate_fit; fedavgm.py (FedAvgM): the pseudo-gradient
# delta_t = fedavg - current, m_t and v_t start at zeros on the first round, and
#   FedAdagrad: m_t = beta_1 m_t + (1 - beta_1) delta_t with beta_1 = 0; v_t = v_t + delta_t^2;
#               x = x + eta m_t / (sqrt(v_t) + tau)
#   FedAdam:    m_t as above; v_t = beta_2 v_t + (1 - beta_2) delta_t^2;
#               eta_norm = eta sqrt(1 - beta_2^(server_round + 1)) / (1 - beta_1^(server_round + 1));
#               x = x + eta_norm m_t / (sqrt(v_t) + tau)
#   FedYogi:    m_t as above; v_t = v_t - (1 - beta_2) delta_t^2 sign(v_t - delta_t^2);
#               x = x + eta m_t / (sqrt(v_t) + tau)
#   FedAvgM:    the momentum vector is the pseudo-gradient on round 1, then
#               momentum v + pseudo-gradient; x = x + server_learning_rate v
# with server_round counted from 1.


def _flower(kind: str, eta: float, beta_1=0.9, beta_2=0.99, tau=1e-3, momentum=0.0):
    x = np.array(START, dtype=np.float64)
    m_t, v_t, models = np.zeros(3), np.zeros(3), []
    for server_round, mean in enumerate(MEANS, start=1):
        delta_t = np.array(mean) - x
        if kind == "sgd":
            m_t = delta_t if server_round == 1 else momentum * m_t + delta_t
            x = x + eta * m_t
        else:
            b1 = 0.0 if kind == "adagrad" else beta_1
            m_t = b1 * m_t + (1 - b1) * delta_t
            rate = eta
            if kind == "adagrad":
                v_t = v_t + delta_t * delta_t
            elif kind == "adam":
                v_t = beta_2 * v_t + (1 - beta_2) * delta_t * delta_t
                rate = eta * np.sqrt(1 - beta_2 ** (server_round + 1.0)) / (
                    1 - beta_1 ** (server_round + 1.0))
            else:
                v_t = v_t - (1.0 - beta_2) * delta_t * delta_t * np.sign(v_t - delta_t * delta_t)
            x = x + rate * m_t / (np.sqrt(v_t) + tau)
        x = x.astype(np.float32).astype(np.float64)  # the model is stored in float32
        models.append(x.copy())
    return models


@pytest.mark.parametrize("kind, options", [
    ("sgd", {"lr": 0.7, "momentum": 0.9}), ("adagrad", {"lr": 0.1}), ("adam", {"lr": 0.1}),
    ("yogi", {"lr": 0.1}), ("adam", {"lr": 0.05, "beta1": 0.5, "beta2": 0.9, "tau": 0.1}),
    ("yogi", {"lr": 0.01, "tau": 1e-9})])
def test_convention_flower_follows_flowers_update_rules(kind, options):
    settings = ServerOptimizerConfig(name=kind, convention="flower", **options)
    renamed = {"beta1": "beta_1", "beta2": "beta_2"}
    extra = {renamed.get(k, k): v for k, v in options.items() if k != "lr"}
    expected = _flower(kind, options["lr"], **extra)
    for got, want in zip(_steps(settings, MEANS, START), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi"])
def test_the_two_conventions_differ_where_flower_differs(kind):
    paper = _steps(ServerOptimizerConfig(name=kind, lr=0.1), MEANS, START)
    flower = _steps(ServerOptimizerConfig(name=kind, lr=0.1, convention="flower"), MEANS, START)
    assert not np.allclose(paper[0], flower[0])
    sgd = {"name": "sgd", "lr": 0.7, "momentum": 0.9}
    np.testing.assert_array_equal(
        _steps(ServerOptimizerConfig(**sgd), MEANS, START),
        _steps(ServerOptimizerConfig(**sgd, convention="flower"), MEANS, START))


def test_flowers_adagrad_refuses_a_first_moment_decay():
    with pytest.raises(ValueError, match="beta1"):
        ServerOptimizerConfig(name="adagrad", convention="flower", beta1=0.5)
    ServerOptimizerConfig(name="adagrad", convention="flower")
