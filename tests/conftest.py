"""Shared fixtures: one local Ray instance for the tests that need it, config builders."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# The suite's own CPU slots: `raysim run` subprocesses of the tests neither wait for nor take the
# slots of experiments the user runs on this machine at the same time.
_SUITE_DIRS = {
    "RAYSIM_CPU_SLOTS": tempfile.mkdtemp(prefix="raysim-test-cpu-slots-"),
    "RAYSIM_CACHE": tempfile.mkdtemp(prefix="raysim-test-cache-"),  # MD5s of test files
    "RAYSIM_CLUSTER_DIR": tempfile.mkdtemp(prefix="raysim-test-cluster-"),  # no user cluster
    # every Ray the tests start (ray.init, `raysim run`, `ray start`) keeps its sessions and
    # its `ray start` record here, not in the machine's /tmp/ray (a short path: Ray's sockets)
    "RAY_TMPDIR": tempfile.mkdtemp(prefix="rst-"),
}
_MACHINE_RAY_RECORD = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") \
    / "ray" / "ray_current_cluster"
_RECORD_BEFORE = _MACHINE_RAY_RECORD.exists()
os.environ.update(_SUITE_DIRS)
if "PYTEST_XDIST_WORKER" in os.environ:  # two test processes share the CPUs: one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

CLUSTER_TESTS = [pytest.mark.cluster, pytest.mark.xdist_group("clusters")]
"""``pytestmark`` of a module whose tests start their own Ray or cluster: under pytest-xdist
they run in one test process, one after another (a port one of them found free is not taken by
another's Ray meanwhile)."""
SIGNAL_TESTS = [pytest.mark.signals, pytest.mark.xdist_group("signals")]
"""``pytestmark`` of a module whose tests interrupt, kill or starve a run: under pytest-xdist
they run in one test process, one after another."""


def _suite_ray_processes() -> list[str]:
    """Processes still running that belong to a Ray the tests started (their command line or
    environment names the suite's Ray directory)."""
    found = []
    marker = _SUITE_DIRS["RAY_TMPDIR"].encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environment = (entry / "environ").read_bytes()
        except OSError:
            continue
        if command.startswith(f"{sys.executable}\0-m\0raysim.engine.launch.watchdog\0{os.getpid()}\0"
                              .encode()):
            continue  # follows the suite's process and ends a second after it (the watchdog)
        if marker in command or marker in environment:
            words = command.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry.name}: {words[:120]}")
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the suite when a test left a Ray process of its own or `ray start`'s cluster record
    behind (that record makes other programs' ``ray.init`` join a dead cluster); then remove
    the suite's temporary directories."""
    import background_mypy

    background_mypy.stop()
    deadline = time.monotonic() + 20  # Ray's processes exit a few seconds after shutdown
    left = _suite_ray_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = _suite_ray_processes()
    records = [str(path) for path in Path(_SUITE_DIRS["RAY_TMPDIR"]).rglob("ray_current_cluster")]
    if _MACHINE_RAY_RECORD.exists() and not _RECORD_BEFORE:
        records.append(str(_MACHINE_RAY_RECORD))
    for line in left:
        os.kill(int(line.split(":")[0]), 9)
    for directory in _SUITE_DIRS.values():
        shutil.rmtree(directory, ignore_errors=True)
    if left or records:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = ("tests left Ray behind: " + "; ".join(
            [*(f"process {line}" for line in left), *(f"cluster record {r}" for r in records)]))
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's units of work (``-n 2`` in pyproject.toml): each ``xdist_group`` whole
    (the tests that start clusters, those that signal or kill a run) and every other test
    module whole, so that its module fixtures and shared simulations are made once; handed
    out in collection order, the groups first."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupsAndModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # (xdist's suffix for a group)
                return nodeid.rsplit("@", 1)[-1]
            return nodeid.split("::", 1)[0]

    return GroupsAndModules(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests that run on the session's Ray (the ``ray_session`` fixture, directly or
    through another fixture) ``engine``, so that ``-m "not engine"`` selects the in-process
    part of the suite; start the type check in the background when it was collected."""
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)
        for name, (kind, group) in {"CLUSTER_TESTS": CLUSTER_TESTS,
                                    "SIGNAL_TESTS": SIGNAL_TESTS}.items():
            if item.get_closest_marker(kind.name) and group.mark not in item.iter_markers():
                raise pytest.UsageError(f"{item.nodeid} is marked {kind.name} without its "
                                        f"xdist_group: give its module `pytestmark = {name}`")
    # the longest units of work first: the tests that share one test process under xdist
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
    under_xdist = "PYTEST_XDIST_WORKER" in os.environ  # (then test_typing runs mypy itself)
    if not under_xdist and any(item.path.name == "test_typing.py" for item in items):
        import background_mypy

        background_mypy.start()  # the type check's CPU minute beside the tests that wait


REAL_MEDMNIST = Path(os.environ.get("RAYSIM_TEST_MEDMNIST") or Path.home() / ".medmnist")
"""The real MedMNIST files the tests that need them read (``RAYSIM_TEST_MEDMNIST``; default
medmnist's own ``~/.medmnist``); those tests are skipped where a file is missing."""


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance with 4 logical CPUs and 1 logical GPU (for placement tests)."""
    import ray

    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def data_root(tmp_path_factory):
    """A generated PneumoniaMNIST-layout file (90 training, 30 test images) for the in-process
    method tests (read only; a test module may define its own ``data_root`` instead)."""
    from fixtures import write_medmnist_npz

    root = tmp_path_factory.mktemp("generated-pneumonia")
    write_medmnist_npz(root, n_train=90, n_test=30)
    return root


def answer_ctrl_c() -> None:
    """``preexec_fn`` of a child a test interrupts with SIGINT: the default disposition, so
    that the child answers it even when the suite runs as a background job of a
    non-interactive shell (which starts with SIGINT ignored, and children inherit that)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
    from raysim.configuration.experiment import parse_config
    from raysim.engine.runner import run_experiment
    from raysim.results import load

    outcome = run_experiment(parse_config(raw), output=str(output), progress=False)[0]
    assert outcome.error is None, outcome.error
    return tuple(load(outcome.run_dir, table) for table in tables)


@pytest.fixture(autouse=True, scope="module")
def _simulations_of_this_module():
    """In-process simulations are shared within a test module only (``inprocess.simulate``):
    a module's tests see traces made in the same process state as their own."""
    import inprocess

    inprocess.forget_simulations()
    yield
    inprocess.forget_simulations()
