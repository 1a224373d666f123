"""The hooks the edited copy of the FedDC authors' Pneumonia script calls (copied next to it as
``fidelity_shim.py`` by :mod:`authors_feddc`): the common data and model always, and in lockstep
mode raysim's initial model, split and permutations of the same seed.

Set by the harness through the environment:

- ``FIDELITY_CONFIG``: the raysim config of the common setting (a YAML file);
- ``FIDELITY_VARIANT``: its variant (the raysim side of the run);
- ``FIDELITY_DATA_ROOT``: the directory holding ``pneumoniamnist.npz``;
- ``FIDELITY_MODE``: ``independent`` (the authors' own protocol: their seed, one independent
  initialisation per client, their split and shuffles), ``shared-init`` (as independent, but
  every client starts from raysim's initial model of the seed) or ``lockstep`` (raysim's
  initial model, split and permutations).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import torch


@functools.cache
def _experiment() -> Any:
    from raysim.configuration.experiment import load_experiments

    variant = os.environ["FIDELITY_VARIANT"]
    experiments = load_experiments(os.environ["FIDELITY_CONFIG"])
    if variant not in experiments:
        raise SystemExit(f"fidelity shim: no variant {variant!r} in "
                         f"{os.environ['FIDELITY_CONFIG']}")
    return experiments[variant]


@functools.cache
def _dataset() -> Any:
    from raysim.data import load_dataset

    return load_dataset(_experiment().dataset, os.environ["FIDELITY_DATA_ROOT"])


def _mode() -> str:
    return os.environ.get("FIDELITY_MODE", "independent")


def _lockstep() -> bool:
    return _mode() == "lockstep"


def _seed() -> int:
    return int(os.environ["FIDELITY_SEED"])


def common_data(device: torch.device) -> tuple[torch.Tensor, ...]:
    """(X_train, y_train, X_test, y_test) as raysim feeds them: normalised float32 NCHW
    images and int64 class labels, replacing the authors' 224 px image-folder loader."""
    from raysim.data.dataset import to_tensor

    data = _dataset()
    return (to_tensor(data.train_x, data.info).to(device),
            torch.as_tensor(data.train_y.reshape(-1), device=device),
            to_tensor(data.test_x, data.info).to(device),
            torch.as_tensor(data.test_y.reshape(-1), device=device))


def common_model() -> torch.nn.Module:
    """raysim's model of the common setting, replacing the authors' ResNet18: freshly drawn
    from torch's global generator (one per client, as the authors' loop draws), or (modes
    shared-init and lockstep) loaded with raysim's initial model of the seed."""
    from raysim.models import build_model

    model = build_model(_experiment().model, _dataset().info)
    if _mode() in ("shared-init", "lockstep"):
        from raysim.preparation import initial_weights
        weights = initial_weights(_experiment(), _dataset(), _seed())
        model.load_state_dict({name: torch.as_tensor(value) for name, value in weights.items()})
    return model


def split(n_train: int, num_clients: int, per_client: int, rng: np.random.RandomState,
          authors_split: Any) -> list[np.ndarray]:
    """Each client's training indices: the authors' ``splitIntoLocalData``, or in lockstep
    raysim's partition of the seed (the authors' generator is then left untouched)."""
    if not _lockstep():
        return authors_split(n_train, num_clients, per_client, rng)
    from raysim.preparation import prepare

    partition = prepare(_experiment(), os.environ["FIDELITY_DATA_ROOT"],
                        read=_dataset)[_seed()][1]
    if len(partition.train) != num_clients:
        raise SystemExit(f"fidelity shim: raysim has {len(partition.train)} clients, the "
                         f"authors' script {num_clients}")
    return [np.asarray(indices) for indices in partition.train]


@functools.cache
def _algorithm() -> Any:
    from raysim.algorithms import ALGORITHMS
    from raysim.preparation import run_context

    config = _experiment()
    context = run_context(config, _dataset(), _seed(), config.partition.num_clients)
    return ALGORITHMS[config.algorithm.name](config.algorithm, context)


def daisy_chain(data_index: np.ndarray, round_: int, rng: np.random.RandomState) -> None:
    """Move the models across the clients' data after round ``round_``, in place. The authors'
    script permutes which data each model trains on (``rng.shuffle``); in lockstep it follows
    raysim's permutation of that round, under which client i's model goes to client pi(i): the
    model on data d moves to data pi(d)."""
    if not _lockstep():
        rng.shuffle(data_index)
        return
    permutation = _algorithm().migration(round_)
    if permutation is not None:
        data_index[:] = permutation[data_index]
