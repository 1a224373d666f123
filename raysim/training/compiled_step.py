"""The vectorised path's step compiled with ``torch.compile`` (``engine.compile_step``).

One step of :func:`~raysim.training.vectorized.train_vectorized` is every client's gradient
and loss from one batched ``torch.func`` call, which eager PyTorch runs as dozens of small
kernels launched one by one from Python. Compiled, the step's elementwise work is fused into
a few kernels and, on a GPU (mode ``reduce-overhead``), the whole step is replayed as one CUDA
graph.

Shapes are static: each (clients, batch) shape a worker meets compiles once per process
(seconds on a CPU). A call's clients are padded to the next of a few counts
(:func:`padded_count`: 2, 3, 4, 6, 8, 12, ...; fewer than half more rows), so that client
sampling, which gives a worker another number of clients every round, compiles a handful of
shapes, not one per count; before the first round each worker compiles those its rounds are
likely to meet (:func:`likely_counts`, :func:`warm_shapes`), a rarer one compiles when met.
Every client is one row of the batched call and no row reads another, so a client's result
does not depend on how many clients share its call: the same bits with 1 worker or many, as on
the eager path (tested; one row alone compiles to other kernels than many, hence no count
below 2). The compiled arithmetic is fused differently from the eager one, so the two agree to
float32 rounding, not to the bit (tested within a stated tolerance): a run's numbers depend on
this setting.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from raysim.errors import ConfigError, field_error

StepFunction = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""(params, buffers, inputs, targets, anchor) -> ((clients, parameters) gradients, (clients,)
data losses)."""

SHAPE_LIMIT = 256
"""Compiled shapes per step function before raysim stops with an error. torch's own limit (8)
would fall back to the eager step without a word, and a fallback changes the numbers."""

_compiled: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, StepFunction]] = (
    weakref.WeakKeyDictionary())


def compiled_step(model: nn.Module, key: Hashable, build: Callable[[], StepFunction],
                  device: torch.device) -> StepFunction:
    """The compiled form of the step ``build`` makes for ``model`` (``key``: what else the
    step closes over, e.g. the loss and the proximal weight), compiled once per model and key
    and kept while the model lives."""
    steps = _compiled.setdefault(model, {})
    if key not in steps:
        steps[key] = _compile(build(), device)
    return steps[key]


def _compile(step: StepFunction, device: torch.device) -> StepFunction:
    import torch._dynamo
    import torch._inductor.config

    on_gpu = device.type == "cuda"
    # on CPUs one process compiles (the node's cores train); on a GPU node, whose CPUs idle
    # while the workers set up, up to 8 compile a step's Triton kernels side by side
    torch._inductor.config.compile_threads = min(8, os.cpu_count() or 1) if on_gpu else 1
    # for the process (raysim's steps are its only compiled code), not patched around each step
    torch._dynamo.config.recompile_limit = SHAPE_LIMIT
    torch._dynamo.config.accumulated_recompile_limit = SHAPE_LIMIT
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    compiled = torch.compile(step, fullgraph=True, dynamic=False,
                             mode="reduce-overhead" if on_gpu else None)

    def run(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if on_gpu:  # the graph's outputs of the previous step are read already
            torch.compiler.cudagraph_mark_step_begin()
        try:
            return compiled(*args)  # type: ignore[no-any-return]
        except torch._dynamo.exc.TorchDynamoException as error:
            raise compile_failure(error) from None

    return run


def compile_failure(error: Exception) -> ConfigError:
    """The paragraph for a step torch could not compile."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return field_error(
        "engine.compile_step", "always",
        f"torch.compile could not compile this run's training step ({reason}); compiling "
        "needs a working C++ compiler on CPUs and Triton on GPUs, and a model torch can trace "
        "whole", "Set `--set engine.compile_step=never` to train with the eager step (the "
        "default).")


def padded_count(count: int) -> int:
    """The rows a compiled call of ``count`` clients trains: the least of 2, 3, 4, 6, 8, 12,
    16, 24, ... (powers of two and one and a half times them) that holds them."""
    size = 2
    while True:
        for candidate in (size, size * 3 // 2):
            if candidate >= count:
                return candidate
        size *= 2


def likely_counts(held: int, num_clients: int, per_round: int, draws: int = 4096
                  ) -> list[int]:
    """Client counts, one for each padded size (:func:`padded_count`), that cover 99 % of the
    rounds of a worker holding ``held`` of ``num_clients`` clients when ``per_round`` are drawn
    uniformly (the 0.5 % to 99.5 % quantiles of the hypergeometric count, from ``draws``
    seeded draws); all of them when every client trains."""
    if per_round >= num_clients:
        return [held]
    counts = np.random.default_rng(0).hypergeometric(held, num_clients - held, per_round, draws)
    low, high = np.quantile(counts, [0.005, 0.995])
    chosen: dict[int, int] = {}
    for count in range(max(1, int(low)), int(high) + 1):
        chosen.setdefault(padded_count(count), count)
    return sorted(chosen.values())


def warm_shapes(plan: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One step of ``plan`` for each distinct batch width, in order of first use: training
    them once compiles every shape the plan's job meets."""
    widths: dict[int, np.ndarray] = {}
    for positions in plan:
        widths.setdefault(positions.shape[1], positions)
    return list(widths.values())
