"""The server's step as a layer (Reddi et al. 2021, "Adaptive Federated Optimization",
Algorithm 2): the wrapped algorithm produces the round's mean model (a plain weighted mean, a
private mean under DP, a buffered mean under FedBuff) and this layer moves the global model
along the pseudo-gradient D = mean - global by SGD with momentum (FedAvgM), Adagrad, Adam or
Yogi (:class:`~raysim.configuration.schema.ServerOptimizerConfig`).

The optimizer steps the model's trainable parameters; every other entry (BatchNorm's running
means and variances, its step counters) takes the round's mean, since an adaptive step moves an
entry by about lr whatever its scale and would drive a small running variance negative.
``convention`` chooses the equations: ``paper`` (Algorithm 2 as written) or ``flower`` (Flower's
FedAdagrad without momentum, FedAdam's bias-corrected rate, the second moment from 0).

SGD keeps its arithmetic in float32 as the model is stored (``g + lr x m``; at lr 1 without
momentum the mean itself, FedAvg's bits); the adaptive
optimizers keep their moments in float64. Their state is part of the server state, so a
checkpoint holds it and a resumed run continues it bit for bit.

Under ``privacy:`` the DP layer sits inside this one: the optimizer reads only the private
mean, so every value it produces is post-processing of the Gaussian mechanism and the
accountant's epsilon holds unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from raysim.configuration.schema import ServerOptimizerConfig, SystemConfig
from raysim.errors import ConfigError
from raysim.layers.feature import Feature, RunSettings, algorithms_with, section_of
from raysim.layers.wrapped import Wrapped
from raysim.state_codec import persistable
from raysim.vectors.weights import (
    FlatWeights,
    Layout,
    Weights,
    flat_tensor,
    layout_of,
    to_host,
)

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.training.context import RunContext


@persistable
@dataclass
class ServerMoments:
    """The optimizer's state: the first moment (SGD's momentum buffer, float32; the adaptive
    optimizers' m, float64), the second moment v (float64) and how many steps were taken."""

    first: np.ndarray | None = None
    second: np.ndarray | None = None
    steps: int = 0


@persistable
@dataclass
class OptimizedState:
    """The wrapped algorithm's server state and the optimizer's moments."""

    model: Any
    moments: ServerMoments


def flat_vector(weights: Weights, layout: Any) -> np.ndarray:
    """The float32 entries of ``weights`` in ``layout`` order as one host vector."""
    return to_host(flat_tensor(weights, layout, torch.device("cpu")))


def stepped_mask(layout: Layout, stepped: Collection[str] | None) -> np.ndarray | None:
    """Which entries of a flat vector in ``layout`` the optimizer steps: those of the entries
    named in ``stepped`` (the model's trainable parameters); None when it steps them all."""
    names = {name for name, _ in layout}
    if stepped is None or names <= set(stepped):
        return None
    return np.concatenate([np.full(math.prod(shape), name in stepped) for name, shape in layout])


def server_step(settings: ServerOptimizerConfig, current: Weights, mean: Weights,
                moments: ServerMoments, stepped: Collection[str] | None = None
                ) -> tuple[Weights, ServerMoments]:
    """The next global model from the current one and the round's mean, and the optimizer's
    next state (see the module docstring). The optimizer steps the float32 entries named in
    ``stepped`` (the model's trainable parameters; None: every float32 entry); the others,
    such as BatchNorm's running statistics, take the mean's values, as ``num_batches_tracked``
    does: an adaptive step moves an entry by about lr whatever its scale, which would drive a
    small running variance negative."""
    lr = settings.step_size
    if settings.name == "sgd" and settings.momentum == 0 and lr == 1.0:
        return mean, moments  # plain averaging: the mean itself
    layout = layout_of(mean)
    extras = mean.extras if isinstance(mean, FlatWeights) else {
        name: np.asarray(value) for name, value in mean.items()
        if name not in dict(layout)}
    now, target = flat_vector(current, layout), flat_vector(mean, layout)
    mask = stepped_mask(layout, stepped)
    if mask is None:
        moved, moments = optimizer_step(settings, now, target, moments)
    else:
        new_part, moments = optimizer_step(settings, now[mask], target[mask], moments)
        moved = target.copy()  # running statistics: the mean
        moved[mask] = new_part
    return FlatWeights(moved, layout, extras), moments


def optimizer_step(settings: ServerOptimizerConfig, now: np.ndarray, target: np.ndarray,
                   moments: ServerMoments) -> tuple[np.ndarray, ServerMoments]:
    """One step of the optimizer on float32 vectors: the model ``now`` moved along the
    pseudo-gradient ``target - now``, in the equations of ``settings.convention`` (the
    paper's Algorithm 2, or Flower's strategies)."""
    lr = settings.step_size
    delta = target - now  # the pseudo-gradient, float32
    if settings.name == "sgd":  # FedAvgM: m = momentum m + D; g + lr m, in float32
        first = delta if settings.momentum == 0 or moments.first is None else \
            np.float32(settings.momentum) * moments.first + delta
        return now + lr * first, ServerMoments(
            None if settings.momentum == 0 else first, None, moments.steps + 1)
    flower = settings.convention == "flower"
    wide = delta.astype(np.float64)
    square = wide * wide
    first64 = np.zeros_like(wide) if moments.first is None else moments.first
    second = (np.zeros_like(wide) if flower else np.full_like(wide, settings.tau ** 2)) \
        if moments.second is None else moments.second
    beta1 = 0.0 if flower and settings.name == "adagrad" else settings.beta1
    first64 = beta1 * first64 + (1.0 - beta1) * wide
    if settings.name == "adagrad":
        second = second + square
    elif settings.name == "adam":
        second = settings.beta2 * second + (1.0 - settings.beta2) * square
    else:  # yogi
        second = second - (1.0 - settings.beta2) * square * np.sign(second - square)
    if flower and settings.name == "adam":  # Flower's bias-corrected rate at its round + 1
        power = moments.steps + 2.0
        lr = lr * math.sqrt(1.0 - settings.beta2 ** power) / (1.0 - settings.beta1 ** power)
    step = lr * first64 / (np.sqrt(second) + settings.tau)
    new = (now.astype(np.float64) + step).astype(np.float32)
    return new, ServerMoments(first64, second, moments.steps + 1)


def with_model(state: Any, weights: Weights) -> Any:
    """``state`` (an algorithm's or a layer's server state) with its global model replaced:
    the state itself when it is the model, else its ``model`` field, recursively."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type) and any(
            f.name == "model" for f in dataclasses.fields(state)):
        held: Any = state
        return dataclasses.replace(state, model=with_model(held.model, weights))
    return weights


class ServerOptimizer(Wrapped):
    """The wrapped algorithm's round mean, taken as a pseudo-gradient step by
    ``settings``, stepping the entries named in ``stepped`` (the model's trainable parameters;
    None: every float32 entry)."""

    def __init__(self, inner: Any, settings: ServerOptimizerConfig,
                 stepped: Collection[str] | None = None):
        super().__init__(inner)
        self.settings = settings
        self.stepped = None if stepped is None else frozenset(stepped)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> OptimizedState:
        return OptimizedState(self.inner.init_server_state(initial_weights), ServerMoments())

    def inner_state(self, state: OptimizedState) -> Any:
        return state.model

    def broadcast(self, state: OptimizedState, round_: int) -> dict[str, Any]:
        return self.inner.broadcast(state.model, round_)

    def aggregate(self, state: OptimizedState, partials: Sequence[Any],
                  round_: int) -> OptimizedState:
        averaged = self.inner.aggregate(state.model, partials, round_)
        if averaged is state.model:  # no client this round: nothing to step on
            return state
        mean = self.inner.global_weights(averaged)
        assert mean is not None, "a server optimizer wraps algorithms with a global model"
        return self.server_step(state, mean, averaged)

    def server_step(self, state: OptimizedState, mean: Weights,
                    averaged: Any | None = None) -> OptimizedState:
        """The state after the optimizer's step from the round's ``mean`` (``averaged``: the
        wrapped algorithm's next state holding it, e.g. with adaptive clipping's next clip;
        default: ``mean`` is that state)."""
        current = self.inner.global_weights(state.model)
        assert current is not None, "a server optimizer wraps algorithms with a global model"
        model, moments = server_step(self.settings, current, mean, state.moments, self.stepped)
        return OptimizedState(with_model(averaged if averaged is not None else mean, model),
                              moments)


SECTION = "server_optimizer"


def section(config: RunSettings) -> ServerOptimizerConfig | None:
    """The config's ``server_optimizer:`` section (None: the mean is the next model)."""
    return section_of(config, SECTION, ServerOptimizerConfig)


def buffered_server_lr(config: RunSettings) -> float | None:
    """FedBuff's ``system.server_lr`` under ``system.policy: fedbuff`` (None: synchronous
    rounds): the SGD step of the buffered update when no optimizer is configured."""
    system = section_of(config, "system", SystemConfig)
    return system.server_lr if system is not None and system.policy == "fedbuff" else None


def check(config: RunSettings) -> None:
    """``server_optimizer:`` needs a method whose next global model is the mean of its
    clients' models (one paragraph naming why otherwise)."""
    from raysim.algorithms import ALGORITHMS

    if section(config) is None:
        return
    name = getattr(config.algorithm, "name", "")
    if not ALGORITHMS[name].supports.server_optimizers:
        raise ConfigError(
            f"Invalid config section `server_optimizer`: algorithm `{name}` "
            "does not produce one mean model per round for a server optimizer to step on. "
            f"Remove `server_optimizer`, or use {algorithms_with('server_optimizers')}.")
    if len(ALGORITHMS[name].mean_uploads) > 1:
        raise ConfigError(
            f"Invalid config section `server_optimizer`: algorithm `{name}` uploads "
            f"{len(ALGORITHMS[name].mean_uploads)} means, and a server optimizer steps one "
            "model along its pseudo-gradient. Remove `server_optimizer`.")
    buffered = buffered_server_lr(config)
    if buffered is not None and buffered != 1.0:
        raise ConfigError(
            "Invalid combination: `system.server_lr` and `server_optimizer` both set the "
            "server's step on FedBuff's buffered update. Keep one: server_optimizer (with "
            "its lr), or system.server_lr alone (an SGD step).")


class ServerOptimization(Feature):
    """The server optimizer's part in a run: its layer (its state is the server state's),
    stepping the trainable parameters named in ``stepped``."""

    def __init__(self, settings: ServerOptimizerConfig, stepped: Collection[str] | None = None):
        self.settings = settings
        self.stepped = stepped

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        return ServerOptimizer(algorithm, self.settings, self.stepped)


def settings(config: RunSettings, num_clients: int, per_round: int
             ) -> ServerOptimizerConfig | None:
    """The server's step: ``server_optimizer:``, else FedBuff's ``system.server_lr`` as an
    SGD step when it is not 1, else None (the mean is the model)."""
    buffered_lr = buffered_server_lr(config)
    optimizer = section(config)
    if optimizer is None and buffered_lr is not None and buffered_lr != 1.0:
        return ServerOptimizerConfig(name="sgd", lr=buffered_lr)
    return optimizer


def feature(context: RunContext) -> ServerOptimization | None:
    """The optimizer's part of the run (``server_optimizer:``, or FedBuff's
    ``system.server_lr`` as an SGD step), or None without one."""
    settings = context.features.get(SECTION)
    return None if settings is None else ServerOptimization(settings, trainable_names(context))


def trainable_names(context: RunContext) -> frozenset[str]:
    """The names of the run's model's trainable parameters (what the optimizer steps; its
    buffers, such as BatchNorm's running statistics, are not parameters)."""
    from raysim.models import build_model

    model = build_model(context.model, context.info)
    return frozenset(name for name, p in model.named_parameters(remove_duplicate=False)
                     if p.requires_grad)


__all__ = ["SECTION", "OptimizedState", "ServerMoments", "ServerOptimization",
           "ServerOptimizer", "buffered_server_lr", "check", "feature", "flat_vector",
           "server_step", "settings", "with_model"]
