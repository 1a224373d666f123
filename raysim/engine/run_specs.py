"""What a run's driver is given, and the run directory's manifest and partition it starts
from (a new run writes them; a resumed one notes its resumption)."""

from __future__ import annotations

import math
import socket
import time
from pathlib import Path
from typing import Any

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import ExperimentConfig
from raysim.data import ArrayDataset, Partition
from raysim.engine.pool.run_actors import uses_gpus
from raysim.engine.run.driver import RunSpec
from raysim.engine.run.worker import WorkerSetup
from raysim.preparation import initial_weights, pooled, run_context
from raysim.results.manifest import (
    MANIFEST,
    git_commit,
    package_versions,
    read_manifest,
    update_manifest,
    write_manifest,
)
from raysim.training.evaluation import test_sources


def run_spec(config: ExperimentConfig, dataset: ArrayDataset, partition: Partition,
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
            "name": config.name, "seed": seed,
            "algorithm": ALGORITHMS[config.algorithm.name].describe(config.algorithm),
            "status": "running", "started": time.time(), "host": socket.gethostname(),
            "config": config.model_dump(mode="json"), "versions": package_versions(),
            "git_commit": git_commit(), "notices": notices, "dataset": dataset.info.name,
            **extra,
        })
    client_test_shares = partition.test
    sources = test_sources(len(dataset.test_y), partition.test, partition.unseen)
    validation_index, validation_sources = partition.validation_sources()
    if algorithm_class.pooled:
        full = getattr(config.algorithm, "data", "clients") == "full"
        whole = len(dataset.train_y) if dataset.public_from is None else dataset.public_from
        partition = pooled(partition, len(dataset.test_y), whole if full else None)
    context = run_context(config, dataset, seed, partition.num_clients)
    setup = WorkerSetup(algorithm_class, config.algorithm, context, arrays, partition,
                        initial_weights(config, dataset, seed), config.evaluation.batch_size,
                        threads=max(1, math.floor(config.engine.cpus_per_worker)),
                        vectorize=config.engine.vectorize,
                        compile_step=config.engine.compile_step,
                        per_client_loop=algorithm_class.per_client_loop,
                        test_sources=sources,
                        membership_audit=config.evaluation.membership_audit,
                        gpu_fraction=config.engine.gpus_per_worker,
                        validation_index=validation_index if len(validation_index) else None,
                        validation_sources=validation_sources)
    use_gpus = uses_gpus(config)
    label = run_dir.parent.name if run_dir.parent.name != root.name else ""
    return RunSpec(str(run_dir), setup, config.training.rounds, config.engine,
                   config.evaluation, use_gpus, resume=resume,
                   client_test_shares=client_test_shares, logging=config.logging,
                   live_names=(str(root), config.name, f"{label + '/' if label else ''}"
                               f"{run_dir.name}"),
                   params=config.model_dump(mode="json") if (
                       config.logging.mlflow or config.logging.tensorboard) else {})
