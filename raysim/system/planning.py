"""The system plan of one run, computed by the run's driver from the run's context and
partition (in a thread while the workers are configured, off the run's critical path), with
the models' FLOPs counted by a client worker (:func:`~raysim.system.plan.architecture_flops`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from raysim.configuration.schema import SystemConfig
from raysim.data import Partition
from raysim.system.clock import Workload
from raysim.system.plan import ArchitectureKey, SystemPlan, client_work, system_plan
from raysim.system.profiles import SiteProfile, site_profiles
from raysim.training.context import RunContext
from raysim.vectors.weights import payload_bytes


@dataclass(frozen=True)
class ClockSettings:
    """What a run's clock is planned from besides its context, partition and initial model:
    the ``system:`` section and the clients the config samples per round."""

    system: SystemConfig
    clients_per_round: int


def plan_for_run(settings: ClockSettings, context: RunContext, partition: Partition,
                 initial_weights: Any, flops: Mapping[ArchitectureKey, float],
                 profiles: list[SiteProfile] | None = None) -> SystemPlan:
    """Every round's clock for the run: the sites' profiles (``profiles`` when already drawn:
    :func:`run_profiles`), each client's training GFLOPs (its architecture at its input size
    (``flops``: :func:`architecture_flops` of the context), its data) and the model's bytes
    both ways (FedScale's assumption: an upload is model-sized)."""
    work = client_work(context, partition.sizes(), flops)
    size = float(payload_bytes(initial_weights))
    return system_plan(settings.system, Workload(work, size, size), context.training.rounds,
                       settings.clients_per_round, context.seed, profiles)


def run_profiles(settings: ClockSettings, context: RunContext, partition: Partition
                 ) -> list[SiteProfile]:
    """The run's sites' profiles (they need no FLOPs: drawn while a worker counts them)."""
    return site_profiles(settings.system, partition.num_clients, context.seed)


class PlanInBackground:
    """:func:`plan_for_run` in a thread, started at once; :meth:`result` waits for the plan
    (or raises what planning raised). ``flops``: waits for the FLOPs (a worker counts them)."""

    def __init__(self, settings: ClockSettings, context: RunContext, partition: Partition,
                 initial_weights: Any, flops: Callable[[], Mapping[ArchitectureKey, float]]):
        self._plan: SystemPlan | None = None
        self._error: BaseException | None = None

        def plan() -> None:
            try:
                profiles = run_profiles(settings, context, partition)  # before the FLOPs come
                self._plan = plan_for_run(settings, context, partition, initial_weights,
                                          flops(), profiles)
            except BaseException as error:  # re-raised by result() in the driver's thread
                self._error = error

        self._thread = threading.Thread(target=plan, name="raysim-clock-plan", daemon=True)
        self._thread.start()

    def result(self) -> SystemPlan:
        """The plan, once computed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._plan is not None
        return self._plan
