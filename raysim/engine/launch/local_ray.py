"""An invocation's start-up, without torch: Ray started (or joined) in this thread while the
engine's imports and the data preparation run in a background thread.

On a small machine the three take seconds each (Ray's GCS and raylet, importing torch, loading
and partitioning the data); Ray's start mostly waits for its own processes, so doing them side
by side saves most of the shorter one. ``raysim run`` and ``raysim sweep`` start this way
(:func:`start_alongside`); :func:`raysim.engine.runner.run_experiments` alone starts Ray itself.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from raysim.configuration.experiment import ExperimentConfig
from raysim.engine.launch.cluster_probe import accepts_connections, gcs_answers, probe_hint
from raysim.engine.launch.cpu_slots import CpuSlots
from raysim.engine.launch.parallel_runs import processes_at_start
from raysim.engine.launch.ray_internals import (
    gpus_ray_will_detect,
    loopback_only,
    own_session,
    prestarting,
    ray_address_file,
    without_unused_ray_services,
)
from raysim.engine.launch.warm_cluster import (
    ClusterInfo,
    raylet_environment,
    running_cluster,
)
from raysim.engine.launch.watchdog import start_watchdog
from raysim.errors import ConfigError, RunError
from raysim.plugins import plugin_directories, plugin_sources


@dataclass
class Started:
    """What :func:`start_alongside` produced: the loader's result (the prepared data of every
    experiment), Ray's notices and the start-up timestamps for the manifests."""

    prepared: Any
    notices: list[str]
    phases: dict[str, float] = field(default_factory=dict)
    owns_ray: bool = False
    """Ray was started (or joined) here, not before: the invocation shuts it down."""


def start_alongside(experiments: Iterable[ExperimentConfig], load: Callable[[], Any],
                    then: Callable[[], None] | None = None) -> Started:
    """Start (or join) Ray for ``experiments`` in this thread while ``load()`` runs in a
    background thread; then ``then()`` (e.g. start the first runs' actors, which import torch
    while the data is still loading) and wait for ``load``.

    A failure of ``load`` (e.g. a missing data file) is raised before waiting for CPUs that
    another raysim invocation holds, and otherwise as soon as Ray is up.
    """
    phases = {"ray_started_at": time.time()}
    ray_was_running = ray.is_initialized()
    CPU_WAIT.seconds = 0.0

    def timed_load() -> tuple[Any, float]:
        return load(), time.time()

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="raysim-load") as executor:
            loading = executor.submit(timed_load)
            notices: list[str] = []
            configs = list(experiments)
            if not ray_was_running:
                say_starting("starting Ray (the data loads alongside)")
            for config in configs:
                notices += [n for n in ensure_ray(config, loading.result, runs=configs)
                            if n not in notices]
            phases["ray_ready_at"] = time.time()
            phases["cpu_wait_s"] = CPU_WAIT.seconds
            if _JOINED is not None:
                phases["joined"] = 1.0
            if loading.done():
                loading.result()  # a failed load is reported before any actor starts
            if then is not None:
                say_starting(f"Ray ready after {time.time() - phases['ray_started_at']:.1f} s; "
                             "starting the workers")
                then()
            if not loading.done():
                say_starting("waiting for the data to load")
            prepared, phases["prepared_at"] = loading.result()
    except BaseException:
        if not ray_was_running:  # nothing ran: leave no Ray (and no CPU slots) behind
            stop_local_ray()
        raise
    return Started(prepared, notices, phases, owns_ray=not ray_was_running)


def local_ray_failed(error: BaseException) -> str:
    """The paragraph for a local Ray that did not start (Ray's own error, its last line)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    said = lines[-1] if lines else type(error).__name__
    return (f"Ray's local node did not start ({type(error).__name__}: {said[:300]}). Ray gives "
            "its processes a fixed time to start, which a heavily loaded machine can exceed; "
            "nothing was run or written. Run the command again when the load drops (`uptime` "
            "shows it), or join a Ray started beforehand (`raysim cluster start`, or `ray "
            "start --head` and --set engine.address=auto).")


def say_starting(line: str) -> None:
    """What start-up is waiting for, as it waits, on a terminal (logs get the phases' times
    at the end)."""
    if sys.stderr.isatty():
        print(f"start-up: {line}...", file=sys.stderr, flush=True)


def stop_local_ray() -> None:
    """Shut Ray down (on a warm cluster: disconnect; the caller hands its idle actors to the
    cluster's keeper first, :func:`raysim.engine.invocation.stop_ray`) and give back the CPU
    slots this process holds."""
    global _JOINED
    if ray.is_initialized():
        ray.shutdown()
    _JOINED = None
    if _SLOTS is not None:
        _SLOTS.release()


def joined_cluster() -> ClusterInfo | None:
    """The warm cluster (``raysim cluster start``) this process joined, if it did."""
    return _JOINED if ray.is_initialized() else None


@contextmanager
def _package_directory() -> Iterator[None]:
    """Run the block in the directory that holds the raysim package. Ray puts the driver's
    working directory on every worker's sys.path ahead of site-packages, so a directory
    named ``raysim`` beside the user (e.g. the clone, seen from its parent) would shadow the
    package in the workers."""
    before = os.getcwd()
    os.chdir(Path(__file__).resolve().parents[2])
    try:
        yield
    finally:
        os.chdir(before)


@contextmanager
def _raylet_settings(settings: Mapping[str, str]) -> Iterator[None]:
    """Have the Ray started in the block read ``settings`` (:func:`raylet_environment`): its
    raylet reads them from the environment when it starts. With Ray's ``preload_python_modules``
    its worker processes import torch and raysim as they start, before any actor is asked for,
    so a worker actor placed on one is ready in a fraction of the time; with
    ``enable_worker_prestart`` they start as soon as the raylet is up, while the invocation
    still starts up (imports, data, Ray's agents)."""
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _python_path(plugins: Sequence[str]) -> dict[str, str]:
    """``PYTHONPATH`` for a local Ray's worker processes: the plug-ins' directories first."""
    if not plugins:
        return {}
    existing = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {"PYTHONPATH": os.pathsep.join(dict.fromkeys([*plugin_directories(plugins),
                                                         *existing]))}


_SLOTS: CpuSlots | None = None
"""The machine's CPU slots this process holds while its local Ray runs."""

@dataclass
class _CpuWait:
    """How long this process's start waited for CPUs another raysim invocation held (a
    start-up phase of its own, not Ray's start)."""

    seconds: float = 0.0


CPU_WAIT = _CpuWait()

_JOINED: ClusterInfo | None = None
"""The warm cluster this process joined instead of starting a local Ray."""


RAY_CURRENT_CLUSTER = ray_address_file()
"""Where `ray start` records the address of the cluster it started on this machine."""


def cluster_to_join(configured: str | None, notices: list[str] | None = None
                    ) -> tuple[str, str] | None:
    """The Ray cluster a run joins, with where its address came from, or None to start a
    local Ray, following Ray's conventions: ``engine.address`` ("local" forces a local Ray,
    "auto" is the `ray start` cluster on this machine), else ``RAY_ADDRESS``, else a live
    cluster that `ray start` started on this machine. A record whose GCS does not answer
    (a dead cluster, or another program on its port) is ignored, with a line in ``notices``.
    The warm raysim cluster is found separately (``running_cluster``)."""
    if configured == "local":
        return None
    if configured and configured != "auto":
        return configured, "engine.address"
    from_env = os.environ.get("RAY_ADDRESS", "").strip()
    if from_env and from_env not in ("auto", "local"):
        return from_env, "RAY_ADDRESS"
    if from_env == "local":
        return None
    recorded = _recorded_cluster(notices if notices is not None else [])
    if recorded is not None and (running_cluster() is None or configured == "auto"):
        return recorded, f"`ray start` on this machine, {RAY_CURRENT_CLUSTER}"
    if configured == "auto" or from_env == "auto":
        raise ConfigError(
            "engine.address (or RAY_ADDRESS) is `auto`, but no running Ray cluster was found on "
            f"this machine ({RAY_CURRENT_CLUSTER} is missing or names a cluster that does not "
            "answer). Start one with `ray start --head`, give its address (host:port), or "
            "leave engine.address unset to run on a Ray of this process's own.")
    return None


def _recorded_cluster(notices: list[str]) -> str | None:
    """The address in `ray start`'s record on this machine when a Ray GCS answers there."""
    try:
        address = RAY_CURRENT_CLUSTER.read_text().strip()
    except OSError:
        return None
    if not address:
        return None
    if gcs_answers(address):
        return address
    notices.append(f"Ignored {RAY_CURRENT_CLUSTER}: it names a Ray cluster at {address} that "
                   f"does not answer (no Ray GCS there; {probe_hint()}), so this "
                   "run starts a Ray of its own; `ray stop` removes the stale record.")
    return None


def _check_reachable(address: str, source: str) -> None:
    """Fail within the probe's bound, with one paragraph, on a host:port where no Ray GCS
    answers (``ray.init`` would retry for minutes)."""
    if ":" in address and "://" not in address and not gcs_answers(address):
        reason = ("nothing accepts connections there" if not accepts_connections(address)
                  else f"something listens there, but no Ray GCS answered ({probe_hint()})")
        raise ConfigError(_unreachable(address, source, reason))


def _unreachable(address: str, source: str, reason: str) -> str:
    return (f"Cannot join the Ray cluster at {address} (from {source}): {reason}. Start the "
            "cluster (`ray start --head --port=PORT` on its head node), correct the address "
            "(host:port of the head's GCS), or run on a Ray of this process's own with "
            "`--set engine.address=local` (or unset RAY_ADDRESS).")


def _start_ray(config: ExperimentConfig, before_waiting: Callable[[], object] | None = None,
               runs: Sequence[ExperimentConfig] = ()) -> list[str]:
    """Join the configured cluster, or start a local Ray with the CPUs no other raysim
    invocation on this machine holds (waiting for enough of them, after ``before_waiting()``),
    which starts the worker processes that the first of ``runs`` (default: ``config``'s)
    use ahead of time; returns notices."""
    global _SLOTS, _JOINED
    notices: list[str] = []
    plugins = list(dict.fromkeys(name for run in (runs or [config]) for name in run.plugins))
    # a joined cluster's workers get the plug-ins' source with the job (they may not share
    # this machine's files); a local Ray's workers find them on PYTHONPATH
    shipped: dict[str, Any] = (
        {"runtime_env": {"py_modules": plugin_sources(plugins)}} if plugins else {})
    target = cluster_to_join(config.engine.address, notices)
    if target is not None:
        address, source = target
        _check_reachable(address, source)
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False,
                     **shipped)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise ConfigError(_unreachable(address, source, str(error))) from None
        resources = ray.cluster_resources()
        return [*notices, f"Joined the Ray cluster at {address} ({source}): "
                f"{resources.get('CPU', 0):g} "
                f"CPUs, {resources.get('GPU', 0):g} GPUs on {len(ray.nodes())} node(s); "
                "`engine.address: local` runs on a Ray of this process's own instead."]
    warm = running_cluster() if config.engine.address != "local" else None
    if warm is not None:
        try:
            with loopback_only():  # (it listens on loopback: Ray would take the network's)
                ray.init(address=warm.address, logging_level=logging.ERROR,
                         log_to_driver=False, **shipped)
        except ConnectionError as error:
            raise ConfigError(
                f"Cannot join the warm raysim cluster at {warm.address} ({error}). It uses "
                "Ray's token authentication: set RAY_AUTH_MODE=token before Ray is imported "
                "(the raysim command does), or stop the cluster with `raysim cluster stop` to "
                "run on a Ray of this process's own.") from None
        _JOINED = warm
        return [*notices, f"Joined the warm raysim cluster at {warm.address} ({warm.cpus} CPUs, started "
                "with `raysim cluster start`; `raysim cluster stop` ends it)."]
    total = os.cpu_count() or 1
    if _SLOTS is None:
        _SLOTS = CpuSlots(total)
    needed = math.ceil(config.engine.num_workers * config.engine.cpus_per_worker)
    held = _SLOTS.held
    if held == 0:
        try:
            held = _SLOTS.acquire(needed, timeout=0, notify=lambda line: None)
        except TimeoutError:
            if before_waiting is not None:
                before_waiting()  # e.g. report a missing data file before a long wait
            waiting_since = time.time()
            held = _SLOTS.acquire(needed)
            CPU_WAIT.seconds += time.time() - waiting_since
    prestart = processes_at_start(runs or [config], held, gpus_ray_will_detect())
    with (_raylet_settings({**raylet_environment(), **_python_path(plugins)}),
          without_unused_ray_services(),
          prestarting(prestart), own_session(), loopback_only()):
        # address="local": a new Ray of this process's own, whatever RAY_ADDRESS or a
        # stale /tmp/ray/ray_current_cluster of a dead cluster says
        try:
            ray.init(address="local", num_cpus=held, logging_level=logging.ERROR,
                     log_to_driver=False, include_dashboard=False)
        except Exception as error:  # (Ray's own start-up: timeouts under load, a full /tmp)
            raise RunError(local_ray_failed(error)) from None
    start_watchdog()  # removes what Ray leaves if this process is SIGKILLed
    if held < total:
        return [*notices, f"Another raysim invocation on this machine holds {total - held} of its {total} "
                f"CPUs: this one runs with the other {held}."]
    return notices


def ensure_ray(config: ExperimentConfig, before_waiting: Callable[[], object] | None = None,
               runs: Sequence[ExperimentConfig] = ()) -> list[str]:
    """Connect to the configured cluster or start a local one; returns one-line notices.
    ``before_waiting``: called before waiting for CPUs that another invocation holds;
    ``runs``: the invocation's configs, whose first runs' processes a local Ray starts
    ahead of time (default: ``config``'s)."""
    notices: list[str] = []
    if not ray.is_initialized():
        with _package_directory():
            notices = _start_ray(config, before_waiting, runs)
    resources = ray.cluster_resources()
    engine = config.engine
    needed_cpus = engine.num_workers * engine.cpus_per_worker
    if needed_cpus > resources.get("CPU", 0) + 1e-9:
        raise ConfigError(
            f"Invalid config field `engine.num_workers` = {engine.num_workers}: "
            f"{engine.num_workers} workers x {engine.cpus_per_worker} CPUs need {needed_cpus:g} "
            f"CPUs, but the Ray cluster has {resources.get('CPU', 0):g}. Lower engine.num_workers "
            "or engine.cpus_per_worker, or add nodes to the cluster"
            + (" (this is the warm raysim cluster: `raysim cluster stop`, then `raysim cluster "
               "start --cpus N` gives it more)." if _JOINED is not None else ".")
        )
    largest_node = max((node.get("Resources", {}).get("GPU", 0) for node in ray.nodes()
                        if node.get("Alive", True)), default=0)
    if resources.get("GPU", 0) > 0 and engine.gpus_per_worker > largest_node + 1e-9:
        raise ConfigError(
            f"Invalid config field `engine.gpus_per_worker` = {engine.gpus_per_worker}: a worker "
            f"runs on one node, and the largest node of this cluster has {largest_node:g} GPUs, "
            "so such a worker could never be scheduled. Use a fraction of one GPU (e.g. 0.25) or "
            f"at most {largest_node:g}."
        )
    if engine.gpus_per_worker > 0 and resources.get("GPU", 0) == 0:
        workers = "the worker runs" if engine.num_workers == 1 else \
            f"the {engine.num_workers} workers run"
        notices.append(f"No GPU in the Ray cluster: {workers} on CPU "
                       f"(engine.gpus_per_worker={engine.gpus_per_worker} ignored).")
    elif engine.gpus_per_worker * engine.num_workers > resources.get("GPU", 0) + 1e-9:
        raise ConfigError(
            f"Invalid config field `engine.gpus_per_worker` = {engine.gpus_per_worker}: "
            f"{engine.num_workers} workers need {engine.gpus_per_worker * engine.num_workers:g} "
            f"GPUs, but the cluster has {resources.get('GPU', 0):g}. Use a smaller fraction "
            "(e.g. 0.25 packs four workers per GPU) or fewer workers."
        )
    return notices
