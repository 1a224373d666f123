"""The vectorised step compiled (``engine.compile_step: always``): it is compiled, agrees with
the eager step to float32 rounding, and gives each client the same bits whichever clients
share its call (so results do not depend on the number of workers)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from raysim.configuration.schema import OptimizerConfig
from raysim.training.compiled_step import likely_counts, padded_count, warm_shapes
from raysim.training.vectorized import train_vectorized
from raysim.vectors.weights import get_weights

TOLERANCE = 1e-5
"""Largest weight difference allowed between the compiled and the eager step after a few
steps of a small model: float32 rounding of differently fused arithmetic (measured: about
1e-7 per step on the parameters)."""
RELATIVE_TOLERANCE = 1e-4
"""BatchNorm's running variance of two or three samples differs more (measured: 2e-5 of
its value): the compiled kernel computes the batch variance in another order."""

NEEDS_COMPILER = pytest.mark.skipif(
    shutil.which("g++") is None, reason="torch.compile on CPUs needs a C++ compiler (g++)")
DEVICES = [pytest.param("cpu", marks=NEEDS_COMPILER), pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU twin runs everywhere)"))]
"""On a GPU the compiled step is a CUDA graph (mode reduce-overhead); on CPUs, its twin."""
CLIENTS, SAMPLES, FEATURES = 6, 5, 12
OPTIMIZER = OptimizerConfig(name="sgd", lr=0.1, momentum=0.5, weight_decay=1e-3)


@pytest.fixture(autouse=True)
def _inductor_cache_in_tmp(tmp_path, monkeypatch):
    """Compiled kernels are cached under the test's temporary directory."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))


def _model(device: str, batch_norm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 8), *([nn.BatchNorm1d(8)] if batch_norm else []),
                         nn.ReLU(), nn.Linear(8, 3)).to(device)


def _data(device: str) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(CLIENTS, SAMPLES, FEATURES, generator=generator).to(device)
    targets = torch.randint(0, 3, (CLIENTS, SAMPLES), generator=generator).to(device)
    rng = np.random.default_rng(2)
    plan = [np.stack([rng.permutation(SAMPLES)[:width] for _ in range(CLIENTS)])
            for width in (3, 3, 3)]  # one width: one compiled shape per client count
    return inputs, targets, plan


def _train(model: nn.Module, rows: slice, compile_step: bool,
           prox: bool = False) -> tuple[torch.Tensor, np.ndarray]:
    inputs, targets, plan = _data(str(next(model.parameters()).device.type))
    start = get_weights(model)
    count = len(range(CLIENTS)[rows])
    weights, _, losses = train_vectorized(
        model, [start] * count, [None] * count, inputs[rows], targets[rows],
        [positions[rows] for positions in plan], OPTIMIZER,
        prox=(start, 0.5) if prox else None, compile_step=compile_step)
    return torch.stack([torch.as_tensor(w.vector) for w in weights]), losses


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("batch_norm", "prox"), [(False, True), (True, False)])
def test_the_compiled_step_is_compiled_and_agrees_with_the_eager_step(batch_norm, prox, device):
    model = _model(device, batch_norm)
    graphs = counters["stats"]["unique_graphs"]
    compiled, compiled_losses = _train(model, slice(None), True, prox)
    assert counters["stats"]["unique_graphs"] > graphs  # torch.compile traced the step
    eager, eager_losses = _train(model, slice(None), False, prox)
    assert torch.allclose(compiled, eager, rtol=RELATIVE_TOLERANCE, atol=TOLERANCE)
    assert np.abs(compiled_losses - eager_losses).max() <= TOLERANCE
    first_layer = model[0].weight.detach().reshape(-1).to(compiled.device)
    moved = compiled[0, :len(first_layer)] - first_layer
    assert moved.abs().max().item() > 100 * TOLERANCE  # the clients trained


@pytest.mark.parametrize("device", DEVICES)
def test_a_client_gets_the_same_compiled_bits_whichever_clients_share_its_call(device):
    model = _model(device)
    together, together_losses = _train(model, slice(None), True, prox=True)
    for rows in (slice(0, 1), slice(1, 3), slice(3, 5), slice(5, 6)):  # (one compiled shape)
        apart, apart_losses = _train(model, rows, True, prox=True)
        assert torch.equal(apart, together[rows])
        assert np.array_equal(apart_losses, together_losses[rows])


def test_warm_shapes_holds_one_step_of_each_batch_width_in_order():
    plan = [np.zeros((2, width), dtype=np.int64) for width in (4, 4, 3, 4, 1)]
    assert [step.shape[1] for step in warm_shapes(plan)] == [4, 3, 1]


def test_a_call_is_padded_to_a_few_client_counts_of_less_than_half_more_rows():
    counts = [padded_count(count) for count in range(1, 1001)]
    assert sorted(set(counts)) == [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256,
                                   384, 512, 768, 1024]
    assert all(count <= padded < max(3, 1.5 * count)
               for count, padded in enumerate(counts, start=1))


def test_a_worker_compiles_the_padded_sizes_of_99_percent_of_its_sampled_rounds():
    assert likely_counts(8, 8, 8) == [8]  # every client trains: one count
    assert likely_counts(1000, 1000, 50) == [50]  # a worker holding every client
    counts = likely_counts(250, 1000, 50)  # one of four workers, 50 of 1,000 per round
    sizes = [padded_count(count) for count in counts]
    assert len(set(sizes)) == len(sizes) > 1
    draws = np.random.default_rng(7).hypergeometric(250, 750, 50, 20_000)
    assert np.mean([padded_count(int(d)) in sizes for d in draws]) >= 0.99


def test_a_step_torch_cannot_compile_is_one_paragraph_naming_the_setting(monkeypatch):
    from raysim.errors import ConfigError
    from raysim.training import compiled_step as module

    def failing(step, **options):
        def run(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler found\ndetails")
        return run

    monkeypatch.setattr(torch, "compile", failing)
    step = module.compiled_step(_model("cpu"), "failing", lambda: lambda *a: None,
                                torch.device("cpu"))
    with pytest.raises(ConfigError) as caught:
        step()
    message = str(caught.value)
    assert "engine.compile_step" in message and "no C++ compiler found" in message
    assert "compile_step=never" in message and "\n" not in message
