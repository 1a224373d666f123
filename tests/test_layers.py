"""The package's layers only point down, and no module imports itself back:

experiments -> cli -> the sweep and the estimator -> the engine's invocation (engine/) ->
engine/pool -> engine/run -> engine/launch (these four with Ray) -> the experiment config and
preparation -> layers (DP, the server optimizer, the simulated clock, compression) -> rounds
(one run's round loop, without Ray) -> system -> algorithms -> training/condensation ->
privacy -> models -> vectors -> data/results -> the config's schema/errors/seeding.

Every import counts: module-level, function-local and type-only, absolute and relative, and a
string that names a raysim module (``importlib``, Ray's preload list, the lazy registries).
Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so it imports those
packages too; a package's ``__init__`` runs before any of its modules, so it imports nothing
above the lowest layer inside it. ``experiments/`` is the top layer: it imports raysim, never
the other way. An import running back up, or any cycle between modules (within one layer
too), fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "raysim"
EXPERIMENTS = PACKAGE.parent / "experiments"

LAYERS = {  # higher imports lower or equal, never the other way
    "experiments": 18,
    "cli": 17, "cli_parser": 17, "__main__": 17,
    "configuration.sweep": 16, "estimator": 16, "api": 16,
    "engine": 15,
    "engine.pool": 14,
    "engine.run": 13,
    "engine.launch": 12,
    "configuration.experiment": 11, "preparation": 11, "configuration.reference": 11,
    "plugins": 11,
    "layers": 10,
    "rounds": 9,
    "system": 8,
    "algorithms": 7,
    "training": 6, "condensation": 6,
    "privacy": 5,
    "models": 4,
    "vectors": 3,
    "data": 2, "results": 2,
    "configuration.schema": 1, "configuration": 1, "errors": 1, "seeding": 1, "lazy": 1,
    "cache": 1, "state_codec": 1,
}
ENGINE_ROOMS = ("launch", "pool", "run")
CONFIGURATION_ROOMS = ("schema", "experiment", "reference", "sweep")
"""The configuration package's modules, each at its own layer (the package imports none)."""
PRELOADED = {"raysim.engine.run.worker", "raysim.engine.run.driver", "raysim.engine.run"}
"""What Ray's worker processes import at their start, named by the launch room's preload list
(``WORKER_MODULES``): another process's import, not one of the launch room's. Only these
strings may name a module above their own layer."""


def _module(path: Path) -> str:
    dotted = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return dotted.removesuffix(".__init__")


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "experiments":
        return "experiments"
    if len(parts) >= 3 and parts[1] == "engine" and parts[2] in ENGINE_ROOMS:
        return f"engine.{parts[2]}"
    if len(parts) >= 3 and parts[1] == "configuration" and parts[2] in CONFIGURATION_ROOMS:
        return f"configuration.{parts[2]}"
    return parts[1] if len(parts) > 1 else "raysim"


MODULES = {_module(path): path for path in PACKAGE.rglob("*.py")}
SCRIPTS = {_module(path): path for path in EXPERIMENTS.rglob("*.py")}
EVERYTHING = {**MODULES, **SCRIPTS}


def _is_package(module: str) -> bool:
    return EVERYTHING[module].name == "__init__.py"


def _resolve(name: str) -> str:
    """The module an imported name lives in (``raysim.a.b.Name`` -> ``raysim.a.b``)."""
    while name not in EVERYTHING and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _ancestors(module: str) -> list[str]:
    """The packages whose ``__init__`` runs before ``module`` (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = module.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts)) if ".".join(parts[:n]) in EVERYTHING]


def _named(module: str, node: ast.ImportFrom) -> str:
    """The absolute module of a ``from`` import, relative ones resolved against ``module``."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("raysim", "experiments")


def _imports(module: str, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every raysim or experiments import of ``module`` (its file, or
    ``source`` in its place), wherever it stands, with the packages each import runs first."""
    found = []
    text = EVERYTHING[module].read_text() if source is None else source
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom):
            named = _named(module, node)
            if _ours(named):
                found.extend((node.lineno, _resolve(f"{named}.{a.name}")) for a in node.names)
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, _resolve(a.name)) for a in node.names if _ours(a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value  # a module named by a string; in a package, also relative to it
            for name in (text, f"{module}.{text}" if _is_package(module) else None):
                if name in EVERYTHING and name != module and "." in name:
                    found.append((node.lineno, name))
    own = set(_ancestors(module))
    return found + [(line, package) for line, imported in found
                    for package in _ancestors(imported) if package not in own]


@pytest.mark.parametrize("source, seen", [
    ("from ..engine.runner import run_experiments", "raysim.engine.runner"),
    ("from .. import cli", "raysim.cli"),
    ("def f():\n    import importlib\n    importlib.import_module('raysim.configuration.sweep')",
     "raysim.configuration.sweep"),
    ("from raysim.engine.run.worker import ClientWorker", "raysim.engine"),  # its __init__
    ("import raysim.engine.pool.keeper", "raysim.engine.pool"),
])
def test_the_import_reader_sees_every_kind_of_import(source, seen):
    # a probe edit of a low module (models/cnn.py): each import must be seen, else an upward
    # import of that kind would pass the layer test unnoticed
    assert seen in {imported for _, imported in _imports("raysim.models.cnn", source)}


def test_a_package_init_ranks_with_the_lowest_layer_inside_it():
    assert _rank("raysim.engine") == LAYERS["engine.launch"]
    assert _rank("raysim.engine.run") == LAYERS["engine.run"]
    assert _rank("experiments.benchmarks.harness") == LAYERS["experiments"]


def test_every_module_belongs_to_a_layer():
    layers = {_layer(module) for module in EVERYTHING} - {"raysim"}
    assert layers <= set(LAYERS), layers - set(LAYERS)


def _rank(module: str) -> int:
    """A module's layer; a package's ``__init__`` (it runs before every module inside) ranks
    with the lowest layer inside it."""
    if _is_package(module):
        inside = [LAYERS[_layer(m)] for m in EVERYTHING
                  if m.startswith(f"{module}.") and _layer(m) in LAYERS]
        if inside:
            return min([*inside, *([LAYERS[_layer(module)]] if _layer(module) in LAYERS else [])])
    return LAYERS.get(_layer(module), 0)


def test_imports_only_point_down():
    upward = []
    for module, path in EVERYTHING.items():
        if module == "raysim":
            continue
        for line, imported in _imports(module):
            preloaded = module == "raysim.engine.launch.warm_cluster" and imported in PRELOADED
            if imported in EVERYTHING and _rank(imported) > _rank(module) and not preloaded:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({_layer(module)}) "
                              f"imports {imported} ({_layer(imported)})")
    assert not upward, "imports running back up:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back():
    graph: dict[str, set[str]] = defaultdict(set)
    for module in EVERYTHING:
        graph[module] |= {imported for _, imported in _imports(module)
                          if imported in EVERYTHING and imported != module}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_the_cycle_check_sees_a_cycle_through_a_function_local_import():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _printed_by_python(code: str) -> str:
    """What a fresh interpreter prints running ``code`` in the repository root."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=PACKAGE.parent).stdout.strip()


def test_config_algorithms_and_training_load_without_ray():
    out = _printed_by_python(
        "import sys, raysim.configuration.experiment, raysim.preparation, raysim.training.runtime, "
        "raysim.rounds.round_loop, raysim.rounds.round_callbacks; "
        "from raysim.algorithms import ALGORITHMS; from raysim.models import MODELS; "
        "print(sorted(m for m in ('ray',) if m in sys.modules))")
    assert out == "[]"


def test_pooled_processes_preload_neither_pandas_nor_sklearn_nor_dynamo():
    # every pooled process (worker or driver host) imports Ray's preload list at start;
    # pandas (~0.4 s of CPU), scikit-learn (~0.9 s) and torch._dynamo (~1.1 s) would cost each
    # of them that much again: only client workers need torch._dynamo (they import it when
    # created), only a driver reads tables or computes metrics
    out = _printed_by_python(
        "import importlib, sys; from raysim.engine.launch.warm_cluster import WORKER_MODULES; "
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
    from raysim.engine.launch import local_ray as startup
    from raysim.engine.launch import warm_cluster as cluster

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
    monkeypatch.setattr(cluster.tempfile, "tempdir", str(tmp_path))  # Ray's session directory
    with pytest.raises(Started):
        cluster.start_cluster(cpus=1)
    assert started[0].items() >= cluster.raylet_environment().items()
    assert not list(tmp_path.glob("raysim-ray-*"))  # a start that failed leaves no directory


def test_loading_every_shipped_config_imports_neither_torch_nor_ray():
    out = _printed_by_python(
        "import glob, sys; from raysim.configuration.experiment import load_experiments; "
        "found = sorted(p for p in glob.glob('experiments/**/*.yaml', recursive=True) "
        "if not p.startswith('experiments/plugins/')); "  # (a plug-in imports what it uses)
        "[load_experiments(path) for path in found]; "
        "print(len(found), sorted(m for m in ('ray', 'torch') if m in sys.modules))")
    count, loaded = out.split(" ", 1)
    assert int(count) > 10 and loaded == "[]"


def test_torch_free_params_match_the_registries():
    from raysim.algorithms import ALGORITHMS
    from raysim.algorithms.params import ALGORITHM_PARAMS
    from raysim.models import MODELS
    from raysim.models.params import MODEL_PARAMS

    shipped = {name: cls for name, cls in ALGORITHMS.items()
               if cls.__module__.startswith("raysim.")}  # (a test's plug-ins are not)
    assert {cls.params_class for cls in shipped.values()} == set(ALGORITHM_PARAMS)
    assert len(shipped) == len(ALGORITHM_PARAMS)
    assert [entry.params for entry in MODELS.values()
            if entry.build.__module__.startswith("raysim.")] == list(MODEL_PARAMS)


def test_the_raylets_store_connect_settings_keep_a_value_the_user_set(monkeypatch):
    from raysim.engine.launch import warm_cluster as cluster

    monkeypatch.delenv("RAY_raylet_client_connect_timeout_milliseconds", raising=False)
    monkeypatch.setenv("RAY_raylet_client_num_connect_attempts", "7")
    settings = cluster.raylet_environment()
    assert settings["RAY_raylet_client_connect_timeout_milliseconds"] == "50"
    assert settings["RAY_raylet_client_num_connect_attempts"] == "7"


def test_a_raysim_ray_runs_its_workers_at_the_users_priority_unless_told_otherwise(monkeypatch):
    from raysim.engine.launch import warm_cluster as cluster

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert cluster.raylet_environment()["RAY_worker_niceness"] == "0"  # Ray's own default: 15
    monkeypatch.setenv("RAY_worker_niceness", "15")
    assert cluster.raylet_environment()["RAY_worker_niceness"] == "15"
