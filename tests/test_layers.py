"""The package's layers only point down: cli -> sweep/engine/estimate (Ray) ->
config/preparation/system -> algorithms -> training/condensation/privacy (Ray-free) -> models ->
data/results -> schema/errors/seeding. An import running back up (type-only imports included) fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raysim"

LAYERS = {  # higher imports lower or equal, never the other way
    "cli": 8, "__main__": 8,
    "sweep": 7, "engine": 7, "estimate": 7,
    "config": 6, "preparation": 6, "config_reference": 6, "system": 6,
    "algorithms": 5,
    "training": 4, "condensation": 4, "privacy": 4,
    "models": 3,
    "data": 2, "results": 2,
    "schema": 1, "errors": 1, "seeding": 1, "lazy": 1, "cache": 1,
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "raysim"


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "raysim":
                found.extend((node.lineno, f"raysim.{a.name}") for a in node.names)
            elif node.module.startswith("raysim."):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names
                         if a.name.startswith("raysim."))
    return found


def test_every_module_belongs_to_a_layer():
    layers = {_layer(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts))
              for p in PACKAGE.rglob("*.py")} - {"raysim", "__init__"}
    assert layers <= set(LAYERS), layers - set(LAYERS)


def test_imports_only_point_down():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        here = _layer(module)
        if here not in LAYERS:
            continue  # raysim/__init__.py
        for line, imported in _imports(path):
            there = _layer(imported)
            if there in LAYERS and LAYERS[there] > LAYERS[here]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({here}) imports "
                              f"{imported} ({there})")
    assert not upward, "imports running back up:\n" + "\n".join(upward)


def _printed_by_python(code: str) -> str:
    """What a fresh interpreter prints running ``code`` in the repository root."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent).stdout.strip()


def test_config_algorithms_and_training_load_without_ray():
    out = _printed_by_python(
        "import sys, raysim.config, raysim.preparation, raysim.training.runtime, "
        "raysim.engine.round_loop, raysim.engine.round_callbacks; "
        "from raysim.algorithms import ALGORITHMS; from raysim.models import MODELS; "
        "print(sorted(m for m in ('ray',) if m in sys.modules))")
    assert out == "[]"


def test_pooled_processes_preload_neither_pandas_nor_sklearn_nor_dynamo():
    # every pooled process (worker or driver host) imports Ray's preload list at start;
    # pandas (~0.4 s of CPU), scikit-learn (~0.9 s) and torch._dynamo (~1.1 s) would cost each
    # of them that much again: only client workers need torch._dynamo (they import it when
    # created), only a driver reads tables or computes metrics
    out = _printed_by_python(
        "import importlib, sys; from raysim.engine.cluster import WORKER_MODULES; "
        "[importlib.import_module(m) for m in WORKER_MODULES]; "
        "print(sorted(m for m in ('pandas', 'sklearn', 'torch._dynamo') if m in sys.modules))")
    assert out == "[]"


def test_the_invocations_engine_imports_leave_out_scipy_pandas_and_sklearn():
    # what `raysim run` imports beside Ray's start (the runner, the data preparation): scipy
    # (~0.3 s, for a site shift's blur), pandas and scikit-learn load only where used
    out = _printed_by_python(
        "import sys; import raysim.cli, raysim.engine.runner, raysim.preparation; "
        "print(sorted(m for m in ('scipy', 'pandas', 'sklearn') if m in sys.modules))")
    assert out == "[]"


def test_medmnist_metadata_is_read_without_the_medmnist_package_init():
    # medmnist's __init__ imports its datasets and evaluator (scikit-learn, pandas: ~1.3 s of
    # an invocation's start-up); raysim needs only its metadata table, and it must be the same
    out = _printed_by_python(
        "import json, sys; from raysim.data.medmnist_io import default_root, medmnist_info; "
        "info = medmnist_info(); root = default_root(); "
        "loaded = sorted(m for m in ('medmnist', 'sklearn', 'pandas') if m in sys.modules); "
        "import medmnist.info as official; "
        "same = info == official.INFO; "
        "print(json.dumps([loaded, same, root == official.DEFAULT_ROOT, 'pneumoniamnist' in info]))")
    assert out == '[[], true, true, true]'


def test_the_warm_cluster_starts_its_raylet_as_a_local_ray_does(monkeypatch, tmp_path):
    from raysim.engine import cluster, startup

    # one set of raylet settings (the preload list, the early prestart) for both starts: a
    # local Ray (startup) and `ray start` (cluster)
    assert startup.raylet_environment is cluster.raylet_environment
    started: list[dict[str, str]] = []

    class Started(Exception):
        pass

    def popen(command, **options):
        started.append(options["env"])
        raise Started

    monkeypatch.setenv("RAYSIM_CLUSTER_DIR", str(tmp_path / "cluster"))
    monkeypatch.setenv("RAYSIM_CPU_SLOTS", str(tmp_path / "slots"))
    monkeypatch.setattr(cluster.subprocess, "run", lambda *args, **kwargs: None)
    monkeypatch.setattr(cluster.subprocess, "Popen", popen)
    with pytest.raises(Started):
        cluster.start_cluster(cpus=1)
    assert started[0].items() >= cluster.raylet_environment().items()


def test_loading_every_shipped_config_imports_neither_torch_nor_ray():
    out = _printed_by_python(
        "import glob, sys; from raysim.config import load_experiments; "
        "found = sorted(glob.glob('experiments/**/*.yaml', recursive=True)); "
        "[load_experiments(path) for path in found]; "
        "print(len(found), sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    count, loaded = out.split(" ", 1)
    assert int(count) > 10 and loaded == "[]"


def test_torch_free_params_match_the_registries():
    from raysim.algorithms import ALGORITHMS
    from raysim.algorithms.params import ALGORITHM_PARAMS
    from raysim.models import MODELS
    from raysim.models.params import MODEL_PARAMS

    assert {cls.params_class for cls in ALGORITHMS.values()} == set(ALGORITHM_PARAMS)
    assert len(ALGORITHMS) == len(ALGORITHM_PARAMS)
    assert [entry.params for entry in MODELS.values()] == list(MODEL_PARAMS)


def test_the_raylets_store_connect_settings_keep_a_value_the_user_set(monkeypatch):
    from raysim.engine import cluster

    monkeypatch.delenv("RAY_raylet_client_connect_timeout_milliseconds", raising=False)
    monkeypatch.setenv("RAY_raylet_client_num_connect_attempts", "7")
    settings = cluster.raylet_environment()
    assert settings["RAY_raylet_client_connect_timeout_milliseconds"] == "50"
    assert settings["RAY_raylet_client_num_connect_attempts"] == "7"
