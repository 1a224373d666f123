"""The algorithm contract, over every registered algorithm (Ray-free, tests/inprocess.py):

- client-side and server-side hooks keep nothing on the algorithm object between rounds that
  the results depend on (what must survive goes into the server state, the messages or the
  client states): new objects every round give the same numbers;
- server and client states survive a pickle round-trip (a checkpoint, a restarted worker);
- results do not depend on how clients are grouped for the per-worker reduce (up to float
  summation order).
"""

from __future__ import annotations

import numpy as np
import pytest
from fixtures import write_medmnist_npz
from inprocess import flatten, simulate

from raysim.algorithms import ALGORITHMS
from raysim.config import parse_config

HETERO = {"clients": {"architectures": ["resnet5", "shufflenetv2"], "assign": "cycle"},
          "model": {"name": "resnet5"}}
CONFIGS: dict[str, dict] = {
    "fedavg": {},
    "fedprox": {"algorithm": {"name": "fedprox", "mu": 0.1}},
    "centralized": {},
    "local": HETERO,
    "feddc": {"algorithm": {"name": "feddc", "daisy_period": 1, "aggregation_period": 2}},
    "fedsm": {"algorithm": {"name": "fedsm", "gamma": 0.5},
              "partition": {"scheme": "iid", "num_clients": 3, "site_shift": {"strength": 1.0}}},
    "feddm": {"algorithm": {"name": "feddm", "iterations": 3, "real_per_class": 8,
                            "server_epochs": 1, "server_batch_size": 16},
              "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"}},
    "fedvck": {"algorithm": {"name": "fedvck", "iterations": 3, "real_per_class": 8,
                             "server_epochs": 1, "server_batch_size": 16, "hard_negatives": 1},
               "model": {"name": "convnet", "width": 8, "depth": 2, "norm": "batch"}},
    "mhpflid": {**HETERO, "algorithm": {"name": "mhpflid", "injection_epochs": 1,
                                        "distillation_epochs": 1,
                                        "messenger_widths": [8, 8, 16], "messenger_hidden": 8}},
    "fedmd": {**HETERO, "algorithm": {"name": "fedmd", "public_per_client": 4,
                                      "pretrain_epochs": 1}},
    "feddf": {**HETERO, "algorithm": {"name": "feddf", "public_per_client": 4,
                                      "distillation_steps": 3, "distillation_batch_size": 8}},
}


def _raw(root, name: str) -> dict:
    raw = {
        "name": f"contract-{name}",
        "dataset": {"name": "pneumoniamnist", "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": 3},
        "model": {"name": "convnet", "width": 8, "depth": 2},
        "algorithm": {"name": name},
        "training": {"rounds": 3, "batch_size": 16, "optimizer": {"name": "adam", "lr": 0.003}},
        "seeds": [0],
    }
    raw.update(CONFIGS[name])
    return raw


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    write_medmnist_npz(root, n_train=90, n_test=30)
    return root


def test_every_registered_algorithm_is_covered():
    assert set(CONFIGS) == set(ALGORITHMS)


def _same(a, b, exact: bool) -> bool:
    left, right = flatten(a), flatten(b)
    if len(left) != len(right):
        return False
    if exact:
        return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(left, right, strict=True))
    return all(np.allclose(x.astype(float), y.astype(float), rtol=1e-4, atol=1e-5,
                           equal_nan=True) for x, y in zip(left, right, strict=True))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_results_survive_new_objects_pickled_states_and_other_groupings(data_root, name):
    config = parse_config(_raw(data_root, name))
    reference = simulate(config)
    restarted = simulate(config, fresh_objects=True)
    assert reference.metrics == restarted.metrics or _same(reference.metrics, restarted.metrics,
                                                           exact=True)
    assert _same(reference.server_state, restarted.server_state, exact=True)
    assert _same(reference.client_states, restarted.client_states, exact=True)
    regrouped = simulate(config, group_size=3)
    assert _same(reference.metrics, regrouped.metrics, exact=False)
    assert _same(reference.server_state, regrouped.server_state, exact=False)
