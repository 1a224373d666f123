"""The simulated clock (``system:``) as one feature: the config check, the sampler that takes
the clients the clock let finish in each round, the clock's columns and ``system`` table, and
under ``system.policy: fedbuff`` the buffered, staleness-weighted server update
(:class:`~raysim.layers.fedbuff.FedBuff`). The plan of every round's clock is made on the
driver before the rounds start (:mod:`raysim.system.planning`); the feature reads it from
``plan``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.errors import ConfigError
from raysim.layers.feature import Feature, RunSettings, algorithms_with
from raysim.layers.fedbuff import FedBuff
from raysim.rounds.round_loop import RoundCallback, RoundLoop, RoundOutcome
from raysim.system.planning import ClockSettings, PlanInBackground
from raysim.system.records import ClockRecords

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.data.partition import Partition
    from raysim.rounds.round_loop import Sampler
    from raysim.system.plan import ArchitectureKey, SystemPlan
    from raysim.training.context import RunContext


def check(config: RunSettings) -> None:
    """``system:`` needs sites to simulate and, for fedbuff, a method that takes asynchronous
    updates (one paragraph naming why otherwise)."""
    from raysim.algorithms import ALGORITHMS

    system = config.system
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
    if config.privacy is not None:
        raise ConfigError(
            "Invalid combination: `system` and `privacy`. DP's accountant assumes Poisson "
            "sampling of the clients, and the simulated clock selects by availability and "
            "finishing time, which that accountant does not cover. Remove one of them.")
    if system.policy == "fedbuff":
        if not algorithm_class.mean_uploads:
            raise ConfigError(
                f"Invalid config field `system.policy` = 'fedbuff': algorithm "
                f"`{name}` needs synchronous rounds: "
                f"{algorithm_class.asynchronous_refusal}. Use system.policy sync, deadline or "
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
    """The clock's parts in a run: on the driver (``plan`` given) its sampler and columns; on
    the driver and every worker FedBuff's layer when the policy is fedbuff."""

    def __init__(self, context: RunContext, plan: Callable[[], SystemPlan] | None):
        self.buffered = context.fedbuff_server_lr is not None
        self.plan = plan

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        return FedBuff(algorithm, self.plan) if self.buffered else algorithm

    def sampler(self) -> Sampler | None:
        return None if self.plan is None else ClockSampler(self.plan().records)

    def callbacks(self, rounds: int) -> list[RoundCallback]:
        return [] if self.plan is None else [ClockColumns(self.plan().records)]


def buffered_server_lr(config: RunSettings) -> float | None:
    """FedBuff's ``system.server_lr`` under ``system.policy: fedbuff`` (None: synchronous
    rounds)."""
    system = config.system
    return system.server_lr if system is not None and system.policy == "fedbuff" else None


def settings(config: RunSettings) -> ClockSettings | None:
    """What the clock's plan of a run is made from (None without ``system:``)."""
    system = config.system
    return None if system is None else ClockSettings(system, config.clients_per_round)


def start_plan(settings: ClockSettings, context: RunContext, partition: Partition,
               initial_weights: Any, flops: Callable[[], Mapping[ArchitectureKey, float]]
               ) -> Callable[[], SystemPlan]:
    """Plan every round's clock in a thread, started now (``flops``: waits for the models'
    forward FLOPs, which a worker counts); returns the wait for the plan (it raises what
    planning raised)."""
    return PlanInBackground(settings, context, partition, initial_weights, flops).result


def feature(context: RunContext, plan: Callable[[], SystemPlan] | None) -> SimulatedClock | None:
    """The clock's parts of the run (``plan``: the clock's plan, on the driver of a run with
    ``system:``), or None without the clock."""
    if plan is None and context.fedbuff_server_lr is None:
        return None
    return SimulatedClock(context, plan)
