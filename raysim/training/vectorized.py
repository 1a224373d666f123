"""Many clients of one architecture trained together with ``torch.func``.

``functional_call`` + ``vmap`` over parameters stacked along a leading client axis, with
per-client SGD momentum buffers and per-client batch orders. Pays off for small models (MLPs,
linear models: about 25x a per-client loop on 2 CPUs) and on GPUs; on CPUs batched
convolutions are slower than a loop, so :func:`choose_path` keeps ConvNets on the loop there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from raysim.configuration.schema import OptimizerConfig
from raysim.training.compiled_step import StepFunction, compiled_step, padded_count
from raysim.training.losses import loss_function
from raysim.vectors.weights import (
    FlatWeights,
    Layout,
    Proximal,
    Weights,
    as_tensor,
    convert_once,
    flat_tensor,
)

VECTORIZED, LOOP = "vectorized", "loop"
CPU_VECTORIZE_MAX_PARAMETERS = 100_000
"""Above this many parameters a dense model trains faster per client on a CPU: the batched
call streams every client's copy of the weights through memory several times per step
(measured on 2 CPUs, 50 clients x 4 samples: vmap 0.1-0.26x the loop's time up to 34 k
parameters, 2.1-3.8x it from 280 k; ``experiments/benchmarks/speed.py``)."""


def choose_path(model: nn.Module, optimizer: OptimizerConfig, device: torch.device,
                setting: str) -> tuple[str, str]:
    """Pick the vectorised or the per-client path; returns (path, reason)."""
    if setting == "never":
        return LOOP, "engine.vectorize=never"
    if optimizer.name != "sgd":
        return LOOP, f"not vectorisable: optimizer {optimizer.name} (vectorised path implements SGD)"
    recurrent = any(isinstance(m, nn.RNNBase) for m in model.modules())
    if recurrent:
        return LOOP, ("recurrent layers (GRU/LSTM): the per-client loop, which runs the fused "
                      "RNN kernels (not batched over clients here)")
    dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
                  for m in model.modules())
    if dropout:
        return LOOP, ("dropout: the batched step draws no per-client random masks, so models "
                      "with dropout train per client")
    if setting == "always":
        return VECTORIZED, "engine.vectorize=always"
    batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    if device.type == "cuda":
        return VECTORIZED, ("GPU: batched kernels beat a per-client loop" + (
            " (BatchNorm clients batched with their own running statistics: 3.2x the loop "
            "on the FedDC paper slice, H200)" if batch_norm else ""))
    if batch_norm:
        return LOOP, ("BatchNorm on CPU: the per-client loop unless engine.vectorize=always "
                      "(batched convolutions are slower than a loop on CPUs)")
    has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    if has_conv:
        return LOOP, "convolutions on CPU: batched grouped convolutions are slower than a loop"
    parameters = sum(p.numel() for p in model.parameters())
    if parameters > CPU_VECTORIZE_MAX_PARAMETERS:
        return LOOP, (f"dense model of {parameters} parameters on CPU: above "
                      f"{CPU_VECTORIZE_MAX_PARAMETERS} a per-client loop moves less memory")
    return VECTORIZED, "small dense model on CPU: one batched call beats a per-client loop"


def train_vectorized(
    model: nn.Module,
    weights: Sequence[Weights],
    momentum: Sequence[torch.Tensor | np.ndarray | None],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    plan: Sequence[np.ndarray],
    optimizer: OptimizerConfig,
    prox: Proximal | None = None,
    loss: str = "cross_entropy",
    compile_step: bool = False,
) -> tuple[list[FlatWeights], list[torch.Tensor | None], np.ndarray]:
    """Run the SGD steps of ``plan`` for all clients at once.

    ``inputs``/``targets`` hold each client's local data stacked as (clients, samples, ...);
    ``plan[k]`` is the (clients, batch) array of positions of step k. Clients are rows of one
    (clients, parameters) matrix on the inputs' device; matches ``torch.optim.SGD`` (momentum,
    no dampening, weight decay) step for step. Clients that share one start (the broadcast)
    are expanded from it on the device. Returns the new weights (FlatWeights whose vectors are
    row views of the matrix, on the device), flat momentum buffers (device rows) and each
    client's sample-weighted mean training loss. ``compile_step``: each step's gradients
    come from the compiled step (:mod:`raysim.training.compiled_step`).
    """
    count = len(weights)
    if compile_step and padded_count(count) != count:
        # the last client's row repeated up to a compiled shape; the extra rows are dropped
        extra = padded_count(count) - count
        new_weights, new_momentum, losses = train_vectorized(
            model, [*weights, *[weights[-1]] * extra], [*momentum, *[momentum[-1]] * extra],
            torch.cat([inputs, inputs[-1:].expand(extra, *inputs.shape[1:])]),
            torch.cat([targets, targets[-1:].expand(extra, *targets.shape[1:])]),
            [np.concatenate([step, np.repeat(step[-1:], extra, axis=0)]) for step in plan],
            optimizer, prox, loss, compile_step)
        return new_weights[:count], new_momentum[:count], losses[:count]
    device = inputs.device
    param_names = [name for name, _ in model.named_parameters()]
    float_buffers = [(n, b) for n, b in model.named_buffers() if b.dtype == torch.float32]
    layout: Layout = tuple((name, tuple(t.shape)) for name, t in
                           [*model.named_parameters(), *float_buffers])
    sizes = [int(np.prod(shape, dtype=np.int64)) for _, shape in layout]
    num_params = sum(sizes[: len(param_names)])
    theta = _stack_rows(convert_once(weights, lambda w: flat_tensor(w, layout, device)))
    views = _row_views(theta, layout, sizes)
    params = {n: views[n] for n in param_names}
    # float buffers (BatchNorm's running statistics) are updated in place per client by the
    # batched forward: in contiguous copies (torch's batched batch norm does not write back
    # into the strided views of the matrix), copied into the clients' rows after the steps;
    # other buffers (BatchNorm's batch counter) are stacked per client beside it and come back
    # as each client's extras
    statistics = {n: views[n].clone() for n, _ in layout[len(param_names):]}
    counters = {n: torch.stack([as_tensor(w[n]).to(device) for w in weights])
                for n, b in model.named_buffers() if b.dtype != torch.float32}
    buffers = {**statistics, **counters}
    use_momentum = optimizer.momentum > 0
    velocity = None
    if use_momentum and all(m is not None for m in momentum):
        velocity = _stack_rows([as_tensor(m).to(device) for m in momentum if m is not None])
    anchor, anchor_dim = _anchor(prox, param_names, device)
    mu = prox[1] if prox is not None else 0.0

    def build() -> StepFunction:
        return batched_step(model, param_names, loss, mu, anchor_dim)

    step = compiled_step(model, (loss, mu, anchor is None), build, device) if compile_step \
        else build()
    loss_sum = torch.zeros(count, device=device)
    seen = 0
    model.train()
    for positions, (x, y) in zip(plan, step_rows(inputs, targets, plan), strict=True):
        gradients, data_loss = step(params, buffers, x, y, anchor)
        loss_sum += data_loss.detach() * positions.shape[1]
        seen += positions.shape[1]
        with torch.no_grad():
            update = gradients
            if optimizer.weight_decay:
                update = update + optimizer.weight_decay * theta[:, :num_params]
            if use_momentum:
                velocity = update.clone() if velocity is None else velocity.mul_(
                    optimizer.momentum).add_(update)
                update = velocity
            theta[:, :num_params].sub_(optimizer.lr * update)
    with torch.no_grad():
        for name, values in statistics.items():
            views[name].copy_(values)
    host_counters = {n: c.cpu().numpy() for n, c in counters.items()}
    new_weights = [FlatWeights(theta[i], layout, {n: c[i] for n, c in host_counters.items()})
                   for i in range(count)]
    new_momentum = [velocity[i] if velocity is not None else None for i in range(count)]
    return new_weights, new_momentum, (loss_sum / max(seen, 1)).cpu().numpy()


def batched_step(model: nn.Module, param_names: Sequence[str], loss: str, mu: float,
                 anchor_dim: int | None) -> StepFunction:
    """One SGD step's work for every client: ``(params, buffers, inputs, targets, anchor) ->
    (gradients as (clients, parameters) rows, each client's data loss)``, each client's loss
    its data loss plus ``mu / 2 ||p - anchor||^2`` when there is an anchor. BatchNorm's
    running statistics in ``buffers`` are updated in place."""
    loss_fn = loss_function(loss)

    def client_loss(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor,
                    a: dict[str, torch.Tensor] | None) -> tuple:
        data_loss = loss_fn(functional_call(model, (p, b), (x,)), y)
        total = data_loss
        if a is not None:
            total = total + 0.5 * mu * sum(((p[n] - a[n]) ** 2).sum() for n in param_names)
        return total, data_loss

    gradient_and_loss = vmap(grad_and_value(client_loss, has_aux=True),
                             in_dims=(0, 0, 0, 0, anchor_dim))

    def step(params: dict, buffers: dict, x: torch.Tensor, y: torch.Tensor,
             anchor: dict[str, torch.Tensor] | None) -> tuple[torch.Tensor, torch.Tensor]:
        grads, (_, data_loss) = gradient_and_loss(params, buffers, x, y, anchor)
        count = x.shape[0]
        return torch.cat([grads[n].reshape(count, -1) for n in param_names], dim=1), data_loss

    return step


def step_rows(inputs: torch.Tensor, targets: torch.Tensor, plan: Sequence[np.ndarray]
              ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's (clients, batch, ...) inputs and targets: client c's rows ``plan[k][c]`` of
    ``inputs[c]`` and ``targets[c]``. The clients' rows laid end to end are one client's rows
    to :func:`step_batches`, at positions computed on the host and sent in one transfer: the
    same rows as ``inputs[clients, positions]`` (a gather copies exactly), without advanced
    indexing's broadcast of two index tensors per step."""
    count, samples = inputs.shape[0], inputs.shape[1]
    offsets = np.arange(count, dtype=np.int64)[:, None] * samples
    flat_plan = [(np.asarray(positions, dtype=np.int64) + offsets).reshape(-1)
                 for positions in plan]
    index = plans_on_device([flat_plan], inputs.device)[0]
    batches = step_batches(inputs.reshape(count * samples, *inputs.shape[2:]),
                           targets.reshape(count * samples, *targets.shape[2:]), flat_plan, index)
    for positions, (x, y) in zip(plan, batches, strict=True):
        yield (x.view(count, positions.shape[1], *x.shape[1:]),
               y.view(count, positions.shape[1], *y.shape[1:]))


def _row_views(matrix: torch.Tensor, layout: Layout, sizes: list[int]
               ) -> dict[str, torch.Tensor]:
    """Each layout entry of every row of a (rows, n) matrix, as a (rows, *shape) view."""
    views, offset = {}, 0
    for (name, shape), size in zip(layout, sizes, strict=True):
        views[name] = matrix[:, offset:offset + size].view(len(matrix), *shape)
        offset += size
    return views


def _anchor(prox: Proximal | None, param_names: list[str], device: torch.device
            ) -> tuple[dict[str, torch.Tensor] | None, int | None]:
    """The proximal anchor's parameters on ``device``, shared by the clients (vmap dimension
    None)."""
    if prox is None or prox[1] <= 0:
        return None, None
    return {n: as_tensor(prox[0][n]).to(device) for n in param_names}, None


def plans_on_device(plans: Sequence[Sequence[np.ndarray]], device: torch.device
                    ) -> list[torch.Tensor]:
    """Several clients' batch positions on the device, each client's steps concatenated in
    order into one index (what :func:`step_batches` takes), copied in one transfer for all of
    them: on a GPU a copy from host memory waits for the kernels queued before it, so one per
    client would stop the host from queueing ahead."""
    arrays = [np.asarray(positions).reshape(-1) for plan in plans for positions in plan]
    flat = torch.from_numpy(np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64))
    flat = flat.to(device)
    sizes = [sum(int(np.asarray(positions).size) for positions in plan) for plan in plans]
    bounds = itertools.accumulate(sizes, initial=0)
    return [flat[first:stop] for first, stop in itertools.pairwise(bounds)]


GATHER_ONCE_BYTES = 64 * 2**20
"""Up to this many bytes of a round of batches (inputs: a client's, or on the vectorised path
all the call's clients'), :func:`step_batches` gathers the rows once for all the steps; above
it (large images, many epochs), one batch at a time, so the copy never holds more than a
batch."""


def step_batches(x: torch.Tensor, y: torch.Tensor, plan: Sequence[np.ndarray],
                 index: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's (inputs, targets) of ``plan``: rows of ``x`` and ``y`` at ``index`` (the
    steps' positions concatenated, on the data's device). Gathered with one ``index_select``
    of each for the whole round where the rows take at most :data:`GATHER_ONCE_BYTES`, the
    steps then slices of it: the same rows as one gather per step (a gather copies exactly),
    without two kernel launches per step, which a GPU's launch-bound loop pays for."""
    row_bytes = x[:1].numel() * x.element_size()
    once = index.numel() * row_bytes <= GATHER_ONCE_BYTES
    rows_x, rows_y = (x.index_select(0, index), y.index_select(0, index)) if once else (x, y)
    if once and len(plan) == 1:  # (one step, e.g. a client of 4 rows and batch 4: the gather is its batch)
        yield rows_x, rows_y
        return
    offset = 0
    for positions in plan:  # (narrow: a view, without Python's indexing parse)
        size = len(positions)
        if once:
            yield rows_x.narrow(0, offset, size), rows_y.narrow(0, offset, size)
        else:
            part = index.narrow(0, offset, size)
            yield x.index_select(0, part), y.index_select(0, part)
        offset += size


def _stack_rows(rows: list[torch.Tensor]) -> torch.Tensor:
    """Stack per-client vectors into a fresh (clients, n) float32 matrix on their device; rows
    that are one tensor (clients starting from the broadcast) are expanded from it there."""
    first = rows[0]
    if all(row is first for row in rows):
        return first.to(torch.float32).unsqueeze(0).repeat(len(rows), 1)
    return torch.stack(rows).to(torch.float32)
