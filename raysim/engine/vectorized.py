"""Many clients of one architecture trained together with ``torch.func``.

``functional_call`` + ``vmap`` over parameters stacked along a leading client axis, with
per-client SGD momentum buffers and per-client batch orders. Pays off for small models (MLPs,
linear models: about 25x a per-client loop on 2 CPUs) and on GPUs; on CPUs batched
convolutions are slower than a loop, so :func:`choose_path` keeps ConvNets on the loop there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from raysim.engine.weights import Weights, as_tensor
from raysim.schema import OptimizerConfig

VECTORIZED, LOOP = "vectorized", "loop"


def choose_path(model: nn.Module, optimizer: OptimizerConfig, device: torch.device,
                setting: str) -> tuple[str, str]:
    """Pick the vectorised or the per-client path; returns (path, reason)."""
    if setting == "never":
        return LOOP, "engine.vectorize=never"
    blockers = []
    if optimizer.name != "sgd":
        blockers.append(f"optimizer {optimizer.name} (vectorised path implements SGD)")
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        blockers.append("BatchNorm running statistics")
    if blockers:
        return LOOP, "not vectorisable: " + ", ".join(blockers)
    if setting == "always":
        return VECTORIZED, "engine.vectorize=always"
    has_conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    if device.type == "cuda":
        return VECTORIZED, "GPU: batched kernels beat a per-client loop"
    if has_conv:
        return LOOP, "convolutions on CPU: batched grouped convolutions are slower than a loop"
    return VECTORIZED, "small dense model on CPU: one batched call beats a per-client loop"


def train_vectorized(
    model: nn.Module,
    weights: Sequence[Weights],
    momentum: Sequence[Weights | None],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    plan: Sequence[np.ndarray],
    optimizer: OptimizerConfig,
    prox: tuple[Weights, float] | None = None,
) -> tuple[list[Weights], list[Weights | None], np.ndarray]:
    """Run the SGD steps of ``plan`` for all clients at once.

    ``inputs``/``targets`` hold each client's local data stacked as (clients, samples, ...);
    ``plan[k]`` is the (clients, batch) array of positions of step k. Matches
    ``torch.optim.SGD`` (momentum, no dampening, weight decay) step for step. Returns the new
    weights, momentum buffers and each client's sample-weighted mean training loss.
    """
    device = inputs.device
    param_names = [name for name, _ in model.named_parameters()]
    buffer_names = [name for name, _ in model.named_buffers()]
    params = {n: torch.stack([as_tensor(w[n]) for w in weights]).to(device)
              for n in param_names}
    buffers = {n: torch.stack([as_tensor(w[n]) for w in weights]).to(device)
               for n in buffer_names}
    use_momentum = optimizer.momentum > 0
    buffers_m: dict[str, torch.Tensor] | None = None
    if use_momentum and all(m is not None for m in momentum):
        buffers_m = {n: torch.stack([as_tensor(m[n]) for m in momentum])
                     .to(device) for n in param_names}
    anchor = None
    if prox is not None and prox[1] > 0:
        anchor = {n: as_tensor(prox[0][n]).to(device) for n in param_names}
    mu = prox[1] if prox is not None else 0.0
    loss_fn = nn.CrossEntropyLoss()

    def client_loss(p: dict, b: dict, x: torch.Tensor, y: torch.Tensor) -> tuple:
        data_loss = loss_fn(functional_call(model, (p, b), (x,)), y)
        total = data_loss
        if anchor is not None:
            total = total + 0.5 * mu * sum(((p[n] - anchor[n]) ** 2).sum() for n in param_names)
        return total, data_loss

    step_fn = vmap(grad_and_value(client_loss, has_aux=True), in_dims=(0, 0, 0, 0))
    clients = torch.arange(inputs.shape[0], device=device)[:, None]
    loss_sum = torch.zeros(inputs.shape[0], device=device)
    seen = 0
    model.train()
    for positions in plan:
        index = torch.from_numpy(positions).to(device)
        grads, (_, data_loss) = step_fn(params, buffers, inputs[clients, index],
                                        targets[clients, index])
        loss_sum += data_loss.detach() * positions.shape[1]
        seen += positions.shape[1]
        with torch.no_grad():
            for name in param_names:
                update = grads[name]
                if optimizer.weight_decay:
                    update = update + optimizer.weight_decay * params[name]
                if use_momentum:
                    if buffers_m is None:
                        buffers_m = {}
                    if name not in buffers_m:
                        buffers_m[name] = update.clone()
                    else:
                        buffers_m[name] = buffers_m[name] * optimizer.momentum + update
                    update = buffers_m[name]
                params[name] = params[name] - optimizer.lr * update
    new_weights = []
    for i in range(inputs.shape[0]):
        entry = {n: params[n][i].cpu().numpy() for n in param_names}
        entry.update({n: buffers[n][i].cpu().numpy() for n in buffer_names})
        new_weights.append({n: entry[n] for n in weights[0]})
    new_momentum: list[Weights | None] = [
        {n: buffers_m[n][i].cpu().numpy() for n in param_names} if buffers_m else None
        for i in range(inputs.shape[0])
    ]
    return new_weights, new_momentum, (loss_sum / max(seen, 1)).cpu().numpy()
