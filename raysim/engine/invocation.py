"""The engine's entry point: one invocation of ``raysim run`` or ``raysim sweep`` (many runs,
one Ray), and the Ray session of ``raysim estimate``.

:func:`invoke` decides a ``--resume`` from the run root's files before Ray starts, starts Ray
while a background thread imports the engine and prepares the data (the first runs' actors
start before the data is ready, :mod:`raysim.engine.launch.local_ray`), runs every run with
Ctrl-C stopping at round boundaries, and stops Ray while the caller's closing work (the summary
table, the learning curves) runs beside it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from raysim.engine.launch.bytecode import use_cached_bytecode
from raysim.engine.launch.warm_cluster import running_cluster, start_cluster, stop_cluster
from raysim.errors import RaysimError

if TYPE_CHECKING:
    from raysim.configuration.experiment import ExperimentConfig
    from raysim.engine.runner import RunOutcome

__all__ = ["Invocation", "Invoked", "concurrent_runs", "invoke", "latest_run_root", "ray_for",
           "recorded_options", "run_experiments", "running_cluster", "start_cluster",
           "startup_phases", "stop_cluster", "stop_ray", "use_cached_bytecode", "uses_gpus"]
"""What the command line uses of the engine: this module is its one door."""

Closing = TypeVar("Closing")
Preloaded = TypeVar("Preloaded")


@dataclass(frozen=True)
class Invocation:
    """What to run and where to write it."""

    experiments: dict[str, ExperimentConfig]
    """Labelled configs (label "" for a config without variants)."""
    data_root: str | None
    output: str | None
    progress: bool = True
    """Progress lines with rounds and ETA on a terminal."""
    resume: str | None = None
    """A run root to continue, "latest" for this config's newest, or None for a new root."""
    labels: dict[str, Any] | None = None
    """A sweep's per-label grid values (recorded in each run's manifest)."""
    started_at: float = 0.0
    """When the command started (for the start-up phases in the manifests)."""
    record: dict[str, Any] = field(default_factory=dict)
    """The command's options, stored in the run root so that ``--resume`` recalls them."""


@dataclass(frozen=True)
class Invoked(Generic[Closing]):
    """The runs of an invocation and what the caller's closing work returned."""

    outcomes: list[RunOutcome]
    root: Path
    """The run root (``<output>/<name>-<timestamp>``)."""
    closing: Closing


def invoke(invocation: Invocation, preload: Callable[[], Preloaded],
           closing: Callable[[list[RunOutcome], Path, Preloaded], Closing],
           on_runs_started: Callable[[], None] = lambda: None) -> Invoked[Closing] | None:
    """Run (or resume) every run of ``invocation``; returns None when a resumed root is
    complete already (nothing ran). ``preload()`` runs in a background thread while the runs
    go (e.g. the closing work's imports); ``closing(outcomes, root, preloaded)`` runs while Ray
    shuts down; ``on_runs_started`` is called once start-up (Ray, data) is over."""
    from raysim.engine.launch.local_ray import start_alongside
    from raysim.engine.resume import (
        check_output,
        check_run_root,
        latest_run_root,
        unfinished_runs,
    )

    experiments = invocation.experiments
    first = next(iter(experiments.values()))
    resume = invocation.resume
    if resume == "latest":
        resume = str(latest_run_root(first, invocation.output))
    elif resume is not None and not Path(resume).is_dir():
        raise RaysimError(f"Cannot resume {resume!r}: no such directory. Pass the results "
                          "directory that `raysim run` printed, or --resume alone for the latest.")
    elif resume is not None:
        check_run_root(resume)
    if resume is not None:
        if not unfinished_runs(experiments, resume):  # (refuses a changed config first)
            print(f"every run of {resume} is complete; nothing to resume")
            return None
        print(f"resuming {resume}", file=sys.stderr)
    else:
        check_output(first, invocation.output)  # before Ray starts
    started = start_alongside(experiments.values(),
                              lambda: _import_engine_and_prepare(experiments,
                                                                 invocation.data_root),
                              then=lambda: _prestart_actors(experiments))
    from raysim.engine.interrupt import STOP
    from raysim.engine.runner import run_experiments

    preloading = ThreadPoolExecutor(1, thread_name_prefix="raysim-preload")
    preloaded = preloading.submit(preload)
    preloading.shutdown(wait=False)
    on_runs_started()
    try:
        with STOP.handling_signals():  # the first Ctrl-C stops at round boundaries
            outcomes = run_experiments(
                experiments, data_root=invocation.data_root, output=invocation.output,
                progress=invocation.progress, resume=resume, labels=invocation.labels,
                started_at=invocation.started_at, started=started, invocation=invocation.record)
    except BaseException:
        if started.owns_ray:  # (on a warm cluster: its idle actors stay warm for the next)
            stop_ray()
        raise
    root = outcomes[0].run_dir.parent
    if "" not in experiments:
        root = root.parent
    # the closing work (e.g. the summary and its plot) runs while Ray shuts down
    with ThreadPoolExecutor(1, thread_name_prefix="raysim-closing") as executor:
        closed = executor.submit(lambda: closing(outcomes, root, preloaded.result()))
        if started.owns_ray:
            stop_ray()
        return Invoked(outcomes, root, closed.result())


@contextmanager
def ray_for(experiments: dict[str, ExperimentConfig]) -> Iterator[list[str]]:
    """Ray, up for these experiments while the block runs (a warm cluster is joined, a local
    Ray started with their resources), then stopped if the block started it; yields the
    start-up notices."""
    import ray

    from raysim.engine.interrupt import STOP
    from raysim.engine.launch.local_ray import ensure_ray

    notices: list[str] = []
    ours = not ray.is_initialized()  # a Ray that was up before (a notebook's) stays up
    try:
        for config in experiments.values():
            notices += [n for n in ensure_ray(config, runs=list(experiments.values()))
                        if n not in notices]
        STOP.terminate_as_interrupt()  # Ray's own SIGTERM handler would exit at once
        yield notices
    finally:
        if ours:
            stop_ray()


def recorded_options(root: str) -> dict[str, Any]:
    """The options the first command of a run root was given (``--variant``, ``--set``, ...),
    as it stored them; empty when it stored none."""
    import json

    from raysim.engine.resume import INVOCATION
    from raysim.errors import ConfigError

    path = Path(root) / INVOCATION
    if not path.is_file():
        return {}
    try:
        stored = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        stored = error
    if not isinstance(stored, dict):
        raise ConfigError(
            f"Cannot resume {root}: its record of the first command ({path}) is not a JSON "
            f"object ({stored}). Give every option of the original run again (--variant, "
            "--set, --data-root, --plugin) and remove or repair that file; nothing was run.")
    return stored


def latest_run_root(config: ExperimentConfig, output: str | None) -> Path:
    """The newest run root of ``config`` under ``output`` (what a bare ``--resume`` continues)."""
    from raysim.engine.resume import latest_run_root as latest

    return latest(config, output)


def startup_phases(manifest: dict[str, Any]) -> dict[str, float] | None:
    """A run's start-up phases (imports, data, Ray, workers, first round) from its manifest."""
    from raysim.engine.startup_phases import startup_phases as phases

    return phases(manifest)


def run_experiments(experiments: dict[str, ExperimentConfig], **options: Any
                    ) -> list[RunOutcome]:
    """Run labelled experiments on the Ray this process started or joined, without the
    command's start-up around them (``raysim estimate``'s probes); ``options`` as
    :func:`raysim.engine.runner.run_experiments` takes them."""
    from raysim.engine.runner import run_experiments as run

    return run(experiments, **options)


def concurrent_runs(configs: Iterable[ExperimentConfig]) -> int:
    """How many runs of ``configs`` fit on this process's Ray at once."""
    from raysim.engine.pool.run_actors import concurrent_runs as fitting

    return fitting(configs)


def uses_gpus(config: ExperimentConfig) -> bool:
    """Whether a run of ``config`` gets GPUs on this process's Ray."""
    from raysim.engine.pool.run_actors import uses_gpus as gets_gpus

    return gets_gpus(config)


def stop_ray() -> None:
    """Shut Ray down; on a warm cluster, first hand this process's idle actors to its keeper
    (the next invocation takes them over)."""
    from raysim.engine.launch.local_ray import joined_cluster, stop_local_ray

    if joined_cluster() is not None:
        from raysim.engine.pool.shared_actors import POOL

        POOL.release()
    stop_local_ray()


def _import_engine_and_prepare(experiments: dict[str, ExperimentConfig],
                               data_root: str | None) -> dict[str, Any]:
    """The data of every experiment (runs in a thread while Ray starts). The engine and torch
    are imported in this thread while a second one reads each distinct dataset's file once
    (numpy only: decompressing an npz releases the GIL); :func:`raysim.preparation.prepare`
    raises a failed read's error after the config's own checks, as when it reads itself."""
    from raysim.data import load_dataset

    keys = {label: config.dataset.model_dump_json() for label, config in experiments.items()}
    distinct = {keys[label]: config.dataset for label, config in experiments.items()}
    with ThreadPoolExecutor(1, thread_name_prefix="raysim-read") as reader:
        reads = {key: reader.submit(load_dataset, dataset, data_root)
                 for key, dataset in distinct.items()}
        import raysim.engine.runner  # noqa: F401 (imported here, beside Ray's start)
        from raysim.preparation import prepare
    return {label: prepare(config, data_root, reads[keys[label]].result)
            for label, config in experiments.items()}


def _prestart_actors(experiments: dict[str, ExperimentConfig]) -> None:
    from raysim.engine.pool.run_actors import prestart_actors

    prestart_actors(experiments)
