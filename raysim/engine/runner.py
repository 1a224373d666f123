"""Start (or join) Ray, launch one Driver per seed and follow their progress."""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tqdm import tqdm

from raysim.algorithms import ALGORITHMS
from raysim.algorithms.base import RunContext
from raysim.config import ExperimentConfig
from raysim.data import ArrayDataset, Partition, load_dataset, make_partition
from raysim.engine.driver import Driver, RunSpec
from raysim.engine.weights import get_weights
from raysim.engine.worker import WorkerSetup
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.results.manifest import git_commit, package_versions, write_manifest
from raysim.seeding import torch_generator


@dataclass
class RunOutcome:
    """How one seed's run ended."""

    seed: int
    run_dir: Path
    final: dict[str, Any] | None
    error: str | None = None


def initial_weights(config: ExperimentConfig, dataset: ArrayDataset, seed: int) -> dict:
    """The initial global model, drawn from the stream (seed, "init")."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch_generator(seed, "init").initial_seed()))
        return get_weights(build_model(config.model, dataset.info))


def pooled(partition: Partition, num_test: int) -> Partition:
    """The union of all clients' training data as a single client (centralized training)."""
    return Partition([np.sort(np.concatenate(partition.train))], [np.arange(num_test)])


def ensure_ray(config: ExperimentConfig) -> list[str]:
    """Connect to the configured cluster or start a local one; returns one-line notices."""
    if not ray.is_initialized():
        if config.engine.address:
            ray.init(address=config.engine.address, logging_level="ERROR",
                     log_to_driver=False)
        else:
            ray.init(num_cpus=os.cpu_count(), logging_level="ERROR", log_to_driver=False,
                     include_dashboard=False)
    resources = ray.cluster_resources()
    engine, notices = config.engine, []
    needed_cpus = engine.num_workers * engine.cpus_per_worker
    if needed_cpus > resources.get("CPU", 0) + 1e-9:
        raise ConfigError(
            f"Invalid config field `engine.num_workers` = {engine.num_workers}: "
            f"{engine.num_workers} workers x {engine.cpus_per_worker} CPUs need {needed_cpus:g} "
            f"CPUs, but the Ray cluster has {resources.get('CPU', 0):g}. Lower engine.num_workers "
            "or engine.cpus_per_worker, or add nodes to the cluster."
        )
    if engine.gpus_per_worker > 0 and resources.get("GPU", 0) == 0:
        notices.append(f"No GPU in the Ray cluster: the {engine.num_workers} workers run on CPU "
                       f"(engine.gpus_per_worker={engine.gpus_per_worker} ignored).")
    elif engine.gpus_per_worker * engine.num_workers > resources.get("GPU", 0) + 1e-9:
        raise ConfigError(
            f"Invalid config field `engine.gpus_per_worker` = {engine.gpus_per_worker}: "
            f"{engine.num_workers} workers need {engine.gpus_per_worker * engine.num_workers:g} "
            f"GPUs, but the cluster has {resources.get('GPU', 0):g}. Use a smaller fraction "
            "(e.g. 0.25 packs four workers per GPU) or fewer workers."
        )
    return notices


def prepare(config: ExperimentConfig, data_root: str | None
            ) -> tuple[ArrayDataset, dict[int, Partition]]:
    """Load the data, build every seed's partition and the model once: all input errors are
    raised here, before Ray starts."""
    dataset = load_dataset(config.dataset, data_root)
    build_model(config.model, dataset.info)
    partitions = {
        seed: make_partition(dataset.train_y, dataset.test_y, config.partition,
                             dataset.info.num_classes, seed)
        for seed in config.seeds
    }
    algorithm_class = ALGORITHMS[config.algorithm.name]
    num_clients = 1 if algorithm_class.pooled else config.partition.num_clients
    algorithm_class(config.algorithm, run_context(config, dataset, config.seeds[0], num_clients))
    return dataset, partitions


def run_context(config: ExperimentConfig, dataset: ArrayDataset, seed: int,
                num_clients: int) -> RunContext:
    """What the algorithm of one run knows about it."""
    return RunContext(seed, dataset.info, config.model, config.training, num_clients,
                      config.clients_per_round)


def new_run_root(config: ExperimentConfig, output: str | None) -> Path:
    """A fresh directory ``<output>/<name>-<timestamp>`` (never overwrites earlier results)."""
    parent = Path(output or config.output)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = parent / f"{config.name}-{stamp}"
    suffix = 1
    while root.exists():
        root = parent / f"{config.name}-{stamp}-{suffix}"
        suffix += 1
    return root


def run_experiment(config: ExperimentConfig, *, data_root: str | None = None,
                   output: str | None = None, progress: bool = True) -> list[RunOutcome]:
    """Run every seed of an experiment concurrently; results stream to Parquet under the run
    root, one directory per seed."""
    dataset, partitions = prepare(config, data_root)
    notices = ensure_ray(config)
    for notice in notices:
        print(notice, file=sys.stderr)
    use_gpus = config.engine.gpus_per_worker > 0 and not notices
    algorithm_class = ALGORITHMS[config.algorithm.name]
    arrays = {name: ray.put(getattr(dataset, name))
              for name in ("train_x", "train_y", "test_x", "test_y")}
    root = new_run_root(config, output)
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    drivers, run_dirs = {}, {}
    for seed in config.seeds:
        partition = partitions[seed]
        run_dir = root / f"seed_{seed}"
        run_dir.mkdir(parents=True)
        partition.save(run_dir / "partition.parquet")
        if algorithm_class.pooled:
            partition = pooled(partition, len(dataset.test_y))
        write_manifest(run_dir, {
            "name": config.name, "seed": seed, "algorithm": config.algorithm.name,
            "status": "running", "started": time.time(), "host": socket.gethostname(),
            "config": config.model_dump(mode="json"), "versions": package_versions(),
            "git_commit": git_commit(), "notices": notices, "dataset": dataset.info.name,
        })
        context = run_context(config, dataset, seed, partition.num_clients)
        setup = WorkerSetup(algorithm_class, config.algorithm, context, arrays, partition,
                            initial_weights(config, dataset, seed), config.evaluation.batch_size,
                            threads=max(1, math.floor(config.engine.cpus_per_worker)),
                            vectorize=config.engine.vectorize)
        spec = RunSpec(str(run_dir), setup, config.training.rounds, config.engine,
                       config.evaluation, use_gpus)
        drivers[seed] = ray.remote(Driver).options(
            num_cpus=0, max_concurrency=2, scheduling_strategy=here).remote(spec)
        run_dirs[seed] = run_dir
    futures = {seed: driver.run.remote() for seed, driver in drivers.items()}
    _follow(drivers, futures, config.training.rounds, progress)
    outcomes = []
    for seed, future in futures.items():
        try:
            outcomes.append(RunOutcome(seed, run_dirs[seed], ray.get(future)))
        except ray.exceptions.RayError as error:
            cause = getattr(error, "cause", None) or error
            outcomes.append(RunOutcome(seed, run_dirs[seed], None,
                                       f"{type(cause).__name__}: {cause}"))
    return outcomes


def _follow(drivers: dict[int, Any], futures: dict[int, Any], rounds: int, show: bool) -> None:
    bars = {seed: tqdm(total=rounds, desc=f"seed {seed}", position=i, unit="round",
                       disable=not show, dynamic_ncols=True, leave=True)
            for i, seed in enumerate(drivers)}
    pending = set(futures)
    while pending:
        ready, _ = ray.wait([futures[s] for s in pending], timeout=0.5,
                            num_returns=len(pending))
        done = {s for s in pending if futures[s] in ready}
        for seed in pending:
            try:
                state = ray.get(drivers[seed].progress.remote(), timeout=5)
            except ray.exceptions.RayError:
                continue
            bar = bars[seed]
            bar.update(state["round"] - bar.n)
            accuracy = state.get("accuracy", math.nan)
            bar.set_postfix_str(f"{state['status']}" + (
                "" if math.isnan(accuracy) else f", acc {accuracy:.3f}"), refresh=True)
        pending -= done
    for bar in bars.values():
        bar.close()
