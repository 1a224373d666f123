"""+FT (``evaluation.fine_tune_epochs``): each client continues the final global model on its
own training share; refused for methods without one global model; shown by the per-client
report beside the server model. (The engine run that writes the ``ft_`` columns is in
test_segmentation.py.)"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from algorithm_configs import contract_raw
from inprocess import simulate

from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError
from raysim.preparation import prepare
from raysim.results.report import client_table
from raysim.training.fine_tune import fine_tuned
from raysim.vectors.weights import get_weights


def _vector(weights) -> np.ndarray:
    return np.concatenate([np.asarray(weights[k], np.float64).ravel() for k in sorted(weights)])


def test_fine_tuning_continues_the_global_model_on_each_clients_own_data(data_root):
    trace = simulate(parse_config(contract_raw(data_root, "fedavg")))
    start = trace.server_state
    tuned = [_vector(get_weights(fine_tuned(trace.runtime, client, 2, start, 1)))
             for client in (0, 1)]
    assert not np.array_equal(tuned[0], _vector(start))
    assert not np.array_equal(tuned[0], tuned[1])  # each on its own share
    again = _vector(get_weights(fine_tuned(trace.runtime, 0, 2, start, 1)))
    np.testing.assert_array_equal(again, tuned[0])  # its batches from its own stream
    longer = _vector(get_weights(fine_tuned(trace.runtime, 0, 2, start, 2)))
    assert not np.array_equal(longer, tuned[0])
    assert torch.is_grad_enabled()


@pytest.mark.parametrize(("name", "needle"), [
    ("local", "no one global model"), ("fedbn", "no one global model"),
    ("centralized", "pooled data")])
def test_methods_without_one_global_model_refuse_fine_tuning(data_root, name, needle):
    raw = contract_raw(data_root, name)
    raw["evaluation"] = {"fine_tune_epochs": 1}
    with pytest.raises(ConfigError, match=needle) as refused:
        prepare(parse_config(raw), None)
    assert "evaluation.fine_tune_epochs" in str(refused.value)


def test_the_per_client_report_shows_the_fine_tuned_models_beside_the_servers():
    rows = [{"experiment": "e", "algorithm": "fedavg", "run": "fedavg/seed_0", "round": 4,
             "client": c, "main_own_dice": 0.5, "ft_own_dice": 0.6 + c / 10} for c in (0, 1)]
    table = client_table(pd.DataFrame(rows), "dice").set_index("model")
    assert table.loc["server", "average"] == pytest.approx(0.5)
    assert table.loc["fine-tuned", "client 1"] == pytest.approx(0.7)
