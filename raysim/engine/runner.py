"""Run an invocation's experiments: one driver per seed on actors from the pool, results under
one root, runs that completed earlier kept as they are."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import ExperimentConfig
from raysim.data import ArrayDataset, Partition
from raysim.engine.follow import follow
from raysim.engine.interrupt import STOP
from raysim.engine.launch.local_ray import Started, ensure_ray
from raysim.engine.pool.run_actors import RunActors, concurrent_runs
from raysim.engine.pool.seed_groups import RunKey
from raysim.engine.resume import INVOCATION, completed_run, new_run_root, run_directory
from raysim.engine.run_specs import run_spec
from raysim.errors import RunInterrupted
from raysim.preparation import prepare
from raysim.results.live import prepare_store
from raysim.results.manifest import MANIFEST, read_manifest, update_manifest


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
    root = _results_root(experiments, output, resume, invocation)
    queue = [(label, seed) for label, config in experiments.items() for seed in config.seeds]
    run_dirs = {key: run_directory(root, *key) for key in queue}
    finished = {key: final for key in queue
                if (final := completed_run(run_dirs[key], experiments[key[0]])) is not None}
    queue = [key for key in queue if key not in finished]
    notices = _notices(experiments, started)
    phases.setdefault("ray_ready_at", time.time())
    limit = concurrent_runs(experiments.values())
    launcher = _Launcher(experiments, prepared, root, run_dirs, notices, labels or {}, phases,
                         RunActors(experiments, queue, limit))
    try:
        results = follow(queue, launcher.start, launcher.finish, limit,
                         {key: experiments[key[0]].training.rounds for key in queue}, progress,
                         launcher.actors.group_of())
    except KeyboardInterrupt:
        launcher.actors.discard_all()  # stop the runs that were going
        _mark_interrupted([run_dirs[key] for key in queue])
        raise RunInterrupted(str(root)) from None
    if STOP.requested:  # the runs that were going stopped at a round boundary
        raise RunInterrupted(str(root))
    results.update({key: (final, None, 0) for key, final in finished.items()})
    return [RunOutcome(key[1], run_dirs[key], *results[key]) for key in run_dirs]


def _results_root(experiments: dict[str, ExperimentConfig], output: str | None,
                  resume: str | Path | None, invocation: dict[str, Any] | None) -> Path:
    """The invocation's results root (a new one, or the one it resumes), with the command's
    options in a new root's ``invocation.json`` and the live-metric stores prepared."""
    first = next(iter(experiments.values()))
    root = (Path(resume) if resume is not None else new_run_root(first, output)).absolute()
    if invocation is not None and not (root / INVOCATION).exists():
        root.mkdir(parents=True, exist_ok=True)
        (root / INVOCATION).write_text(json.dumps(invocation, indent=1))
    for config in experiments.values():
        if config.logging.mlflow is not None:
            root.mkdir(parents=True, exist_ok=True)
            prepare_store(config.logging, root, [config.name])
    return root


def _notices(experiments: dict[str, ExperimentConfig], started: Started | None) -> list[str]:
    """Ray started (unless it was) with its notices, and the settings a method accepts but
    does worse under; each printed once, and recorded in every run's manifest."""
    if started is not None:  # Ray is up and its settings were checked
        notices = list(started.notices)
    else:
        notices = []
        for config in experiments.values():
            notices += [n for n in ensure_ray(config, runs=list(experiments.values()))
                        if n not in notices]
    for config in experiments.values():
        notices += [line for line in ALGORITHMS[config.algorithm.name].config_warnings(
            config.algorithm, config.training) if line not in notices]
    for notice in notices:
        print(notice, file=sys.stderr)
    return notices


def _mark_interrupted(run_dirs: list[Path]) -> None:
    """Runs that were going say they were interrupted; completed ones keep their status."""
    for run_dir in run_dirs:
        if (run_dir / MANIFEST).is_file() and \
                read_manifest(run_dir).get("status") in ("running", "queued"):
            update_manifest(run_dir, status="interrupted", interrupted=time.time())


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


@dataclass
class _Launcher:
    """Starts an invocation's runs on actors from the pool and gives them back as they end."""

    experiments: dict[str, ExperimentConfig]
    prepared: dict[str, dict[int, tuple[ArrayDataset, Partition]]]
    root: Path
    run_dirs: dict[RunKey, Path]
    notices: list[str]
    labels: dict[str, dict[str, Any]]
    phases: dict[str, float]
    actors: RunActors
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each dataset's arrays in the object store (put there once)."""

    def start(self, key: RunKey) -> tuple[_Progress, Any]:
        """Start a run on workers and a driver host from the pool (after its driver died: on
        the same workers with a new driver)."""
        label, seed = key
        config = self.experiments[label]
        dataset, partition = self.prepared[label][seed]
        dataset_key = str(id(dataset))
        if dataset_key not in self.arrays:
            self.arrays[dataset_key] = {name: ray.put(getattr(dataset, name))
                                        for name in ("train_x", "train_y", "test_x", "test_y")}
        spec = run_spec(config, dataset, partition, seed, self.arrays[dataset_key],
                        self.run_dirs[key], self.notices,
                        {**self.labels.get(label, {}), "startup": self.phases,
                         "variant_index": list(self.experiments).index(label)}, self.root)
        held = self.actors.borrow(key)
        return (_Progress(held.driver, str(self.run_dirs[key])),
                held.driver.run.remote(spec, held.workers))

    def finish(self, key: RunKey, succeeded: bool) -> None:
        """A run ended: its actors go back (:meth:`RunActors.give_back`)."""
        self.actors.give_back(key, succeeded, self.run_dirs[key])
