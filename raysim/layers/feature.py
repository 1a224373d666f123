"""What a feature of a run's settings (client-level DP, a server optimizer, the simulated clock)
adds to it, in one place per feature: its config check, the layer it wraps the algorithm in,
the sampler that replaces the uniform draw, its round-loop callbacks, a cap on the rounds and
its manifest entry. :mod:`raysim.layers.assembly` puts a run together from them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.rounds.round_loop import RoundCallback, Sampler
    from raysim.schema import (
        PartitionConfig,
        PrivacyConfig,
        ServerOptimizerConfig,
        StrictModel,
        SystemConfig,
        TrainingConfig,
    )


class RunSettings(Protocol):
    """The parts of an experiment's config that the features' checks read (an
    :class:`~raysim.config.ExperimentConfig`)."""

    @property
    def algorithm(self) -> StrictModel: ...

    @property
    def partition(self) -> PartitionConfig: ...

    @property
    def privacy(self) -> PrivacyConfig | None: ...

    @property
    def system(self) -> SystemConfig | None: ...

    @property
    def server_optimizer(self) -> ServerOptimizerConfig | None: ...

    @property
    def clients_per_round(self) -> int: ...

    @property
    def training(self) -> TrainingConfig: ...


class Feature:
    """One feature's parts in one run; each hook's default adds nothing."""

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        """The algorithm wrapped in this feature's layer (on the driver and every worker)."""
        return algorithm

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


def algorithms_with(attribute: str, truthy: bool = True) -> str:
    """The registered algorithms whose class attribute ``attribute`` is truthy (``truthy``)
    or None (not ``truthy``), listed: the alternatives a refusal names."""
    from raysim.algorithms import ALGORITHMS

    return ", ".join(sorted(name for name, cls in ALGORITHMS.items()
                            if (bool(getattr(cls, attribute)) if truthy
                                else getattr(cls, attribute) is None)))
