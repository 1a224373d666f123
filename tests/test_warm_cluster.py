"""The warm cluster (`raysim cluster start`): later invocations join it and borrow the worker
and driver processes earlier ones left there, with the same numbers as a run on its own Ray;
its keeper never hands out actors of other code, kills what a dead invocation held, and does
not keep CPUs idle while another invocation runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import CLUSTER_TESTS, answer_ctrl_c, quickstart_raw, run_tables

from raysim.engine.launch import warm_cluster
from raysim.engine.launch.warm_cluster import is_running
from raysim.engine.launch.watchdog import start_time
from raysim.engine.pool.keeper import PoolKeeper

pytestmark = CLUSTER_TESTS


def _raysim(args: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raysim.cli", *args], capture_output=True,
                          text=True, env=environment, timeout=300)


def _manifest(root: Path) -> dict:
    return json.loads(next(root.glob("*/seed_0/manifest.json")).read_text())


def test_invocations_join_the_warm_cluster_reuse_its_processes_and_match_a_local_run(
        ray_session, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw(
        training={"rounds": 3}, engine={"num_workers": 2, "cpus_per_worker": 1})))
    environment = {**os.environ, "RAYSIM_CLUSTER_DIR": str(tmp_path / "cluster"),
                   "RAYSIM_CPU_SLOTS": str(tmp_path / "slots"),
                   "HOME": str(tmp_path / "home")}  # a fresh machine: no Ray token yet
    started = _raysim(["cluster", "start", "--cpus", "2"], environment)
    assert started.returncode == 0, started.stderr
    record = json.loads((tmp_path / "cluster" / "cluster.json").read_text())
    try:
        runs = [_raysim(["run", str(config), "--output", str(tmp_path / f"warm{i}"),
                         "--no-progress"], environment) for i in range(2)]
        status = _raysim(["cluster", "status"], environment)
    finally:
        stopped = _raysim(["cluster", "stop"], environment)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not is_running(record["pid"], record["pid_started"])  # `ray start` is gone
    assert not Path(record["ray_directory"]).exists()  # and its session directory
    assert _raysim(["cluster", "status"], environment).returncode == 1
    assert status.returncode == 0 and record["address"] in status.stdout
    for run in runs:
        assert run.returncode == 0, run.stderr
        assert "Joined the warm raysim cluster" in run.stderr

    first, second = (_manifest(tmp_path / f"warm{i}") for i in range(2))
    assert sorted(w["pid"] for w in second["workers"]) == \
        sorted(w["pid"] for w in first["workers"])  # the second borrowed the first's workers
    assert second["driver"]["pid"] == first["driver"]["pid"]
    assert second["startup"].get("joined") == 1.0

    local, = run_tables(yaml.safe_load(config.read_text()), tmp_path / "local", "rounds")
    warm = pd.read_parquet(next((tmp_path / "warm1").glob("*/seed_0/rounds")))
    pd.testing.assert_series_equal(warm["accuracy"], local["accuracy"])


@pytest.fixture()
def actors(ray_session):
    """Small actors standing in for pooled workers (killed ones answer with an error)."""

    @ray_session.remote(num_cpus=0)
    class Idle:
        def ping(self) -> int:
            return os.getpid()

    made = [Idle.remote() for _ in range(3)]
    ray_session.get([actor.ping.remote() for actor in made])
    yield made
    for actor in made:
        ray_session.kill(actor)


def _alive(ray, actor) -> bool:
    """Whether the actor still answers; a kill is asynchronous, so an actor that answered is
    asked again for a few seconds before it counts as alive."""
    deadline = time.monotonic() + 5
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.5)


def test_keeper_hands_out_only_actors_of_the_same_code(ray_session, actors):
    keeper = PoolKeeper()
    me = (os.getpid(), start_time(os.getpid()))
    assert keeper.take_back(me, "code-a", [("shape", actors[0]), (None, actors[1])]) == 2
    assert keeper.hand_over(me, "code-a") == [("shape", actors[0]), (None, actors[1])]
    assert keeper.take_back(me, "code-a", [("shape", actors[0])]) == 1
    assert keeper.hand_over(me, "code-b") == []  # changed code: the old actor is killed
    assert not _alive(ray_session, actors[0]) and keeper.idle() == 0


def test_keeper_kills_what_a_dead_invocation_held_and_frees_cpus_for_a_running_one(
        ray_session, actors, tmp_path):
    keeper = PoolKeeper()
    me = (os.getpid(), start_time(os.getpid()))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_holder = (gone.pid, start_time(gone.pid))
    gone.wait()
    keeper.register(gone_holder, [actors[0]])
    keeper.register(me, [actors[1]])
    assert keeper.hand_over((1, start_time(1)), "code") == []  # reaps the dead holder
    assert not _alive(ray_session, actors[0]) and _alive(ray_session, actors[1])
    # another invocation (`me`) still runs: what (1, ...) hands back is killed, not kept idle
    assert keeper.take_back((1, start_time(1)), "code", [("shape", actors[2])]) == 0
    assert not _alive(ray_session, actors[2]) and keeper.idle() == 0


def test_taking_over_leaves_out_actors_that_died_idle(ray_session, actors, monkeypatch):
    from raysim.engine.pool import keeper as pool_keeper
    from raysim.engine.pool.shared_actors import SharedActors

    keeper = ray_session.remote(PoolKeeper).options(num_cpus=0).remote()
    ray_session.get(keeper.take_back.remote((1, start_time(1)), pool_keeper.code_fingerprint(),
                                            [("shape", actors[0]), (None, actors[1])]))
    ray_session.kill(actors[0])
    monkeypatch.setattr(pool_keeper, "keeper", lambda namespace: keeper)
    pool = SharedActors()
    pool._take_over()
    assert not any(pool._idle_workers.values())
    assert [driver._actor_id for driver in pool._idle_drivers] == [actors[1]._actor_id]
    ray_session.kill(keeper)


def test_stopping_the_cluster_interrupts_ray_start_as_ctrl_c_does():
    """`raysim cluster stop` ends `ray start --block` with SIGINT, which it answers within
    seconds (a SIGTERM to its group takes it about half a minute): the stand-in ignores
    SIGTERM, so it ends with a KeyboardInterrupt only if SIGINT came before the SIGKILL."""
    stand_in = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
         "signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=answer_ctrl_c)
    assert stand_in.stdout.readline().strip() == "ready"
    warm_cluster._terminate(stand_in.pid, timeout=30)
    assert "KeyboardInterrupt" in stand_in.stderr.read()
    stand_in.wait(timeout=10)
