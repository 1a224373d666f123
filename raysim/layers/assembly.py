"""A run put together from its features: the registered algorithm wrapped in each feature's
layer, innermost first, and the samplers, callbacks, round caps and manifest entries the
features add to its rounds.

The order: client-level DP (:mod:`.client_dp`) around the algorithm, so that everything
outside sees only the private mean; the server optimizer (:mod:`.server_optimizer`), which
steps on that mean; the simulated clock (:mod:`.clock`), whose FedBuff layer buffers the
clients' updates and calls the optimizer's step on the buffered mean. A new feature is a
module with ``check(config)`` and ``feature(context, ...)`` and one line in each of
:data:`CHECKS` and :func:`features`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raysim.layers import client_dp, clock, server_optimizer
from raysim.layers.feature import Feature, RunSettings

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.data.partition import Partition
    from raysim.rounds.round_loop import RoundCallback, Sampler
    from raysim.schema import StrictModel
    from raysim.system.plan import ArchitectureKey, SystemPlan
    from raysim.system.planning import ClockSettings
    from raysim.training.context import RunContext

CHECKS: tuple[Callable[[RunSettings], None], ...] = (
    client_dp.check, server_optimizer.check, clock.check)
"""Each feature's config check (one paragraph, exit 2, for a setting it cannot honour)."""


def check_features(config: RunSettings) -> None:
    """Refuse a config whose features cannot run with its method (before any data is read)."""
    for check in CHECKS:
        check(config)


@dataclass(frozen=True)
class Ahead:
    """What a run's features need made before its first round, on the driver while the
    workers configure: the simulated clock's plan of every round (``system:``)."""

    clock: ClockSettings | None = None

    @property
    def needed(self) -> bool:
        return self.clock is not None

    def start(self, context: RunContext, partition: Partition, initial_weights: Any,
              flops: Callable[[], Mapping[ArchitectureKey, float]]
              ) -> Callable[[], SystemPlan] | None:
        """Start the work in a thread; returns the wait for its result (None: none needed).
        ``flops``: the forward FLOPs of the clients' architectures (a worker counts them)."""
        if self.clock is None:
            return None
        return clock.start_plan(self.clock, context, partition, initial_weights, flops)


def ahead_of_rounds(config: RunSettings) -> Ahead:
    """What the features of ``config`` need made before the first round."""
    return Ahead(clock.settings(config))


def context_settings(config: RunSettings, num_clients: int, per_round: int
                     ) -> dict[str, Any]:
    """The features' settings in a run's context (:class:`~raysim.training.context.
    RunContext`): DP's resolved settings, FedBuff's server rate and the server optimizer, for
    ``num_clients`` clients of which ``per_round`` are expected each round."""
    buffered = clock.buffered_server_lr(config)
    return {"privacy": client_dp.settings(config, num_clients, per_round),
            "fedbuff_server_lr": buffered,
            "server_optimizer": server_optimizer.settings(config, buffered)}


def features(context: RunContext, plan: Callable[[], SystemPlan] | None = None
             ) -> list[Feature]:
    """The features of a run, innermost layer first (``plan``: the simulated clock's plan,
    on the driver of a run with ``system:``)."""
    found = (client_dp.feature(context), server_optimizer.feature(context),
             clock.feature(context, plan))
    return [feature for feature in found if feature is not None]


@dataclass
class RunParts:
    """A run as its features make it: the wrapped algorithm, and what they add to its rounds."""

    algorithm: RunAlgorithm
    features: list[Feature]

    def sampler(self) -> Sampler | None:
        """Who takes part in each round, if a feature decides it (None: a uniform draw)."""
        chosen = [s for s in (f.sampler() for f in self.features) if s is not None]
        assert len(chosen) <= 1, "the config checks let at most one feature choose clients"
        return chosen[0] if chosen else None

    def callbacks(self, rounds: int) -> list[RoundCallback]:
        """The features' round-loop callbacks (``rounds``: the configured rounds)."""
        return [callback for f in self.features for callback in f.callbacks(rounds)]

    def rounds(self, configured: int) -> int:
        """The rounds the run takes: the configured ones, or fewer where a feature caps them
        (DP's budget)."""
        caps = [cap for cap in (f.round_cap() for f in self.features) if cap is not None]
        return min([configured, *caps])

    def manifest(self) -> dict[str, Any]:
        """The features' entries for the run's manifest."""
        return {key: value for f in self.features for key, value in f.manifest().items()}


def assemble(algorithm_class: type[Algorithm[Any, Any]], params: StrictModel,
             context: RunContext, plan: Callable[[], SystemPlan] | None = None) -> RunParts:
    """``algorithm_class(params, context)`` wrapped in its run's features, with their parts."""
    parts = features(context, plan)
    algorithm: RunAlgorithm = algorithm_class(params, context)
    for feature in parts:
        algorithm = feature.wrap(algorithm)
    return RunParts(algorithm, parts)


def compose(algorithm_class: type[Algorithm[Any, Any]], params: StrictModel,
            context: RunContext, plan: Callable[[], SystemPlan] | None = None
            ) -> RunAlgorithm:
    """The run's algorithm object: ``algorithm_class(params, context)`` wrapped in its
    features' layers (:func:`assemble`); the same on the driver and on every worker."""
    return assemble(algorithm_class, params, context, plan).algorithm
