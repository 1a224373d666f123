"""A run put together from its features: the registered algorithm wrapped in each feature's
layer, innermost first, and the samplers, callbacks, round caps and manifest entries the
features add to its rounds; and the round loop built from them (:func:`build_loop`), the one
the engine's driver runs and the tests' in-process runner too.

The features and their order are :data:`raysim.layers.registry.FEATURES`: client-level DP
(:mod:`.client_dp`), the server optimizer (:mod:`.server_optimizer`), the simulated clock
(:mod:`.simulated_clock`) and update compression (:mod:`.compression`). A new feature is a
module (:class:`~raysim.layers.feature.FeatureModule`: its check, settings and parts), its
section in :mod:`raysim.configuration.schema` and one line in that registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.layers.feature import Feature, FeatureModule, RunSettings, RunStart
from raysim.layers.registry import FEATURES
from raysim.rounds.client_sampling import UniformSampler
from raysim.rounds.round_loop import LoopProgress, RoundLoop

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.configuration.schema import StrictModel
    from raysim.rounds.round_loop import RoundCallback, Sampler, Sink, Workers
    from raysim.training.context import RunContext



def feature_modules() -> list[FeatureModule]:
    """Every feature's module, innermost layer first."""
    return [entry.load() for entry in FEATURES]


def check_features(config: RunSettings) -> None:
    """Refuse a config whose features cannot run with its method (before any data is read)."""
    for module in feature_modules():
        module.check(config)


def feature_settings(config: RunSettings, num_clients: int, per_round: int
                     ) -> dict[str, Any]:
    """Every feature's resolved settings by config section, for a run's context (its
    ``features``), for ``num_clients`` clients of which ``per_round`` are expected each round;
    a feature that is off is absent."""
    resolved = {module.SECTION: module.settings(config, num_clients, per_round)
                for module in feature_modules()}
    return {section: value for section, value in resolved.items() if value is not None}


def features(context: RunContext) -> list[Feature]:
    """The features of a run, innermost layer first."""
    found = [module.feature(context) for module in feature_modules()]
    return [feature for feature in found if feature is not None]


@dataclass
class RunParts:
    """A run as its features make it: the wrapped algorithm, and what they add to its rounds."""

    algorithm: RunAlgorithm
    features: list[Feature]

    def before_rounds(self, start: RunStart) -> None:
        """Start what the features need made before the first round (on the driver)."""
        for feature in self.features:
            feature.before_rounds(start)

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
             context: RunContext) -> RunParts:
    """``algorithm_class(params, context)`` wrapped in its run's features, with their parts."""
    parts = features(context)
    algorithm: RunAlgorithm = algorithm_class(params, context)
    for feature in parts:
        algorithm = feature.wrap(algorithm)
    return RunParts(algorithm, parts)


def compose(algorithm_class: type[Algorithm[Any, Any]], params: StrictModel,
            context: RunContext) -> RunAlgorithm:
    """The run's algorithm object: ``algorithm_class(params, context)`` wrapped in its
    features' layers (:func:`assemble`); the same on the driver and on every worker."""
    return assemble(algorithm_class, params, context).algorithm


def build_loop(parts: RunParts, context: RunContext, configured_rounds: int, *,
               worker_of_client: np.ndarray, workers: Workers, sink: Sink,
               progress: LoopProgress, callbacks: list[RoundCallback],
               manifest: Callable[[Mapping[str, Any]], None],
               report: Callable[..., None] | None = None) -> RoundLoop:
    """The run's round loop from its parts: the rounds the features allow (DP's budget may
    cap ``configured_rounds``), their sampler (else a uniform draw of the configured number),
    the caller's ``callbacks`` then the features', and the features' manifest entries handed
    to ``manifest`` (the driver's run manifest, the tests' in-memory one)."""
    if entries := parts.manifest():
        manifest(entries)
    sampler = parts.sampler() or UniformSampler(context.seed, context.num_clients,
                                                context.clients_per_round)
    return RoundLoop(parts.algorithm, sampler=sampler, rounds=parts.rounds(configured_rounds),
                     worker_of_client=worker_of_client, workers=workers, sink=sink,
                     progress=progress,
                     callbacks=[*callbacks, *parts.callbacks(configured_rounds)],
                     **({} if report is None else {"report": report}))
