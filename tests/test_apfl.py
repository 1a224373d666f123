"""APFL: each client's model is alpha v + (1 - alpha) w of its personal model and the global
one; alpha is learned per client; the global model is trained on the clients' own losses."""

from __future__ import annotations

import numpy as np
from algorithm_configs import contract_raw
from inprocess import simulate

from raysim.configuration.experiment import parse_config


def _trace(root, **algorithm):
    raw = contract_raw(root, "apfl")
    raw["algorithm"] = {"name": "apfl", **algorithm}
    return simulate(parse_config(raw))


def _vector(weights) -> np.ndarray:
    return np.concatenate([np.asarray(weights[k], np.float64).ravel() for k in sorted(weights)])


def test_alpha_is_learned_per_client_and_fixed_without_adaptation(data_root):
    adaptive = _trace(data_root, alpha=0.5)
    alphas = [state[1] for state in adaptive.client_states.values()]
    assert all(0 <= a <= 1 and a != 0.5 for a in alphas)
    assert len(set(alphas)) == len(alphas)
    fixed = _trace(data_root, alpha=0.5, adaptive=False)
    assert all(state[1] == 0.5 for state in fixed.client_states.values())


def test_the_personal_model_mixes_the_clients_own_with_the_global_one(data_root):
    trace = _trace(data_root, alpha=0.3, adaptive=False)
    algorithm, global_model = trace.algorithm, trace.server_state
    parameters = algorithm._parameter_names()
    own, alpha = trace.client_states[0]
    personal = algorithm.compose_personal(trace.client_states[0],
                                          algorithm.personal_base(global_model))
    name = sorted(parameters)[0]
    np.testing.assert_allclose(personal[name], alpha * own[name] + (1 - alpha) * global_model[name],
                               rtol=1e-6)
    assert not np.array_equal(own[name], global_model[name])


def test_alpha_zero_is_fedavg_and_the_personal_models_train_on_the_mixture(data_root):
    """With alpha fixed at 0 the personal model is the global one (FedAvg's: the global copy
    trains on its own loss alone); with alpha fixed at 1 the personal models train alone
    and differ from it."""
    fedavg = simulate(parse_config(contract_raw(data_root, "fedavg"))).server_state
    zero = _trace(data_root, alpha=0.0, adaptive=False)
    np.testing.assert_allclose(_vector(zero.server_state), _vector(fedavg), rtol=1e-5,
                               atol=1e-6)
    base = zero.algorithm.personal_base(zero.server_state)
    mixed = zero.algorithm.compose_personal(zero.client_states[0], base)
    parameters = zero.algorithm._parameter_names()
    for name in parameters:
        np.testing.assert_array_equal(mixed[name], np.asarray(base[name], np.float32))
    one = _trace(data_root, alpha=1.0, adaptive=False)
    assert np.linalg.norm(_vector(one.client_states[0][0]) - _vector(one.server_state)) > 0
