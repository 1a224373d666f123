"""What a feature of a run's settings (client-level DP, a server optimizer, the simulated
clock, update compression) adds to it, in one module per feature.

A feature module (:class:`FeatureModule`) names its config section (``SECTION``; the
section's schema is in :mod:`raysim.configuration.schema`), checks a config against its method
(``check``), resolves its settings once before the run (``settings``: they travel to the
workers in the run's context, ``context.features[SECTION]``) and makes its parts of a run
from them (``feature``: a :class:`Feature`). :mod:`raysim.layers.registry` lists the
features, one line each; the config takes its sections from that list and
:mod:`raysim.layers.assembly` puts a run together from their modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.configuration.schema import PartitionConfig, StrictModel, TrainingConfig
    from raysim.data.partition import Partition
    from raysim.rounds.round_loop import RoundCallback, Sampler
    from raysim.training.context import RunContext
    from raysim.vectors.weights import Weights


class RunSettings(Protocol):
    """The parts of an experiment's config that the features' checks and settings read (an
    :class:`~raysim.configuration.experiment.ExperimentConfig`); a feature's own section by its name."""

    @property
    def algorithm(self) -> StrictModel: ...

    @property
    def partition(self) -> PartitionConfig: ...

    @property
    def clients_per_round(self) -> int: ...

    @property
    def training(self) -> TrainingConfig: ...

    def section(self, name: str) -> Any:
        """The config section ``name`` (a feature's ``SECTION``), None when absent."""


SectionT = TypeVar("SectionT")


def section_of(config: RunSettings, name: str, schema: type[SectionT]) -> SectionT | None:
    """The config's section ``name``, of the feature's ``schema`` (None when absent)."""
    found = config.section(name)
    assert found is None or isinstance(found, schema), (name, type(found))
    return found


@dataclass(frozen=True)
class RunStart:
    """What a feature's work before the first round is made from, on the driver while the
    workers configure: the run's context, partition and initial model, and ``on_worker``,
    which runs ``function(*args)`` in a client worker's process and returns the wait for its
    result (work that needs what that process imports anyway, e.g. torch's FLOP counter)."""

    context: RunContext
    partition: Partition
    initial_weights: Weights
    on_worker: Callable[..., Callable[[], Any]]


class Feature:
    """One feature's parts in one run; each hook's default adds nothing."""

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        """The algorithm wrapped in this feature's layer (on the driver and every worker)."""
        return algorithm

    def before_rounds(self, start: RunStart) -> None:
        """Start the work this feature needs before the first round (on the driver; e.g. the
        simulated clock's plan, made in a thread); its sampler and callbacks wait for it."""

    def sampler(self) -> Sampler | None:
        """Who takes part in each round, if this feature decides it (None: it does not)."""
        return None

    def callbacks(self, rounds: int) -> list[RoundCallback]:
        """This feature's round-loop callbacks (``rounds``: the configured rounds)."""
        return []

    def round_cap(self) -> int | None:
        """The most rounds this feature allows (None: no cap)."""
        return None

    def manifest(self) -> dict[str, Any]:
        """Entries for the run's manifest."""
        return {}


class FeatureModule(Protocol):
    """What a feature's module defines (see the module docstring)."""

    @property
    def SECTION(self) -> str:
        """The feature's config section (a top-level key of the experiment config)."""

    @property
    def SECTION_MODEL(self) -> type[StrictModel]:
        """The section's schema; the section is optional (None: the feature is off)."""

    def check(self, config: RunSettings) -> None:
        """Refuse a config whose method this feature cannot serve (one paragraph, exit 2)."""

    def settings(self, config: RunSettings, num_clients: int, per_round: int) -> Any:
        """The feature's settings for a run of ``num_clients`` clients of which ``per_round``
        are expected each round (None: the feature is off in this run)."""

    def feature(self, context: RunContext) -> Feature | None:
        """The feature's parts of a run from its settings in ``context.features`` (None:
        off)."""


def algorithms_with(attribute: str, truthy: bool = True) -> str:
    """The registered algorithms whose declaration ``attribute`` (a field of their
    :class:`~raysim.algorithms.supports.Supports`, or a class attribute such as
    ``mean_uploads``) is truthy (``truthy``) or None (not ``truthy``), listed: the
    alternatives a refusal names."""
    from raysim.algorithms import ALGORITHMS

    def declared(cls: type[Algorithm[Any, Any]]) -> object:
        supports = cls.supports
        return getattr(supports, attribute) if hasattr(supports, attribute) \
            else getattr(cls, attribute)

    return ", ".join(sorted(name for name, cls in ALGORITHMS.items()
                            if (bool(declared(cls)) if truthy else declared(cls) is None)))
