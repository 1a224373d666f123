"""DS-pFL and KT-pFL, the public-set methods beside FedMD: each fails its test when its defining
mechanism is switched off (DS-pFL's entropy reduction aggregation, KT-pFL's learned
knowledge-coefficient matrix)."""

from __future__ import annotations

import numpy as np
from algorithm_configs import contract_raw
from inprocess import flatten, simulate

from raysim.algorithms.dspfl import entropy_reduction
from raysim.algorithms.ktpfl import coefficient_step
from raysim.configuration.experiment import parse_config


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(axis=1)


def test_era_sharpens_the_average_and_keeps_its_argmax():
    rng = np.random.default_rng(0)
    soft = rng.dirichlet(np.ones(4), size=50)
    sharpened = entropy_reduction(soft, 0.1)
    np.testing.assert_allclose(sharpened.sum(axis=1), 1.0)
    assert (_entropy(sharpened) < _entropy(soft)).all()
    assert (sharpened.argmax(axis=1) == soft.argmax(axis=1)).all()
    expected = np.exp(soft / 0.1) / np.exp(soft / 0.1).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(sharpened, expected, rtol=1e-12)
    assert entropy_reduction(soft, None) is soft  # simple averaging


def _dspfl(root, era):
    raw = contract_raw(root, "dspfl")
    raw["algorithm"] = {**raw["algorithm"], "era_temperature": era}
    return simulate(parse_config(raw))


def test_dspfl_server_labels_are_the_sharpened_mean_and_era_changes_the_clients(data_root):
    era, averaged = _dspfl(data_root, 0.1), _dspfl(data_root, None)
    # the server's labels are distributions over the classes; ERA's have less entropy
    assert averaged.server_state["logits"].shape[1] == 2
    assert np.allclose(averaged.server_state["logits"].sum(axis=1), 1.0, atol=1e-5)
    assert (_entropy(era.server_state["logits"].astype(float) + 1e-12)
            < _entropy(averaged.server_state["logits"].astype(float) + 1e-12)).mean() > 0.9
    # the mechanism reaches the clients' models: switching ERA off changes them
    assert not all(np.array_equal(a, b) for a, b in zip(flatten(era.client_states),
                                                        flatten(averaged.client_states),
                                                        strict=True))


def test_the_coefficient_step_leans_on_clients_that_predict_alike():
    rng = np.random.default_rng(1)
    base_a, base_b = rng.dirichlet(np.ones(3), size=20), rng.dirichlet(np.ones(3), size=20)
    predictions = np.stack([base_a, base_a + 0.01, base_b, base_b + 0.01])
    predictions /= predictions.sum(axis=2, keepdims=True)
    uniform = np.full((4, 4), 0.25)
    stepped = coefficient_step(uniform, predictions, np.ones(4, bool), lr=5.0, penalty=0.0,
                               sharpness=5.0)
    np.testing.assert_allclose(stepped.sum(axis=1), 1.0)
    assert stepped[0, 1] > stepped[0, 2] and stepped[2, 3] > stepped[2, 0]
    # switched off (no step): the rows stay uniform, every client's target is the plain mean
    still = coefficient_step(uniform, predictions, np.ones(4, bool), lr=0.0, penalty=0.0,
                             sharpness=5.0)
    np.testing.assert_allclose(still, uniform)


def _ktpfl(root, lr):
    raw = contract_raw(root, "ktpfl")
    raw["partition"] = {"scheme": "dirichlet", "num_clients": 4, "beta": 0.3, "min_size": 8}
    raw["algorithm"] = {**raw["algorithm"], "coefficient_lr": lr}
    return simulate(parse_config(raw))


def test_ktpfl_targets_are_personal_only_with_the_learned_matrix(data_root):
    learned, fixed = _ktpfl(data_root, 50.0), _ktpfl(data_root, 0.0)
    targets = fixed.server_state.targets
    assert all(np.allclose(targets[0], t, atol=1e-6) for t in targets[1:])  # the plain mean
    assert not np.allclose(fixed.server_state.coefficients, learned.server_state.coefficients)
    targets = learned.server_state.targets
    assert not all(np.allclose(targets[0], t, atol=1e-6) for t in targets[1:])
    np.testing.assert_allclose(learned.server_state.coefficients.sum(axis=1), 1.0, rtol=1e-9)
