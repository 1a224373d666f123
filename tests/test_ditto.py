"""Ditto: its global model is FedAvg's, lambda 0 makes its personal models local training,
and lambda > 0 pulls them towards the global model."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import simulate

from raysim.configuration.experiment import parse_config


def _trace(root, algorithm):
    raw = contract_raw(root, "ditto")
    raw["algorithm"] = algorithm
    return simulate(parse_config(raw))


def _vector(weights) -> np.ndarray:
    return np.concatenate([np.asarray(weights[name], dtype=np.float64).ravel()
                           for name in sorted(weights)])


def test_dittos_global_model_is_fedavgs(data_root):
    ditto = _trace(data_root, {"name": "ditto", "lam": 1.0}).server_state
    fedavg = _trace(data_root, {"name": "fedavg"}).server_state
    np.testing.assert_array_equal(_vector(ditto), _vector(fedavg))


def test_lambda_zero_is_local_training(data_root):
    ditto = _trace(data_root, {"name": "ditto", "lam": 0.0})
    local = _trace(data_root, {"name": "local"})
    for client, state in local.client_states.items():
        np.testing.assert_array_equal(_vector(ditto.client_states[client][0]),
                                      _vector(state[0]))


def test_lambda_pulls_each_personal_model_towards_the_global_one(data_root):
    distances = {}
    for lam in (0.0, 1.0):
        trace = _trace(data_root, {"name": "ditto", "lam": lam})
        global_model = _vector(trace.server_state)
        distances[lam] = [np.linalg.norm(_vector(state[0]) - global_model)
                          for state in trace.client_states.values()]
    assert all(pulled < alone for pulled, alone in zip(distances[1.0], distances[0.0],
                                                       strict=True)), distances


def test_per_client_report_shows_personal_models_where_there_are_any():
    """``raysim report --per-client``: Ditto's clients are scored with their personal models
    (``own_*``), not the global model on their share; FedAvg's with the server's."""
    import pandas as pd

    from raysim.results.report import client_table
    rows = []
    for algorithm, personal in (("ditto", True), ("fedavg", False)):
        for client in (0, 1):
            row = {"experiment": "e", "algorithm": algorithm, "run": f"{algorithm}/seed_0",
                   "round": 4, "client": client, "main_own_accuracy": 0.5}
            if personal:
                row["own_accuracy"] = 0.9 + client / 100
            rows.append(row)
    table = client_table(pd.DataFrame(rows)).set_index("algorithm")
    assert table.loc["ditto", "model"] == "personal"
    assert table.loc["ditto", "client 1"] == pytest.approx(0.91)
    assert table.loc["fedavg", "model"] == "server"
    assert table.loc["fedavg", "average"] == pytest.approx(0.5)
