"""The linear SVM of FedDC's SUSY-shaped Radon experiment: a binary-margin linear model
(features + 1 parameters, logits (0, f(x))) trained with ``training.loss: hinge``, on both
training paths, and its Radon number giving height 2 over 441 clients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raysim.algorithms.robust_means import radon_number
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig
from raysim.data import load_dataset
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.preparation import initial_weights, prepare
from raysim.training.context import ClientData, RunContext
from raysim.training.runtime import ClientRuntime


def _config(vectorize: str) -> object:
    return parse_config({
        "name": "svm", "dataset": {"name": "synthetic-susy"},
        "partition": {"scheme": "iid", "num_clients": 441, "samples_per_client": 2},
        "model": {"name": "mlp", "hidden": [], "binary_margin": True},
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 1, "local_steps": 3, "batch_size": 2, "loss": "hinge",
                     "optimizer": {"name": "sgd", "lr": 0.1}},
        "engine": {"vectorize": vectorize}, "seeds": [0]})


def test_the_binary_margin_linear_model_has_features_plus_one_parameters():
    config = _config("never")
    info = load_dataset(DatasetConfig(name="synthetic-susy")).info
    model = build_model(config.model, info)
    assert sum(p.numel() for p in model.parameters()) == 19 == info.input_shape[0] + 1
    assert radon_number(19) ** 2 == 441  # height 2 over all 441 clients
    logits = model(torch.randn(5, 18))
    assert logits.shape == (5, 2) and torch.all(logits[:, 0] == 0)
    bad = {**config.model.model_dump(), "binary_margin": True}
    with pytest.raises(ConfigError, match="binary_margin"):
        build_model(type(config.model)(**bad), load_dataset(DatasetConfig(name="digits")).info)


def test_hinge_is_the_linear_svms_loss_on_both_training_paths():
    """One client's 3 SGD steps with training.loss: hinge equal a hand-written subgradient
    descent on max(0, 1 - y f(x)) / 2 (y in {-1, +1}), per-client loop and vectorised alike."""
    results = []
    for vectorize in ("never", "always"):
        config = _config(vectorize)
        dataset, partition = prepare(config, None)[0]
        start = initial_weights(config, dataset, 0)
        runtime = ClientRuntime(
            RunContext(0, dataset.info, config.model, config.training, 441, 441),
            ClientData(dataset.train_x, dataset.train_y, partition.train, start),
            torch.device("cpu"), vectorize=vectorize)
        (trained, _), = runtime.train_many([7], 0, [start], [None])
        results.append({k: np.asarray(trained[k], dtype=np.float64) for k in start})
        x = torch.from_numpy(dataset.train_x[partition.train[7]]).double()
        y = torch.from_numpy(dataset.train_y[partition.train[7]]) * 2.0 - 1.0
        w = torch.from_numpy(np.asarray(start["net.1.weight"], dtype=np.float64)).clone()
        b = torch.from_numpy(np.asarray(start["net.1.bias"], dtype=np.float64)).clone()
        for _ in range(3):  # both rows every step (batch 2 of 2 samples)
            margin = y * (x @ w[0] + b[0])
            active = (margin < 1).double() / 2 / len(y)  # d/df of mean(max(0, 1 - y f) / 2)
            w[0] += 0.1 * (active * y) @ x
            b[0] += 0.1 * (active * y).sum()
        np.testing.assert_allclose(results[-1]["net.1.weight"], w.numpy(), atol=1e-5)
        np.testing.assert_allclose(results[-1]["net.1.bias"], b.numpy(), atol=1e-5)
    for name in results[0]:
        np.testing.assert_allclose(results[0][name], results[1][name], atol=1e-6)


def test_the_hinge_equals_torchs_multi_margin_loss():
    from raysim.training.losses import MultiClassHinge

    logits = torch.randn(64, 5, generator=torch.Generator().manual_seed(0)) * 3
    targets = torch.randint(0, 5, (64,), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(MultiClassHinge()(logits, targets),
                          torch.nn.MultiMarginLoss()(logits, targets), atol=1e-6)
