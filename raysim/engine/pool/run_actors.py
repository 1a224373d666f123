"""The actors each run of an invocation borrows from the pool, and the seed groups behind them.

A run borrows workers of its shape and a driver host (:data:`~.shared_actors.POOL`) when it
starts and gives them back when it ends. Seeds of one config that share worker processes (a
seed group, :mod:`.seed_groups`) borrow the group's hosts: each run its slot on them, the
group one driver host; the hosts go back when the group's last run ends. This module is the
one place that bookkeeping lives: the runner asks :class:`RunActors` for a run's actors and
says when the run ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.configuration.experiment import ExperimentConfig
from raysim.engine.launch.parallel_runs import runs_at_once
from raysim.engine.pool.seed_groups import RunKey, SeedGroup, plan_seed_groups
from raysim.engine.pool.shared_actors import POOL, WorkerShape
from raysim.engine.pool.worker_host import RunBoundWorker
from raysim.errors import ResultsNotWritable
from raysim.results.manifest import update_manifest


def uses_gpus(config: ExperimentConfig) -> bool:
    """Whether the run's workers get GPUs: asked for, and the cluster has some."""
    return config.engine.gpus_per_worker > 0 and ray.cluster_resources().get("GPU", 0) > 0


def concurrent_runs(configs: Iterable[ExperimentConfig]) -> int:
    """How many runs fit on the cluster at once (:func:`runs_at_once` on its resources)."""
    resources = ray.cluster_resources()
    return runs_at_once(configs, resources.get("CPU", 0), resources.get("GPU", 0))


def worker_shape(config: ExperimentConfig, hosted: bool = False) -> WorkerShape:
    """The resources and scheduling of a run's workers (``hosted``: worker processes shared
    by a seed group of runs, :class:`~raysim.engine.pool.worker_host.WorkerHost`)."""
    engine = config.engine
    return WorkerShape(engine.cpus_per_worker,
                       engine.gpus_per_worker if uses_gpus(config) else 0.0,
                       engine.placement == "spread", engine.max_worker_failures, hosted)


def this_node() -> NodeAffinitySchedulingStrategy:
    """Scheduling on the invocation's own node (where driver hosts run)."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def prestart_actors(experiments: dict[str, ExperimentConfig]) -> None:
    """Start the worker and driver actors of the runs that will go first (those of the first
    run's worker shape), so that their processes start and import torch while the data is
    still being prepared; they wait idle in the pool until their run borrows them."""
    keys = [(label, seed) for label, config in experiments.items() for seed in config.seeds]
    limit = concurrent_runs(experiments.values())
    seed_groups = plan_seed_groups(keys, experiments, limit)
    groups: dict[Any, list[RunKey]] = {}
    for key in keys:  # the runs' groups in order (a seed group's runs start together)
        groups.setdefault(seed_groups.get(key, key), []).append(key)
    first = list(groups.values())[:limit]
    shapes = [worker_shape(experiments[group[0][0]], hosted=group[0] in seed_groups)
              for group in first]
    alike = [group for group, shape in zip(first, shapes, strict=True) if shape == shapes[0]]
    POOL.prestart(shapes[0], sum(experiments[g[0][0]].engine.num_workers for g in alike),
                  len(alike), this_node())  # a seed group's runs share a driver host


@dataclass
class _SharedHosts:
    """The worker hosts of one seed group and its runs that have not ended."""

    shape: WorkerShape
    actors: list[Any]
    running: set[RunKey] = field(default_factory=set)
    failed: bool = False
    driver: Any = None
    """The driver host of the seed group's runs."""


@dataclass(frozen=True)
class Borrowed:
    """What one run holds: its workers (of ``shape``) and its driver host."""

    shape: WorkerShape
    workers: list[Any]
    driver: Any


class RunActors:
    """The actors of an invocation's runs: borrowed from the pool when a run starts (again,
    with a new driver host, after its driver died), given back when it ends."""

    def __init__(self, experiments: dict[str, ExperimentConfig], queue: list[RunKey],
                 limit: int):
        self._experiments = experiments
        self.seed_groups = plan_seed_groups(queue, experiments, limit)
        """The seed group of each run that shares worker processes."""
        self._borrowed: dict[RunKey, Borrowed] = {}
        self._shared: dict[SeedGroup, _SharedHosts] = {}
        self._here = this_node()

    def group_of(self) -> dict[RunKey, RunKey]:
        """Each run on shared hosts and its seed group's first run (runs of one group start
        together and count once against the runs that fit at once)."""
        return {key: group.keys[0] for key, group in self.seed_groups.items()}

    def borrow(self, key: RunKey) -> Borrowed:
        """The actors of run ``key``: those it holds already (after its driver died, with a
        new driver host), else its own workers or its slot on its seed group's hosts."""
        held = self._borrowed.get(key)
        seed_group = self.seed_groups.get(key)
        if held is None:
            shape, workers = self._workers(key, seed_group)
        else:
            shape, workers = held.shape, held.workers
        if seed_group is None:
            driver = POOL.driver(self._here)
        else:  # the seed group's runs share a driver host (a new one after it died)
            group = self._shared[seed_group]
            if group.driver is None or (held is not None and held.driver is group.driver):
                group.driver = POOL.driver(self._here)
            driver = group.driver
        self._borrowed[key] = Borrowed(shape, workers, driver)
        return self._borrowed[key]

    def _workers(self, key: RunKey, seed_group: SeedGroup | None
                 ) -> tuple[WorkerShape, list[Any]]:
        config = self._experiments[key[0]]
        if seed_group is None:
            shape = worker_shape(config)
            return shape, POOL.workers(shape, config.engine.num_workers)
        if seed_group not in self._shared:
            shape = worker_shape(config, hosted=True)
            self._shared[seed_group] = _SharedHosts(
                shape, POOL.workers(shape, config.engine.num_workers))
        hosts = self._shared[seed_group]
        hosts.running.add(key)
        return hosts.shape, [RunBoundWorker(host, seed_group.slot(key[1]))
                             for host in hosts.actors]

    def give_back(self, key: RunKey, succeeded: bool, run_dir: Path) -> None:
        """Run ``key`` ended: its actors go back to the pool, or are killed if it failed. A
        run on shared hosts frees its slot; the hosts go back when the seed group's last run
        ends (and are killed if any of its runs failed)."""
        held = self._borrowed.pop(key)
        workers, driver = held.workers, held.driver
        seed_group = self.seed_groups.get(key)
        if seed_group is not None:
            group = self._shared[seed_group]
            group.running.discard(key)
            group.failed |= not (_leave_slot(run_dir, workers) and succeeded)
            if group.running:
                return
            workers, succeeded = group.actors, not group.failed
            del self._shared[seed_group]
        if succeeded:
            POOL.give_back_workers(held.shape, workers)
            POOL.give_back_driver(driver)
        else:
            POOL.discard([*workers, driver])

    def discard_all(self) -> None:
        """Kill every actor a run holds (the invocation was interrupted)."""
        POOL.discard(list(dict.fromkeys(
            actor.host if isinstance(actor, RunBoundWorker) else actor
            for held in self._borrowed.values() for actor in (*held.workers, held.driver))))


def _leave_slot(run_dir: Path, workers: list[RunBoundWorker]) -> bool:
    """A run on shared hosts ended: record in its manifest how its clients trained
    (``merged_training``: vectorised jobs, those trained in one call with another seed's, and
    rendezvous, summed over its workers) and free its slot. False if a host did not answer."""
    try:
        stats = ray.get([w.host.merge_stats.remote(w.slot) for w in workers], timeout=30)
        ray.get([w.reset.remote() for w in workers], timeout=30)
    except (ray.exceptions.RayError, TimeoutError):
        return False
    with contextlib.suppress(ResultsNotWritable):  # (a record; the run's driver reported
        update_manifest(run_dir, merged_training={  # a full disk already)
            name: sum(s[name] for s in stats) for name in stats[0]})
    return True
