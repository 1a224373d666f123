"""Shared fixtures: one local Ray instance for the tests that need it, config builders."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The suite's own CPU slots: `raysim run` subprocesses of the tests neither wait for nor take the
# slots of experiments the user runs on this machine at the same time.
os.environ["RAYSIM_CPU_SLOTS"] = tempfile.mkdtemp(prefix="raysim-test-cpu-slots-")
os.environ["RAYSIM_CACHE"] = tempfile.mkdtemp(prefix="raysim-test-cache-")  # MD5s of test files
os.environ["RAYSIM_CLUSTER_DIR"] = tempfile.mkdtemp(prefix="raysim-test-cluster-")  # no user cluster

REAL_MEDMNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "medmnist"


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance with 4 logical CPUs and 1 logical GPU (for placement tests)."""
    import ray

    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield ray
    ray.shutdown()


def quickstart_raw(**sections: Any) -> dict[str, Any]:
    """The quickstart config as a dict with one seed: sections updated, ``model`` and
    ``algorithm`` replaced."""
    import yaml

    raw = yaml.safe_load((Path(__file__).parents[1] / "experiments" / "quickstart.yaml").read_text())
    raw["seeds"] = [0]
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict) and key not in (
                "model", "algorithm"):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


def small_federation(**sections: Any) -> dict[str, Any]:
    """12 clients of breast-cancer with an MLP, FedAvg, 4 rounds, 2 workers: the runs of the
    privacy and system tests (``sections`` replace or add top-level sections)."""
    return {"name": "small", "dataset": {"name": "breast-cancer"},
            "partition": {"scheme": "iid", "num_clients": 12},
            "model": {"name": "mlp", "hidden": [16]}, "algorithm": {"name": "fedavg"},
            "training": {"rounds": 4, "local_epochs": 1, "batch_size": 8,
                         "clients_per_round": 6, "optimizer": {"name": "sgd", "lr": 0.1}},
            "evaluation": {"every": 1}, "seeds": [0],
            "engine": {"num_workers": 2, "cpus_per_worker": 1}, **sections}


def run_tables(raw: dict[str, Any], output: Path, *tables: str) -> tuple[Any, ...]:
    """Run ``raw`` (its first seed) into ``output`` and load the named results tables."""
    from raysim.config import parse_config
    from raysim.engine.runner import run_experiment
    from raysim.results import load

    outcome = run_experiment(parse_config(raw), output=str(output), progress=False)[0]
    assert outcome.error is None, outcome.error
    return tuple(load(outcome.run_dir, table) for table in tables)
