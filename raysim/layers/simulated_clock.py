"""The simulated clock (``system:``) as one feature: the config check, the sampler that takes
the clients the clock let finish in each round, the clock's columns and ``system`` table, and
under ``system.policy: fedbuff`` the buffered, staleness-weighted server update
(:class:`~raysim.layers.fedbuff.FedBuff`). The plan of every round's clock is made on the
driver before the rounds start (:meth:`SimulatedClock.before_rounds`, in a thread while the
workers configure: :mod:`raysim.system.planning`), with the models' FLOPs counted by a worker."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.configuration.schema import SystemConfig
from raysim.errors import ConfigError
from raysim.layers.feature import Feature, RunSettings, RunStart, algorithms_with, section_of
from raysim.layers.fedbuff import FedBuff
from raysim.rounds.round_loop import RoundCallback, RoundLoop, RoundOutcome
from raysim.system.plan import architecture_flops
from raysim.system.planning import ClockSettings, PlanInBackground
from raysim.system.records import ClockRecords

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.rounds.round_loop import Sampler
    from raysim.system.plan import SystemPlan
    from raysim.training.context import RunContext

SECTION = "system"


def section(config: RunSettings) -> SystemConfig | None:
    """The config's ``system:`` section (None: no simulated clock)."""
    return section_of(config, SECTION, SystemConfig)


def check(config: RunSettings) -> None:
    """``system:`` needs sites to simulate and, for fedbuff, a method that takes asynchronous
    updates (one paragraph naming why otherwise)."""
    from raysim.algorithms import ALGORITHMS

    system = section(config)
    if system is None:
        return
    name = getattr(config.algorithm, "name", "")
    algorithm_class = ALGORITHMS[name]
    if algorithm_class.pooled:
        raise ConfigError(
            f"Invalid config section `system`: algorithm `{name}` trains one "
            "model on the pooled data, so there are no sites whose speed, bandwidth or "
            "availability could differ. Remove `system`.")
    from raysim.system.profiles import check_profiles

    check_profiles(system, config.partition.num_clients)  # tiers, trace file
    if config.section("privacy") is not None:
        raise ConfigError(
            "Invalid combination: `system` and `privacy`. DP's accountant assumes Poisson "
            "sampling of the clients, and the simulated clock selects by availability and "
            "finishing time, which that accountant does not cover. Remove one of them.")
    if system.policy == "fedbuff":
        if not algorithm_class.mean_uploads:
            raise ConfigError(
                f"Invalid config field `system.policy` = 'fedbuff': algorithm "
                f"`{name}` needs synchronous rounds: "
                f"{algorithm_class.supports.asynchronous_refusal}. Use system.policy sync, deadline or "
                f"overselect, or an algorithm that takes asynchronous updates: "
                f"{algorithms_with('mean_uploads')}.")
        if len(algorithm_class.mean_uploads) > 1:
            raise ConfigError(
                f"Invalid config field `system.policy` = 'fedbuff': algorithm `{name}` uploads "
                f"{len(algorithm_class.mean_uploads)} means, and FedBuff's buffered update "
                "rebases one model from its clients' start versions. Use system.policy sync, "
                "deadline or overselect.")
        buffer = system.buffer_size or config.clients_per_round
        if buffer > config.partition.num_clients:
            raise ConfigError(
                f"Invalid config field `system.buffer_size` = {buffer}: a buffer holds one "
                f"update per site, and there are {config.partition.num_clients} sites. Lower "
                "system.buffer_size.")


@dataclass(frozen=True)
class ClockSampler:
    """The clients the simulated clock let finish in time (or buffered) in each round; a round
    where none did leaves the server state as it was."""

    records: ClockRecords
    skip_empty_rounds = True

    def clients(self, round_: int) -> np.ndarray:
        return self.records.trained(round_)


class ClockColumns(RoundCallback):
    """The simulated clock's record of every round (``system:``): its columns in the
    ``rounds`` row, each trained client's simulated times in the ``clients`` rows, and the
    ``system`` table's rows of every selected site."""

    def __init__(self, records: ClockRecords):
        self.records = records

    def columns(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, Any]:
        return self.records.columns(outcome.round)

    def client_columns(self, loop: RoundLoop, outcome: RoundOutcome,
                       clients: np.ndarray) -> dict[str, np.ndarray]:
        return self.records.clock_columns(outcome.round, clients)

    def tables(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, dict[str, Any]]:
        return {"system": self.records.table(outcome.round)}


class SimulatedClock(Feature):
    """The clock's parts in a run: FedBuff's layer when the policy is fedbuff (on the driver
    and every worker); on the driver the plan of every round (:meth:`before_rounds`), and
    from it the sampler and the clock's columns."""

    def __init__(self, settings: ClockSettings):
        self.settings = settings
        self._plan: Callable[[], SystemPlan] | None = None

    def before_rounds(self, start: RunStart) -> None:
        flops = start.on_worker(architecture_flops, start.context, start.partition.num_clients)
        self._plan = PlanInBackground(self.settings, start.context, start.partition,
                                      start.initial_weights, flops).result

    def plan(self) -> SystemPlan:
        """The plan of every round (waits for it; raises what planning raised)."""
        assert self._plan is not None, "the driver starts the clock's plan before the rounds"
        return self._plan()

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        return FedBuff(algorithm, self.plan) if self.settings.system.policy == "fedbuff" \
            else algorithm

    def sampler(self) -> Sampler:
        return ClockSampler(self.plan().records)

    def callbacks(self, rounds: int) -> list[RoundCallback]:
        return [ClockColumns(self.plan().records)]


def settings(config: RunSettings, num_clients: int, per_round: int) -> ClockSettings | None:
    """What the clock's plan of a run is made from (None without ``system:``)."""
    system = section(config)
    return None if system is None else ClockSettings(system, config.clients_per_round)


def feature(context: RunContext) -> SimulatedClock | None:
    """The clock's parts of the run, or None without the clock."""
    settings = context.features.get(SECTION)
    return None if settings is None else SimulatedClock(settings)
