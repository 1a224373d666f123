"""Every named benchmark workload is a valid raysim config, and every method it uses has a
plain loop to be measured against: a workload or a config key renamed without the other
fails here, not in a benchmark run on a GPU machine."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from raysim.configuration.experiment import parse_config

BENCHMARKS = Path(__file__).resolve().parents[1] / "experiments" / "benchmarks"


@pytest.fixture(scope="module")
def modules():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield {name: importlib.import_module(name)
               for name in ("workloads", "harness", "baselines")}
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_every_workload_parses_on_every_engine(modules, tmp_path):
    workloads, harness = modules["workloads"], modules["harness"]
    for name, spec in workloads.WORKLOADS.items():
        dataset = ({"name": "synthetic"} if spec.data == "synthetic" else
                   {"name": spec.data, "size": spec.size, "root": str(tmp_path),
                    "download": False})
        for engine in [*harness.CPU_ENGINES.values(), *harness.GPU_ENGINES.values()]:
            config = parse_config(harness.bench_config(name, dataset, 3, engine))
            assert config.training.rounds == 3
            assert config.algorithm.name == spec.algorithm["name"]
        assert spec.algorithm["name"] in modules["baselines"].BASELINES, name


def test_every_script_imports(modules):
    """The suite's scripts and modules import (the peers' own sides need Flower or
    pfl-research and run in their environments)."""
    before = set(sys.modules)
    try:
        for script in sorted(BENCHMARKS.glob("*.py")):
            if script.stem not in ("flower_workload", "pfl_workload"):
                importlib.import_module(script.stem)
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def test_each_task_round_runs_three_ways_on_the_cpu(modules, tmp_path):
    """task_rounds.py's workloads: the runtime's loop and vectorised path (the path it asks
    for, not a fallback) and the plain loop each run a round of every workload."""
    import torch

    task_rounds = importlib.import_module("task_rounds")
    cpu = torch.device("cpu")
    for name in task_rounds.WORKLOADS:
        config = task_rounds.workload_config(name, tmp_path / name)
        for one_round in (task_rounds.raysim_round(config, "never", cpu),
                          task_rounds.raysim_round(config, "always", cpu),
                          task_rounds.plain_round(config, cpu)):
            one_round()
    assert task_rounds.device_label(cpu).startswith("cpu-")
