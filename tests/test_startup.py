"""`raysim run`'s start-up: Ray starts while the engine imports and the data loads, the first
run's actors start before the data is ready and serve that run, and a data error is still
reported before waiting for CPUs another invocation holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import yaml
from conftest import CLUSTER_TESTS, quickstart_raw

from raysim.cli import main
from raysim.configuration.experiment import parse_config
from raysim.engine.launch.parallel_runs import processes_at_start, runs_at_once

pytestmark = CLUSTER_TESTS


def test_first_runs_actors_start_while_the_data_is_prepared_and_serve_the_run(
        ray_session, tmp_path, monkeypatch):
    import raysim.preparation as preparation
    from raysim.engine.pool.shared_actors import POOL, SharedActors
    from raysim.engine.startup_phases import startup_phases

    prestarted = threading.Event()
    created: list = []
    original_prestart, original_prepare = SharedActors.prestart, preparation.prepare

    def recording_prestart(self, shape, workers, drivers, node_strategy):
        original_prestart(self, shape, workers, drivers, node_strategy)
        created.extend(self._idle_workers[shape])
        prestarted.set()

    seen_before_data: list[bool] = []

    def waiting_prepare(config, data_root, read=None):
        # the data is ready only once the actors were asked for: their start overlaps it
        seen_before_data.append(prestarted.wait(timeout=60))
        return original_prepare(config, data_root, read)

    monkeypatch.setattr(SharedActors, "prestart", recording_prestart)
    monkeypatch.setattr(preparation, "prepare", waiting_prepare)
    POOL.clear()
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw(
        training={"rounds": 2}, engine={"num_workers": 2, "cpus_per_worker": 1})))
    assert main(["run", str(config), "--output", str(tmp_path / "out"), "--no-progress"]) == 0

    assert seen_before_data == [True]
    manifest = json.loads(next((tmp_path / "out").glob("*/seed_0/manifest.json")).read_text())
    run_pids = sorted(worker["pid"] for worker in manifest["workers"])
    prestarted_pids = sorted(d["pid"] for d in ray_session.get(
        [actor.describe.remote() for actor in created]))
    assert len(created) == 2 and run_pids == prestarted_pids
    phases = startup_phases(manifest)
    assert phases is not None and phases["alongside"] == 1
    assert min(phases.values()) >= 0
    assert phases["first_round"] >= phases["imports"] + max(phases["data"], phases["ray"])


def test_each_distinct_data_file_is_read_once_in_a_thread_of_its_own_while_the_engine_imports(
        tmp_path, monkeypatch):
    from fixtures import write_medmnist_npz

    import raysim.data
    import raysim.preparation
    from raysim.configuration.experiment import parse_config
    from raysim.engine.invocation import _import_engine_and_prepare
    from raysim.errors import MissingDataError

    write_medmnist_npz(tmp_path, "pneumoniamnist", n_train=60, n_test=20)
    write_medmnist_npz(tmp_path, "bloodmnist", n_train=60, n_test=20, channels=3, num_classes=8)
    reads: list[tuple[str, str]] = []
    original_load = raysim.data.load_dataset

    def counting_load(config, data_root=None):
        reads.append((config.name, threading.current_thread().name))
        return original_load(config, data_root)

    monkeypatch.setattr(raysim.data, "load_dataset", counting_load)
    monkeypatch.setattr(raysim.preparation, "load_dataset", counting_load)

    def experiment(flag: str, lr: float):
        return parse_config(quickstart_raw(
            dataset={"name": flag, "root": str(tmp_path), "download": False,
                     "verify_checksum": False},
            partition={"scheme": "iid", "num_clients": 3},
            training={"rounds": 1, "optimizer": {"name": "sgd", "lr": lr}}))

    experiments = {"a": experiment("pneumoniamnist", 0.1), "b": experiment("pneumoniamnist", 0.2),
                   "c": experiment("bloodmnist", 0.1)}
    prepared = _import_engine_and_prepare(experiments, None)

    assert sorted(name for name, _ in reads) == ["bloodmnist", "pneumoniamnist"]
    assert {thread for _, thread in reads} != {threading.current_thread().name}
    assert all(thread.startswith("raysim-read") for _, thread in reads)
    assert prepared["a"][0][0] is prepared["b"][0][0]  # one dataset object for both
    assert prepared["c"][0][0].info.num_classes == 8

    reads.clear()
    missing = {"m": parse_config(quickstart_raw(dataset={
        "name": "dermamnist", "root": str(tmp_path), "download": False}))}
    with pytest.raises(MissingDataError, match=r"dermamnist\.npz"):
        _import_engine_and_prepare(missing, None)
    assert [name for name, _ in reads] == ["dermamnist"]  # its error raised, not read again


def test_missing_data_is_reported_before_waiting_for_cpus_another_invocation_holds(tmp_path):
    from raysim.engine.launch.cpu_slots import CpuSlots

    slots = tmp_path / "slots"
    holder = CpuSlots(os.cpu_count() or 1, slots)
    holder.acquire(holder.total)  # another invocation holds every CPU
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw(
        dataset={"name": "pneumoniamnist", "root": str(tmp_path / "empty"), "download": False},
        model={"name": "convnet", "width": 8, "depth": 2})))
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from raysim.cli import main; "
             "sys.exit(main(sys.argv[1:]))", "run", str(config), "--no-progress",
             "--output", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "RAYSIM_CPU_SLOTS": str(slots)})
    finally:
        holder.release()
    assert done.returncode == 2, done.stderr
    assert "pneumoniamnist" in done.stderr and "--data-root" in done.stderr
    assert "waiting for" not in done.stderr and "Traceback" not in done.stderr


def test_prestart_tops_up_to_the_needed_actors_and_frees_idle_workers_of_other_shapes(
        ray_session):
    """Repeated start-ups (e.g. invocations that fail after it) never pile up actors, and
    idle workers of another shape never hold the CPUs prestarted workers need."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from raysim.engine.pool.shared_actors import POOL, WorkerShape

    here = NodeAffinitySchedulingStrategy(ray_session.get_runtime_context().get_node_id(),
                                          soft=False)
    one_cpu, two_cpus = WorkerShape(1, 0, True, 0), WorkerShape(2, 0, True, 0)
    POOL.clear()
    for _ in range(3):
        POOL.prestart(one_cpu, 2, 1, here)
    assert len(POOL._idle_workers[one_cpu]) == 2 and len(POOL._idle_drivers) == 1
    POOL.prestart(two_cpus, 2, 1, here)  # 4 CPUs: only once the 1-CPU workers are gone
    assert not POOL._idle_workers.get(one_cpu) and len(POOL._idle_workers[two_cpus]) == 2
    workers = POOL.workers(two_cpus, 2)
    assert len(ray_session.get([w.describe.remote() for w in workers], timeout=120)) == 2
    POOL.clear()
    POOL.discard(workers)


_SESSION_RAYLET = """
def session_raylet():
    # (pid, command line) of the raylet of this process's Ray session
    session = os.path.basename(ray._private.worker._global_node.get_session_dir_path())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
        except OSError:
            continue
        if argv[0].endswith("raylet") and any(session in arg for arg in argv):
            return pid, argv
    raise RuntimeError("no raylet of this session")
"""

_PROBE = """
import json, os, sys
import ray
from raysim.configuration.experiment import parse_config
from raysim.engine.launch.local_ray import ensure_ray, stop_local_ray

ensure_ray(parse_config(json.loads(sys.argv[1])))
""" + _SESSION_RAYLET + """

@ray.remote(num_cpus=1)
class Probe:  # defined here, so it imports nothing of raysim or torch itself
    def modules(self):
        return sorted(m for m in ("torch", "raysim.engine.run.worker", "raysim.engine.run.driver",
                                  "torch._dynamo") if m in sys.modules)

def session_processes():
    # the programs of this Ray session's processes that name its directory: Ray's own
    # binaries by name, Python ones by their script
    session = os.path.basename(ray._private.worker._global_node.get_session_dir_path())
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
        except OSError:
            continue
        if any(session in arg for arg in argv):
            found.update(os.path.basename(arg) for arg in argv[:2]
                         if arg.endswith(".py") or arg.endswith(("raylet", "gcs_server")))
    return sorted(found)

def raylet_settings():
    # the RAY_ settings in the environment this session's raylet started with
    pid, _ = session_raylet()
    environ = open(f"/proc/{pid}/environ", "rb").read().decode().split("\\0")
    return dict(v.split("=", 1) for v in environ
                if v.startswith(("RAY_preload", "RAY_enable_worker_prestart",
                                 "RAY_raylet_client_")))

print(json.dumps(ray.get(Probe.remote().modules.remote())))
print(json.dumps(session_processes()))
print(json.dumps(raylet_settings()))
stop_local_ray()
"""


def test_a_local_ray_starts_its_worker_processes_early_with_the_engine_and_no_unused_services(
        tmp_path):
    config = quickstart_raw(engine={"num_workers": 1, "cpus_per_worker": 1})
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(config)], capture_output=True, text=True,
        timeout=180, cwd=tmp_path,
        env={**os.environ, "RAYSIM_CPU_SLOTS": str(tmp_path / "slots")})
    assert done.returncode == 0, done.stderr
    modules, programs, settings = (json.loads(line)
                                   for line in done.stdout.strip().splitlines()[-3:])
    assert modules == ["raysim.engine.run.driver", "raysim.engine.run.worker", "torch"]  # dynamo: clients
    # Ray's GCS and raylet, without the API server, the autoscaler monitor and the log monitor
    # (dashboard.py, monitor.py, log_monitor.py), which a raysim run never uses
    assert programs == ["gcs_server", "raylet"]
    # the raylet preloads the engine and starts its worker processes as soon as it is up, not
    # when the driver has connected (its agents started); it retries connecting to its object
    # store after 50 ms, not after Ray's 1 s, with the same 10 s of patience in all
    assert settings == {"RAY_preload_python_modules": "raysim.engine.run.worker,raysim.engine.run.driver",
                        "RAY_enable_worker_prestart": "1",
                        "RAY_raylet_client_connect_timeout_milliseconds": "50",
                        "RAY_raylet_client_num_connect_attempts": "200"}
    assert "RAY_enable_worker_prestart" not in os.environ  # (only for the start)


_PRESTART_PROBE = """
import json, os, sys
os.cpu_count = lambda: 16  # a node with more CPUs than the runs use (before raysim reads it)
import ray
from raysim.configuration.experiment import parse_config
from raysim.engine.launch import local_ray as startup

gpus = float(sys.argv[1])  # the GPUs the start is told Ray will find
startup.gpus_ray_will_detect = lambda: gpus
configs = [parse_config(json.loads(raw)) for raw in sys.argv[2:]]
startup.ensure_ray(configs[0], runs=configs)
""" + _SESSION_RAYLET + """
_, argv = session_raylet()
print(json.dumps({"cpus": ray.cluster_resources()["CPU"], "prestart": [
    arg for arg in argv if arg.startswith("--num_prestart_python_workers=")]}))
startup.stop_local_ray()
"""


@pytest.mark.parametrize(("gpus", "engine", "seeds", "processes"), [
    # three seeds of two 1-CPU workers: all three runs fit at once, each with its driver host
    (0, {"num_workers": 2, "cpus_per_worker": 1}, [0, 1, 2], 9),
    # eight seeds of 4 x 0.25 GPU on one GPU: one run at a time (4 would fit on the CPUs)
    (1, {"num_workers": 4, "cpus_per_worker": 1, "gpus_per_worker": 0.25}, list(range(8)), 5),
])
def test_a_local_ray_starts_ahead_of_time_only_the_processes_of_the_first_runs(
        tmp_path, gpus, engine, seeds, processes):
    # on a node of 16 CPUs (faked), not Ray's one process per CPU
    config = quickstart_raw(engine=engine, seeds=seeds)
    done = subprocess.run(
        [sys.executable, "-c", _PRESTART_PROBE, str(gpus), json.dumps(config)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "RAYSIM_CPU_SLOTS": str(tmp_path / "slots")})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "cpus": 16.0, "prestart": [f"--num_prestart_python_workers={processes}"]}


def test_the_processes_started_ahead_of_time_are_those_of_the_runs_that_fit_at_once():
    def config(workers: int, seeds: list[int], cpus_per_worker: float = 1.0):
        return parse_config(quickstart_raw(
            seeds=seeds, engine={"num_workers": workers, "cpus_per_worker": cpus_per_worker}))

    assert processes_at_start([config(4, [0])], cpus=16) == 5
    assert processes_at_start([config(2, [0, 1, 2])], cpus=16) == 9
    # ten seeds of 4 workers: 4 runs fit on 16 CPUs (20 processes), at most one per CPU
    assert processes_at_start([config(4, list(range(10)))], cpus=16) == 16
    # two configs: as many runs as the most demanding config fits (13 // 4 CPUs: 3), in order
    assert processes_at_start([config(2, [0], 2.0), config(2, [0, 1], 1.0)], cpus=13) == 9
    assert processes_at_start([config(2, [0])], cpus=2) == 2  # the development machine
    assert runs_at_once([config(2, [0])], cpus=16, gpus=1) == 8  # no GPU asked for
    gpu = parse_config(quickstart_raw(engine={"num_workers": 4, "gpus_per_worker": 0.25},
                                      seeds=list(range(8))))
    assert runs_at_once([gpu], cpus=16, gpus=1) == 1
    # eight seeds of 4 x 0.25 GPU on a 16-CPU, 1-GPU node: one run at a time, not four
    assert processes_at_start([gpu], cpus=16, gpus=1) == 5
    assert processes_at_start([gpu], cpus=16, gpus=2) == 10
    assert processes_at_start([gpu], cpus=16) == 16


def test_the_start_counts_the_gpus_ray_will_find_and_may_use(monkeypatch):
    from ray._private import accelerators

    from raysim.engine.launch import ray_internals

    class EightGpus:
        @staticmethod
        def get_current_node_num_accelerators() -> int:
            return 8

        @staticmethod
        def get_current_process_visible_accelerator_ids() -> list[str] | None:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            return None if visible is None else visible.split(",")

    monkeypatch.setattr(accelerators, "get_accelerator_manager_for_resource",
                        lambda resource: EightGpus if resource == "GPU" else None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert ray_internals.gpus_ray_will_detect() == 8.0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert ray_internals.gpus_ray_will_detect() == 2.0


_CONSOLE = """
import atexit, sys
atexit.register(lambda: print("python finalised", flush=True))
from raysim.cli import console_main
sys.argv = ["raysim", *sys.argv[1:]]
console_main()
"""


def test_the_console_script_stops_its_ray_then_exits_without_python_finalisation(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw(
        training={"rounds": 2}, engine={"num_workers": 1, "cpus_per_worker": 1})))
    done = subprocess.run(
        [sys.executable, "-c", _CONSOLE, "run", str(config), "--no-progress",
         "--output", str(tmp_path / "out")], capture_output=True, text=True, timeout=300,
        cwd=tmp_path, env={**os.environ, "RAYSIM_CPU_SLOTS": str(tmp_path / "slots")})
    assert done.returncode == 0, done.stderr
    # the closing lines are printed (made while Ray shut down) and flushed before the exit
    assert "learning curves:" in done.stdout and "results (Parquet" in done.stdout
    assert list((tmp_path / "out").glob("*/learning_curves_accuracy.png"))
    # Ray was shut down inside the command, so the process skipped Python's finalisation
    assert "python finalised" not in done.stdout


def test_python_dash_m_raysim_is_the_command(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw()))
    done = subprocess.run([sys.executable, "-m", "raysim", "validate", str(config)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "valid" in (done.stdout + done.stderr).lower(), done.stderr
    bad = subprocess.run([sys.executable, "-m", "raysim", "validate", str(tmp_path / "no.yaml")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


_BUILTIN_PROBE = """
import sys
from raysim.data.builtin import load_builtin
load_builtin(sys.argv[1])
print("sklearn" in sys.modules)
"""


@pytest.mark.parametrize("name", ["breast-cancer", "digits", "synthetic"])
def test_a_builtin_dataset_is_made_once_then_read_from_the_cache_without_scikit_learn(
        tmp_path, monkeypatch, name):
    from raysim.data import builtin

    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path))
    made = builtin.make_builtin(name)
    first = builtin.load_builtin(name)  # made and written
    path = builtin.cache_path(name)
    assert path is not None and path.is_file()
    again = builtin.load_builtin(name)  # read back
    for dataset in (first, again):
        assert dataset.info == made.info
        for key in ("train_x", "train_y", "test_x", "test_y"):
            assert getattr(dataset, key).dtype == getattr(made, key).dtype
            assert np.array_equal(getattr(dataset, key), getattr(made, key))
    # a new command reads the file without importing scikit-learn (about 0.9 s of CPU)
    imported = subprocess.run([sys.executable, "-c", _BUILTIN_PROBE, name], capture_output=True,
                              text=True, timeout=120, env={**os.environ,
                                                           "RAYSIM_CACHE": str(tmp_path)})
    assert imported.stdout.strip() == "False", imported.stderr
    # a damaged file is made again, not trusted
    path.write_bytes(b"not an npz")
    assert np.array_equal(builtin.load_builtin(name).train_x, made.train_x)
    assert builtin.load_builtin(name).info == made.info
