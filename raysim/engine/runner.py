"""Start (or join) Ray, launch one Driver per seed and follow their progress."""

from __future__ import annotations

import contextlib
import json
import math
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysim.algorithms import ALGORITHMS
from raysim.config import ExperimentConfig
from raysim.data import ArrayDataset, Partition
from raysim.engine.interrupt import STOP
from raysim.engine.launch.local_ray import Started, ensure_ray
from raysim.engine.launch.parallel_runs import runs_at_once
from raysim.engine.pool.seed_groups import RunKey, SeedGroup, plan_seed_groups
from raysim.engine.pool.shared_actors import POOL, WorkerShape
from raysim.engine.pool.worker_host import RunBoundWorker
from raysim.engine.progress import RunProgress, labels_of
from raysim.engine.resume import FINISHED, INVOCATION, check_same_config, new_run_root, run_directory
from raysim.engine.run.driver import RunSpec
from raysim.engine.run.worker import WorkerSetup
from raysim.errors import RaysimError, ResultsNotWritable, RunInterrupted
from raysim.preparation import initial_weights, pooled, prepare, run_context
from raysim.results.live import prepare_store
from raysim.results.load import load
from raysim.results.manifest import (
    MANIFEST,
    git_commit,
    package_versions,
    read_manifest,
    update_manifest,
    write_manifest,
)
from raysim.training.evaluation import test_sources


@dataclass
class RunOutcome:
    """How one seed's run ended."""

    seed: int
    run_dir: Path
    final: dict[str, Any] | None
    error: str | None = None
    exit_code: int = 0
    """The CLI's exit code for this run: 0 completed, 2 stopped by bad input found only once
    the run started (its error is the paragraph that says what to fix), 1 failed otherwise."""


def run_experiment(config: ExperimentConfig, *, data_root: str | None = None,
                   output: str | None = None, progress: bool = True) -> list[RunOutcome]:
    """Run every seed of one experiment concurrently (see :func:`run_experiments`)."""
    return run_experiments({"": config}, data_root=data_root, output=output, progress=progress)


def run_experiments(experiments: dict[str, ExperimentConfig], *, data_root: str | None = None,
                    output: str | None = None, progress: bool = True,
                    resume: str | Path | None = None,
                    labels: dict[str, dict[str, Any]] | None = None,
                    started_at: float | None = None,
                    started: Started | None = None,
                    invocation: dict[str, Any] | None = None) -> list[RunOutcome]:
    """Run every seed of every experiment (e.g. a method and its baselines) concurrently on
    one Ray cluster; results stream to Parquet under one root: ``<root>/<label>/seed_<s>``
    (``<root>/seed_<s>`` for the unlabelled experiment).

    ``resume``: an earlier root of the same experiments; completed runs are kept as they are,
    interrupted ones continue from their last checkpoint and missing ones start.
    ``labels``: extra manifest fields per experiment label (e.g. a sweep's grid values).
    ``started_at``: when the command started (default: now), for the start-up phases that
    every manifest records (``startup``; see :func:`startup_phases`).
    ``started``: Ray already started and the data prepared alongside it
    (:func:`raysim.engine.launch.local_ray.start_alongside`, as ``raysim run`` does).
    ``invocation``: the command's options, recorded in a new root's ``invocation.json`` (a
    bare ``--resume`` reuses them).
    """
    phases = {"command_at": started_at or time.time(), "entered_at": time.time()}
    if started is not None:
        prepared = started.prepared
        phases.update(started.phases)
    else:
        prepared = {label: prepare(config, data_root) for label, config in experiments.items()}
        phases["prepared_at"] = time.time()
    first = next(iter(experiments.values()))
    root = (Path(resume) if resume is not None else new_run_root(first, output)).absolute()
    if invocation is not None and not (root / INVOCATION).exists():
        root.mkdir(parents=True, exist_ok=True)
        (root / INVOCATION).write_text(json.dumps(invocation, indent=1))
    for config in experiments.values():
        if config.logging.mlflow is not None:
            root.mkdir(parents=True, exist_ok=True)
            prepare_store(config.logging, root, [config.name])
    queue: list[tuple[str, int]] = [(label, seed) for label, config in experiments.items()
                                    for seed in config.seeds]
    run_dirs = {key: run_directory(root, *key) for key in queue}
    finished = {key: final for key in queue
                if (final := _completed_run(run_dirs[key], experiments[key[0]])) is not None}
    queue = [key for key in queue if key not in finished]
    if started is not None:  # Ray is up and its settings were checked
        notices = list(started.notices)
    else:
        notices = []
        for config in experiments.values():
            notices += [n for n in ensure_ray(config, runs=list(experiments.values()))
                        if n not in notices]
    for config in experiments.values():  # settings a method accepts but does worse under
        notices += [line for line in ALGORITHMS[config.algorithm.name].config_warnings(
            config.algorithm, config.training) if line not in notices]
    for notice in notices:
        print(notice, file=sys.stderr)
    phases.setdefault("ray_ready_at", time.time())
    arrays: dict[str, dict[str, Any]] = {}
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    limit = _concurrent_runs(experiments.values())

    seed_groups = plan_seed_groups(queue, experiments, limit)
    borrowed: dict[RunKey, tuple[WorkerShape, list[Any], Any]] = {}
    shared: dict[SeedGroup, _SharedHosts] = {}

    def run_workers(key: RunKey) -> tuple[WorkerShape, list[Any]]:
        """The run's workers: its own, or its slot on its seed group's shared hosts."""
        config = experiments[key[0]]
        seed_group = seed_groups.get(key)
        if seed_group is None:
            shape = worker_shape(config)
            return shape, POOL.workers(shape, config.engine.num_workers)
        if seed_group not in shared:
            shape = worker_shape(config, hosted=True)
            shared[seed_group] = _SharedHosts(shape, POOL.workers(shape, config.engine.num_workers))
        hosts = shared[seed_group]
        hosts.running.add(key)
        return hosts.shape, [RunBoundWorker(host, seed_group.slot(key[1])) for host in hosts.actors]

    def start(key: RunKey) -> tuple[Any, Any]:
        """Start a run on workers and a driver host from the pool (after its driver died: on
        the same workers with a new driver)."""
        label, seed = key
        config = experiments[label]
        dataset, partition = prepared[label][seed]
        dataset_key = str(id(dataset))
        if dataset_key not in arrays:  # each dataset goes into the object store once
            arrays[dataset_key] = {name: ray.put(getattr(dataset, name))
                                   for name in ("train_x", "train_y", "test_x", "test_y")}
        spec = _run_spec(config, dataset, partition, seed, arrays[dataset_key], run_dirs[key],
                         notices, {**(labels or {}).get(label, {}), "startup": phases,
                                   "variant_index": list(experiments).index(label)}, root)
        restarted = borrowed.get(key)
        shape, workers = restarted[:2] if restarted else run_workers(key)
        seed_group = seed_groups.get(key)
        if seed_group is None:
            driver = POOL.driver(here)
        else:  # the seed group's runs share a driver host (a new one after it died)
            group = shared[seed_group]
            if group.driver is None or (restarted and restarted[2] is group.driver):
                group.driver = POOL.driver(here)
            driver = group.driver
        borrowed[key] = (shape, workers, driver)
        return _Progress(driver, str(run_dirs[key])), driver.run.remote(spec, workers)

    def finish(key: RunKey, succeeded: bool) -> None:
        """A run ended: its actors go back to the pool, or are killed if it failed. A run on
        shared hosts frees its slot; the hosts go back when the seed group's last run ends (and
        are killed if any of its runs failed)."""
        shape, workers, driver = borrowed.pop(key)
        seed_group = seed_groups.get(key)
        if seed_group is not None:
            group = shared[seed_group]
            group.running.discard(key)
            group.failed |= not (_leave_slot(run_dirs[key], workers) and succeeded)
            if group.running:
                return
            workers, succeeded = group.actors, not group.failed
            del shared[seed_group]
        if succeeded:
            POOL.give_back_workers(shape, workers)
            POOL.give_back_driver(driver)
        else:
            POOL.discard([*workers, driver])

    try:
        results = _follow(queue, start, finish, limit,
                          {key: experiments[key[0]].training.rounds for key in queue}, progress,
                          {key: seed_group.keys[0] for key, seed_group in seed_groups.items()})
    except KeyboardInterrupt:
        POOL.discard(list(dict.fromkeys(  # stop the runs that were going
            actor.host if isinstance(actor, RunBoundWorker) else actor
            for _, workers, driver in borrowed.values() for actor in (*workers, driver))))
        for key in queue:  # runs that were going say so; completed ones keep their status
            if (run_dirs[key] / MANIFEST).is_file() and \
                    read_manifest(run_dirs[key]).get("status") in ("running", "queued"):
                update_manifest(run_dirs[key], status="interrupted", interrupted=time.time())
        raise RunInterrupted(str(root)) from None
    if STOP.requested:  # the runs that were going stopped at a round boundary
        raise RunInterrupted(str(root))
    results.update({key: (final, None, 0) for key, final in finished.items()})
    return [RunOutcome(key[1], run_dirs[key], *results[key]) for key in run_dirs]


MAX_DRIVER_RESTARTS = 3


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
class _Progress:
    """Asks a driver host for one run's progress."""

    host: Any
    run_dir: str

    def query(self) -> Any:
        return self.host.progress.remote(self.run_dir)

    def stop(self) -> Any:
        """Ask the run to stop at its next round boundary."""
        return self.host.request_stop.remote(self.run_dir)


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


def startup_phases(manifest: dict[str, Any]) -> dict[str, float] | None:
    """Seconds spent in each start-up phase of a run, from its manifest: ``imports`` (from the
    command's start to the runner: Python, raysim, the config; torch too unless Ray started
    alongside), ``data`` (load, checksum, partition, model check; with Ray alongside, also the
    engine's imports), ``ray`` (start or join Ray), ``workers`` (from Ray and the data being
    ready to the run's workers being configured: process start, imports, model warm-up; near
    zero for pooled ones) and ``first_round`` (from the command to the first round's
    dispatch); ``cpu_wait`` is the time spent waiting for CPUs that another raysim invocation
    held (not counted in ``ray``); ``alongside`` is 1 when Ray started beside the imports and
    the data (:func:`raysim.engine.launch.local_ray.start_alongside`), else 0; ``joined`` is 1 when the
    invocation joined a warm cluster (``raysim cluster start``), else 0. A resumed run's record
    is its resuming command's. None for runs without the record."""
    startup = manifest.get("startup")
    ready, dispatched = manifest.get("workers_ready_at"), manifest.get("first_dispatch_at")
    if not startup or ready is None or dispatched is None:
        return None
    alongside = "ray_started_at" in startup
    entered = startup.get("ray_started_at", startup.get("entered_at", startup["command_at"]))
    ray_from = startup["ray_started_at"] if alongside else startup["prepared_at"]
    cpu_wait = float(startup.get("cpu_wait_s", 0.0))
    return {"imports": entered - startup["command_at"],
            "data": startup["prepared_at"] - entered,
            "ray": startup["ray_ready_at"] - ray_from - cpu_wait, "cpu_wait": cpu_wait,
            "workers": ready - max(startup["ray_ready_at"], startup["prepared_at"]),
            "alongside": float(alongside), "joined": float(startup.get("joined", 0.0)),
            "first_round": dispatched - startup["command_at"]}


def _completed_run(run_dir: Path, config: ExperimentConfig) -> dict[str, Any] | None:
    """For a run directory from an earlier invocation: its final rounds row if it reached its
    end, None if it must (re)start. Raises ConfigError if it was made from a different config."""
    if not (run_dir / MANIFEST).is_file():
        return None
    check_same_config(run_dir, config)
    if read_manifest(run_dir).get("status") not in FINISHED:
        return None
    rounds = load(run_dir, "rounds")
    return rounds.iloc[-1].to_dict() if not rounds.empty else {}


def _uses_gpus(config: ExperimentConfig) -> bool:
    """Whether the run's workers get GPUs: asked for, and the cluster has some."""
    return config.engine.gpus_per_worker > 0 and ray.cluster_resources().get("GPU", 0) > 0


def worker_shape(config: ExperimentConfig, hosted: bool = False) -> WorkerShape:
    """The resources and scheduling of a run's workers (``hosted``: worker processes shared
    by a seed group of runs, :class:`~raysim.engine.pool.worker_host.WorkerHost`)."""
    engine = config.engine
    return WorkerShape(engine.cpus_per_worker,
                       engine.gpus_per_worker if _uses_gpus(config) else 0.0,
                       engine.placement == "spread", engine.max_worker_failures, hosted)


def prestart_actors(experiments: dict[str, ExperimentConfig]) -> None:
    """Start the worker and driver actors of the runs that will go first (those of the first
    run's worker shape), so that their processes start and import torch while the data is
    still being prepared; they wait idle in the pool until their run borrows them."""
    keys = [(label, seed) for label, config in experiments.items() for seed in config.seeds]
    limit = _concurrent_runs(experiments.values())
    seed_groups = plan_seed_groups(keys, experiments, limit)
    groups: dict[Any, list[RunKey]] = {}
    for key in keys:  # the runs' groups in order (a seed group's runs start together)
        groups.setdefault(seed_groups.get(key, key), []).append(key)
    first = list(groups.values())[:limit]
    shapes = [worker_shape(experiments[group[0][0]], hosted=group[0] in seed_groups)
              for group in first]
    alike = [group for group, shape in zip(first, shapes, strict=True) if shape == shapes[0]]
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    POOL.prestart(shapes[0], sum(experiments[g[0][0]].engine.num_workers for g in alike),
                  len(alike), here)  # a seed group's runs share a driver host


def _concurrent_runs(configs: Any) -> int:
    """How many runs fit on the cluster at once (:func:`runs_at_once` on its resources)."""
    resources = ray.cluster_resources()
    return runs_at_once(configs, resources.get("CPU", 0), resources.get("GPU", 0))


def _run_spec(config: ExperimentConfig, dataset: ArrayDataset, partition: Partition,
              seed: int, arrays: dict[str, Any], run_dir: Path, notices: list[str],
              extra: dict[str, Any], root: Path) -> RunSpec:
    """Write the run directory's manifest and partition (or, for a run that resumes, note the
    resumption); returns what its driver needs."""
    algorithm_class = ALGORITHMS[config.algorithm.name]
    resume = (run_dir / MANIFEST).is_file()
    if resume:
        resumes = read_manifest(run_dir).get("resumes", [])
        update_manifest(run_dir, status="running", error=None, traceback=None,
                        resumes=[*resumes, {"at": time.time(), "host": socket.gethostname(),
                                            "engine": config.engine.model_dump(mode="json")}],
                        # start-up phases of the resuming command, not the first one's
                        **({"startup": extra["startup"]} if "startup" in extra else {}))
    else:
        run_dir.mkdir(parents=True, exist_ok=True)  # (a resumed root may hold an empty one)
        partition.save(run_dir / "partition.parquet")
        write_manifest(run_dir, {
            "name": config.name, "seed": seed, "algorithm": config.algorithm.name,
            "status": "running", "started": time.time(), "host": socket.gethostname(),
            "config": config.model_dump(mode="json"), "versions": package_versions(),
            "git_commit": git_commit(), "notices": notices, "dataset": dataset.info.name,
            **extra,
        })
    client_test_shares = tuple(partition.test)
    sources = test_sources(len(dataset.test_y), partition.test, partition.unseen)
    validation_index, validation_sources = partition.validation_sources()
    if algorithm_class.pooled:
        full = getattr(config.algorithm, "data", "clients") == "full"
        partition = pooled(partition, len(dataset.test_y),
                           len(dataset.train_y) if full else None)
    context = run_context(config, dataset, seed, partition.num_clients)
    setup = WorkerSetup(algorithm_class, config.algorithm, context, arrays, partition,
                        initial_weights(config, dataset, seed), config.evaluation.batch_size,
                        threads=max(1, math.floor(config.engine.cpus_per_worker)),
                        vectorize=config.engine.vectorize,
                        per_client_loop=algorithm_class.per_client_loop,
                        test_sources=sources,
                        membership_audit=config.evaluation.membership_audit,
                        gpu_fraction=config.engine.gpus_per_worker,
                        validation_index=validation_index if len(validation_index) else None,
                        validation_sources=validation_sources)
    use_gpus = _uses_gpus(config)
    label = run_dir.parent.name if run_dir.parent.name != root.name else ""
    clock = None
    if config.system is not None:  # the driver plans the simulated clock of every round
        from raysim.system.planning import ClockSettings

        clock = ClockSettings(config.system, config.clients_per_round)
    return RunSpec(str(run_dir), setup, config.training.rounds, config.engine,
                   config.evaluation, use_gpus, resume=resume,
                   client_test_shares=client_test_shares, logging=config.logging,
                   live_names=(str(root), config.name, f"{label + '/' if label else ''}"
                               f"{run_dir.name}"),
                   params=config.model_dump(mode="json") if (
                       config.logging.mlflow or config.logging.tensorboard) else {},
                   clock=clock)


def _follow(queue: list[RunKey], start: Any, finish: Any, limit: int,
            rounds: dict[RunKey, int], show: bool, group_of: dict[RunKey, RunKey] | None = None
            ) -> dict[RunKey, tuple[dict[str, Any] | None, str | None, int]]:
    """Start runs (at most ``limit`` groups at a time, in order) and show live progress: one
    bar per run with round, status, latest accuracy and ETA. Runs of one group (a seed group on
    shared workers, ``group_of``) count once and start together; other runs are groups of
    their own. A driver whose process dies is replaced by one that resumes from the run's
    checkpoint. ``start(key)`` returns (progress, future), ``progress.query()`` a reference
    to the run's progress; ``finish(key, succeeded)`` is called when a run ends. Returns
    (final row, error, exit code) per run."""
    group_of = group_of or {}
    progress_view = RunProgress(labels_of(queue), dict(rounds), show)
    started_at: dict[RunKey, float] = {}
    waiting = list(queue)
    active: dict[tuple[str, int], tuple[Any, Any]] = {}
    results: dict[tuple[str, int], tuple[dict[str, Any] | None, str | None, int]] = {}
    restarts: dict[tuple[str, int], int] = {}

    stopping = False

    def may_start(key: RunKey) -> bool:
        """Whether ``key`` may start now: its group is going, or another group fits."""
        groups = {group_of.get(k, k) for k in active}
        return group_of.get(key, key) in groups or len(groups) < limit

    while waiting or active:
        if STOP.requested and not stopping:  # SIGINT/SIGTERM: stop at round boundaries
            stopping = True
            waiting.clear()  # not started: `--resume` starts them
            for progress, _ in active.values():
                progress.stop()
        while waiting and may_start(waiting[0]):
            key = waiting.pop(0)
            started_at[key] = time.monotonic()
            active[key] = start(key)
        ready, _ = ray.wait([future for _, future in active.values()], timeout=0.5,
                            num_returns=len(active))
        for key, (progress, future) in list(active.items()):
            with contextlib.suppress(ray.exceptions.RayError):
                progress_view.update(key, ray.get(progress.query(), timeout=5))
            if future in ready:
                try:
                    results[key] = (ray.get(future), None, 0)
                except ray.exceptions.RayActorError as error:  # the driver's process died
                    if error.actor_init_failed:  # a bug or bad input, not a lost process
                        results[key] = (None, f"the driver could not start: {error}", 1)
                    elif restarts.get(key, 0) >= MAX_DRIVER_RESTARTS:
                        results[key] = (None, f"the driver died {MAX_DRIVER_RESTARTS + 1} times "
                                        f"(last: {error})", 1)
                    else:  # a new driver resumes from the run's checkpoint
                        restarts[key] = restarts.get(key, 0) + 1
                        active[key] = start(key)
                        continue
                except ray.exceptions.RayError as error:
                    cause = getattr(error, "cause", None) or error
                    code = cause.exit_code if isinstance(cause, RaysimError) else 1
                    results[key] = (None, f"{type(cause).__name__}: {cause}", code)
                finish(key, results[key][1] is None)
                final = results[key][0]
                stop_reason = (final or {}).get("stop_reason")
                progress_view.finished(key, results[key][1],
                                       time.monotonic() - started_at[key],
                                       interrupted=(final or {}).get("interrupted"),
                                       stopped=stop_reason if isinstance(stop_reason, str)
                                       else None)
                del active[key]
    progress_view.close()
    return results
