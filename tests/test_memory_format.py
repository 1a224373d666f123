"""``engine.memory_format``: on CPUs the per-client path keeps convolutional models (and the
modules algorithms build beside them) channels-last, which trains to the same weights as the
contiguous layout up to float32 rounding."""

from __future__ import annotations

import numpy as np
import torch

from raysim.configuration.experiment import DatasetConfig
from raysim.configuration.schema import OptimizerConfig, TrainingConfig
from raysim.data import load_dataset
from raysim.models import MODELS, build_model
from raysim.models.messenger import Messenger
from raysim.training.context import ClientData, RunContext
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import get_weights


def _runtime(model_name: str, memory_format: str, vectorize: str = "auto",
             **options: object) -> ClientRuntime:
    dataset = load_dataset(DatasetConfig(name="digits"))
    params = MODELS[model_name].params(**options)
    torch.manual_seed(0)
    return ClientRuntime(
        RunContext(1, dataset.info, params,
                   TrainingConfig(local_steps=3, batch_size=8,
                                  optimizer=OptimizerConfig(lr=0.05, momentum=0.9)),
                   2, 2, memory_format=memory_format),
        ClientData(dataset.train_x, dataset.train_y, [np.arange(0, 40), np.arange(40, 80)],
                   get_weights(build_model(params, dataset.info))),
        torch.device("cpu"), vectorize=vectorize)


def _channels_last(module: torch.nn.Module) -> bool:
    weights = [m.weight for m in module.modules()  # (one input channel: both layouts agree)
               if isinstance(m, torch.nn.Conv2d) and m.weight.shape[1] > 1]
    assert weights
    return all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
               for w in weights)


def test_auto_trains_convolutions_channels_last_on_cpu_to_the_contiguous_weights():
    fast = _runtime("convnet", "auto", norm="batch")
    plain = _runtime("convnet", "contiguous", norm="batch")
    assert fast.path == plain.path == "loop"
    assert _channels_last(fast.model) and not _channels_last(plain.model)
    assert _channels_last(fast.place(Messenger(1, 10)))  # e.g. MH-pFLID's messenger
    start = plain.initial_weights
    trained_fast = fast.train_many([0, 1], 0, [start, start], [None, None])
    trained_plain = plain.train_many([0, 1], 0, [start, start], [None, None])
    for (w_fast, _), (w_plain, _) in zip(trained_fast, trained_plain, strict=True):
        moved = max(np.abs(w_plain[n] - start[n]).max() for n in start)
        assert moved > 1e-3  # the comparison below is about trained weights
        for name in start:
            assert w_fast[name].flags.c_contiguous  # weights leave in the usual layout
        # the same training up to float32 rounding (different orders of summation, amplified
        # a little by three momentum steps): far below what the steps moved the weights
        differ = max(np.abs(w_fast[n] - w_plain[n]).max() for n in start)
        assert differ < 0.01 * moved, (differ, moved)


def test_auto_keeps_group_normalised_models_and_the_vectorised_path_contiguous():
    # GroupNorm's CPU kernels are slower channels-last (the ConvNet's default "instance" norm)
    assert not _channels_last(_runtime("convnet", "auto").model)
    assert _channels_last(_runtime("convnet", "channels_last").model)  # asked for explicitly
    # torch.func's batched weights on the vectorised path keep the default layout
    vectorized = _runtime("convnet", "channels_last", vectorize="always", norm="none")
    assert vectorized.path == "vectorized" and not _channels_last(vectorized.model)


def test_the_server_trains_on_synthetic_sets_channels_last_under_auto(monkeypatch):
    import dataclasses

    from test_fedvck import FAST, _context, _rounds
    from test_fedvck import _runtime as fedvck_runtime

    import raysim.algorithms.condensed as condensed
    from raysim.algorithms.feddm import FedDM, FedDMParams

    layouts: list[bool] = []
    original = condensed.train_on_synthetic

    def recording(model, *args, **kwargs):
        layouts.append(_channels_last(model))
        return original(model, *args, **kwargs)

    monkeypatch.setattr(condensed, "train_on_synthetic", recording)
    runtime = fedvck_runtime()
    for setting in ("auto", "contiguous"):
        context = dataclasses.replace(_context(runtime), memory_format=setting)
        _rounds(FedDM(FedDMParams(**FAST, images_per_class=2), context), runtime, 1)
    assert layouts == [True, False]


def test_a_method_that_always_trains_per_client_takes_that_path_and_says_why():
    """A small MLP on CPU would take the vectorised path; a method declaring
    ``per_client_loop`` (SCAFFOLD, centralized) gets the per-client path with its own reason."""
    from raysim.algorithms.scaffold import Scaffold
    from raysim.training.vectorized import LOOP, VECTORIZED

    assert _runtime("mlp", "auto").path == VECTORIZED
    dataset = load_dataset(DatasetConfig(name="digits"))
    params = MODELS["mlp"].params()
    runtime = ClientRuntime(
        RunContext(1, dataset.info, params, TrainingConfig(local_steps=1, batch_size=8), 2, 2),
        ClientData(dataset.train_x, dataset.train_y, [np.arange(0, 40), np.arange(40, 80)],
                   get_weights(build_model(params, dataset.info))),
        torch.device("cpu"), per_client_loop=Scaffold.per_client_loop)
    assert (runtime.path, runtime.path_reason) == (LOOP, Scaffold.per_client_loop)
