"""A client's first SGD step written from its start straight into the client's own weights.

A client starts from weights it does not own: the round's broadcast (shared by every client of
the worker) or its kept model. The plain way copies the start into the resident model's vector,
then lets the optimizer update that vector in place: two passes over the weights, the first of
them a write of the whole model into memory the step then reads again. For SGD the first
step's result is ``start - lr * d`` (``d`` the gradient, plus ``weight_decay * start``; with
momentum, ``d`` is also the new momentum buffer), so the model can take its first gradient
reading the start itself (its parameters are views of the start's vector) and the step write
``start - lr * d`` into the model's own vector in one pass. On a 2-CPU machine a client
with a 1.08 M-parameter MLP and one step trains about 5 % faster in its worker (BENCHMARKS.md,
``experiments/benchmarks/speed_mechanisms.py``).

The arithmetic is torch's single-tensor SGD's (``grad.add(param, alpha=weight_decay)``, then
``param.add_(grad, alpha=-lr)``, here with ``out=``), so the weights and the momentum buffers
are the same bits as the plain way's (a test compares the two paths for every SGD setting).
Models with buffers (BatchNorm's running statistics change in the forward pass, which would
write into the start), other optimizers, a loaded optimizer state, small models (rebinding
costs more than copying), starts in another layout and models on a GPU take the plain way
(:func:`raysim.vectors.weights.saves_a_pass`).
"""

from __future__ import annotations

import torch
from torch import nn

from raysim.configuration.schema import OptimizerConfig
from raysim.vectors.weights import (
    FlatWeights,
    bind_vector,
    bound_vector,
    model_layout,
    parameter_views,
    saves_a_pass,
)


class FirstStepFromStart:
    """A model bound to read its start for the first step (see the module docstring).

    :meth:`bind` makes the model's parameters views of the start's vector; :meth:`step`
    replaces the optimizer's first ``step()``: it writes the stepped weights into the model's
    own vector and binds the model to it again; :meth:`finish` (always called, also when
    training stopped early or took no step) leaves the model bound to its own vector holding
    its current weights, so the start is never handed on or written."""

    def __init__(self, model: nn.Module, start: torch.Tensor, own: torch.Tensor,
                 config: OptimizerConfig):
        self.model, self.start, self.own, self.config = model, start, own, config
        self.stepped = False

    @classmethod
    def bind(cls, model: nn.Module, start: FlatWeights, config: OptimizerConfig,
             optimizer_state: object | None) -> FirstStepFromStart | None:
        """The model bound to read ``start`` when its first step can be written from it,
        else None (the model untouched: load the start into it the plain way)."""
        if config.name != "sgd" or optimizer_state is not None or start.extras \
                or not saves_a_pass(start.vector):
            return None
        views = parameter_views(model)
        own = bound_vector(model)
        vector = start.vector
        if views is None or own is None or not isinstance(vector, torch.Tensor) \
                or start.layout != model_layout(model) \
                or vector.device != own.device or vector.dtype != own.dtype \
                or vector.data_ptr() == own.data_ptr():
            return None
        bind_vector(model, vector)
        return cls(model, vector, own, config)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer's first step, from the start into the model's own vector."""
        lr, decay = self.config.lr, self.config.weight_decay
        momentum = self.config.momentum != 0
        views = parameter_views(self.model)
        assert views is not None
        with torch.no_grad():
            for parameter, (first, stop) in views:
                start = self.start[first:stop].view(parameter.shape)
                out = self.own[first:stop].view(parameter.shape)
                grad = parameter.grad
                if grad is None:  # not trained (frozen, or unused by the loss)
                    out.copy_(start)
                    continue
                if decay != 0:
                    grad = grad.add(start, alpha=decay)
                if momentum:  # the new buffer: a copy of the gradient (torch clones it; one
                    # with weight decay added is a new tensor already)
                    grad = grad.clone() if decay == 0 else grad
                    optimizer.state[parameter]["momentum_buffer"] = grad
                torch.add(start, grad, alpha=-lr, out=out)
        bind_vector(self.model, self.own)
        self.stepped = True

    def finish(self) -> None:
        """Leave the model on its own vector (a copy of the start when no step was taken)."""
        if not self.stepped:
            with torch.no_grad():
                self.own.copy_(self.start)
            bind_vector(self.model, self.own)
            self.stepped = True
