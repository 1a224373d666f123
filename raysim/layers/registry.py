"""Every feature of a run's settings, one line each: its config section, the section's schema
and its module (:class:`~raysim.layers.feature.FeatureModule`), innermost layer first.

Light on purpose: the experiment config takes its feature sections from here
(:mod:`raysim.configuration.experiment`) without importing torch; :mod:`raysim.layers.assembly` imports the
modules when a run is put together."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from raysim.configuration.schema import (
    CompressionConfig,
    PrivacyConfig,
    ServerOptimizerConfig,
    StrictModel,
    SystemConfig,
)

if TYPE_CHECKING:
    from raysim.layers.feature import FeatureModule


@dataclass(frozen=True)
class FeatureEntry:
    """One feature: the top-level config key that switches it on, that section's schema, and
    the module holding its check, settings and parts."""

    section: str
    schema: type[StrictModel]
    module: str

    def load(self) -> FeatureModule:
        """The feature's module."""
        return cast("FeatureModule", importlib.import_module(self.module))


FEATURES: tuple[FeatureEntry, ...] = (
    FeatureEntry("privacy", PrivacyConfig, "raysim.layers.client_dp"),
    FeatureEntry("server_optimizer", ServerOptimizerConfig, "raysim.layers.server_optimizer"),
    FeatureEntry("system", SystemConfig, "raysim.layers.simulated_clock"),
    FeatureEntry("compression", CompressionConfig, "raysim.layers.compression"),
)
"""The features, innermost layer first: DP around the algorithm, so that everything outside
sees only the private mean; the server optimizer, which steps on that mean; the simulated
clock, whose FedBuff layer buffers the updates and calls the optimizer's step on the buffered
mean; compression outermost, so that what leaves a client is what it counts."""
