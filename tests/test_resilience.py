"""Resilience: dying workers, a killed driver process (resume), divergence."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from conftest import SIGNAL_TESTS, quickstart_raw

from raysim.cli import main
from raysim.configuration.experiment import parse_config
from raysim.engine.launch import local_ray as startup
from raysim.engine.launch.watchdog import descendants, start_time
from raysim.engine.runner import run_experiment
from raysim.results import load
from raysim.rounds.checkpoint import CHECKPOINT_FILE, load_checkpoint

pytestmark = SIGNAL_TESTS

METRICS = ["round", "accuracy", "macro_f1", "auc", "loss", "train_loss", "bytes_up"]


def _parts(run_dir: Path, table: str = "rounds") -> int:
    return len(list((run_dir / table).glob("part-*.parquet"))) if (run_dir / table).is_dir() else 0


def _wait_for(condition, timeout: float = 120.0,
              what: str = "timed out waiting for the run to get going") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _run_and_kill(config, output: Path, after_rounds: int, process) -> tuple[Any, list[int]]:
    """Run ``config`` while a thread SIGKILLs one of its processes (``process(manifest)`` ->
    pid) once ``after_rounds`` rounds are written; returns the run's outcome and the pid."""
    killed: list[int] = []

    def kill() -> None:
        runs = lambda: list(output.glob("*/seed_0"))  # noqa: E731
        _wait_for(lambda: runs() and _parts(runs()[0]) >= after_rounds)
        pid = process(json.loads((runs()[0] / "manifest.json").read_text()))
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    outcome = run_experiment(config, output=str(output), progress=False)[0]
    killer.join(timeout=5)
    return outcome, killed


def _same_metrics(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> None:
    key = [c for c in ("round", "client") if c in columns]
    pd.testing.assert_frame_equal(a[columns].sort_values(key).reset_index(drop=True),
                                  b[columns].sort_values(key).reset_index(drop=True))


@pytest.mark.parametrize("algorithm", ["fedavg", "local", "feddc"])
def test_worker_killed_mid_run_is_replaced_and_metrics_match(ray_session, tmp_path, algorithm):
    """FedAvg keeps no client state (only the failed round is redone); local-only keeps models
    and optimizer states on the workers (every client rolls back to the last checkpoint and the
    rounds since are replayed without writing their rows twice); FedDC also moves client
    models between the workers every round."""
    params = {"name": algorithm} if algorithm != "feddc" else {
        "name": "feddc", "daisy_period": 1, "aggregation_period": 3}
    raw = quickstart_raw(training={"rounds": 25}, algorithm=params,
                         engine={"num_workers": 2, "cpus_per_worker": 1, "flush_seconds": 0,
                                 "checkpoint_every": 5, "checkpoint_seconds": 0, "checkpoint_share": 0})
    config = parse_config(raw)
    disturbed, killed = _run_and_kill(config, tmp_path / "killed", after_rounds=7,
                                      process=lambda manifest: manifest["workers"][1]["pid"])
    undisturbed = run_experiment(config, output=str(tmp_path / "clean"), progress=False)[0]
    assert killed and disturbed.error is None
    manifest = json.loads((disturbed.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and len(manifest["recoveries"]) == 1
    assert manifest["workers"][1]["pid"] != killed[0]  # Ray restarted the worker
    rounds = load(disturbed.run_dir)
    assert rounds["round"].tolist() == list(range(25))  # every round exactly once
    _same_metrics(rounds, load(undisturbed.run_dir), METRICS)
    client_columns = ["round", "client", "train_loss", "num_samples"]
    _same_metrics(load(disturbed.run_dir, "clients"), load(undisturbed.run_dir, "clients"),
                  client_columns)
    if algorithm != "fedavg":
        assert manifest["recoveries"][0]["rolled_back_to"] % 5 == 0
        eval_columns = ["round", "client", "own_accuracy", "own_loss"]
        _same_metrics(load(disturbed.run_dir, "client_eval"),
                      load(undisturbed.run_dir, "client_eval"), eval_columns)


def test_resume_after_sigkill_of_the_driver_process(ray_session, tmp_path):
    """Kill `raysim run` (the process that owns the Ray job) with SIGKILL after a checkpoint
    and after later rounds were written: no process it started survives, and `raysim run
    --resume` finishes the run with every round exactly once and the metrics of an
    uninterrupted run."""
    # a checkpoint every 10 rounds: the kill lands in the 8 rounds of each 10 that have rows
    # past the last checkpoint (with one every 4 rounds a slow poll on a loaded machine could
    # miss every 2-round window until the finished run removed its checkpoint)
    raw = quickstart_raw(training={"rounds": 30}, algorithm={"name": "local"},
                         engine={"num_workers": 1, "cpus_per_worker": 1, "flush_seconds": 0,
                                 "checkpoint_every": 10, "checkpoint_seconds": 0,
                                 "checkpoint_share": 0})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    output = tmp_path / "results"
    process = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", str(config_path), "--output", str(output),
         "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = lambda: next(iter(output.glob("*/seed_0")), None)  # noqa: E731

    def checkpointed_and_beyond() -> bool:
        assert process.poll() is None, "the run ended before it could be killed mid-run"
        directory = run_dir()
        if directory is None or not (directory / CHECKPOINT_FILE).is_file():
            return False
        checkpoint = load_checkpoint(directory)  # (None if the run just removed it)
        return (checkpoint is not None and checkpoint.next_round >= 10
                and _parts(directory) > checkpoint.next_round + 1)

    try:
        _wait_for(checkpointed_and_beyond, timeout=180)
        started = descendants(process.pid)  # its Ray: GCS, raylet, agents, workers, watchdog
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert len(started) >= 4
    # nothing the killed invocation started outlives it (the watchdog removes Ray's agents)
    _wait_for(lambda: not any(start_time(p) == t for p, t in started.items()), timeout=30,
              what="processes of the killed invocation outlived it")
    directory = run_dir()
    interrupted = load(directory)
    assert 11 < len(interrupted) < 30  # killed mid-run, with rows past the checkpoint
    assert json.loads((directory / "manifest.json").read_text())["status"] == "running"
    time.sleep(2)  # Ray tears down the killed job's actors

    assert main(["run", str(config_path), "--output", str(output), "--resume",
                 "--no-progress"]) == 0
    assert main(["run", str(config_path), "--output", str(tmp_path / "clean"),
                 "--no-progress"]) == 0
    clean_dir = next((tmp_path / "clean").glob("*/seed_0"))
    resumed = load(directory)
    assert resumed["round"].tolist() == list(range(30))  # nothing lost, nothing duplicated
    _same_metrics(resumed, load(clean_dir), METRICS)
    clients = load(directory, "clients")
    assert not clients.duplicated(["round", "client"]).any()
    _same_metrics(clients, load(clean_dir, "clients"), ["round", "client", "train_loss"])
    _same_metrics(load(directory, "client_eval"), load(clean_dir, "client_eval"),
                  ["round", "client", "own_accuracy", "global_accuracy"])
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["status"] == "completed" and len(manifest["resumes"]) == 1
    assert manifest["resumed_from"] >= 10
    assert not (directory / CHECKPOINT_FILE).exists()  # a completed run needs no checkpoint


def test_resume_of_a_completed_run_keeps_it_and_a_changed_config_is_refused(
        ray_session, tmp_path, capsys, monkeypatch):
    raw = quickstart_raw(training={"rounds": 3})
    config_path = tmp_path / "run.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    output = str(tmp_path / "results")
    assert main(["run", str(config_path), "--output", output, "--no-progress"]) == 0
    run_dir = next(Path(output).glob("*/seed_0"))
    parts = sorted(p.name for p in (run_dir / "rounds").iterdir())
    written = {p: p.stat().st_mtime_ns for p in run_dir.parent.rglob("*") if p.is_file()}
    capsys.readouterr()

    def no_start(*args, **kwargs):
        raise AssertionError("Ray was started (or CPUs waited for) before the decision")

    monkeypatch.setattr(startup, "start_alongside", no_start)
    assert main(["run", str(config_path), "--output", output, "--resume", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"every run of {run_dir.parent} is complete; nothing to resume" in out
    assert sorted(p.name for p in (run_dir / "rounds").iterdir()) == parts
    assert {p: p.stat().st_mtime_ns for p in run_dir.parent.rglob("*") if p.is_file()} == written
    for change in ("training.optimizer.lr=0.5", "seeds=[0,1]"):  # refused before any start
        code = main(["run", str(config_path), "--output", output, "--resume", "--no-progress",
                     "--set", change])
        err = capsys.readouterr().err
        assert code == 2 and "different config" in err and change.split(".")[0].split("=")[0] \
            in err, err
    assert not (run_dir.parent / "seed_1").exists()
    assert main(["run", str(config_path), "--output", str(tmp_path / "none"), "--resume",
                 "--no-progress"]) == 2
    assert "Nothing to resume" in capsys.readouterr().err


def test_nan_loss_stops_the_run_naming_round_and_clients(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 20, "optimizer": {"name": "sgd", "lr": 1e12}},
                         engine={"num_workers": 1, "cpus_per_worker": 1})
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is not None and "DivergenceError" in outcome.error
    assert "diverged in round" in outcome.error and "client(s)" in outcome.error
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "diverged"
    rounds = load(outcome.run_dir)
    stopped = int(outcome.error.split("diverged in round ")[1].split(":")[0])
    assert rounds["round"].tolist() == list(range(stopped + 1))  # every row up to the stop
    assert stopped < 19


def test_driver_actor_killed_mid_run_is_replaced_and_resumes(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 25}, algorithm={"name": "local"},
                         engine={"num_workers": 1, "cpus_per_worker": 1, "flush_seconds": 0,
                                 "checkpoint_every": 5, "checkpoint_seconds": 0, "checkpoint_share": 0})
    config = parse_config(raw)
    disturbed, killed = _run_and_kill(config, tmp_path / "killed", after_rounds=8,
                                      process=lambda manifest: manifest["driver"]["pid"])
    undisturbed = run_experiment(config, output=str(tmp_path / "clean"), progress=False)[0]
    assert killed and disturbed.error is None
    manifest = json.loads((disturbed.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed" and len(manifest["resumes"]) == 1
    assert manifest["driver"]["pid"] != killed[0]
    rounds = load(disturbed.run_dir)
    assert rounds["round"].tolist() == list(range(25))
    _same_metrics(rounds, load(undisturbed.run_dir), METRICS)
    _same_metrics(load(disturbed.run_dir, "client_eval"), load(undisturbed.run_dir, "client_eval"),
                  ["round", "client", "own_accuracy", "own_loss"])


def test_ctrl_c_marks_running_runs_interrupted_and_names_resume(ray_session, tmp_path, capsys,
                                                               monkeypatch):
    from raysim.engine import runner

    real_follow = runner.follow

    def follow_then_interrupt(queue, start, finish, limit, rounds, show, groups=None):
        start(queue[0])  # the first run has started (manifest written) ...
        raise KeyboardInterrupt  # ... when the user presses Ctrl-C

    monkeypatch.setattr(runner, "follow", follow_then_interrupt)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(quickstart_raw(training={"rounds": 50})))
    code = main(["run", str(config), "--output", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err
    monkeypatch.setattr(runner, "follow", real_follow)
    manifests = list((tmp_path / "out").glob("*/seed_0/manifest.json"))
    assert code == 130 and len(manifests) == 1
    assert json.loads(manifests[0].read_text())["status"] == "interrupted"
    root = manifests[0].parent.parent
    assert str(root) in err and f"--resume {root}" in err


def test_concurrent_invocations_share_cpu_slots_and_a_killed_one_frees_them(tmp_path):
    """Concurrent `raysim` invocations take machine-wide CPU slots before starting a local Ray:
    the second gets what the first left, waits (with a notice) when too few are free, and the
    slots of a SIGKILLed invocation are free at once (the OS drops its locks)."""
    import subprocess
    import sys

    from raysim.engine.launch.cpu_slots import CpuSlots

    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from raysim.engine.launch.cpu_slots import "
         f"CpuSlots; s = CpuSlots(4, Path({str(tmp_path)!r})); print(s.acquire(3, 3), "
         "flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "3"
        mine = CpuSlots(4, tmp_path)
        assert mine.acquire(1) == 1  # the one slot the other invocation left
        mine.release()
        notices: list[str] = []
        with pytest.raises(TimeoutError):
            mine.acquire(2, timeout=0.3, notify=notices.append, poll_seconds=0.05)
        assert len(notices) == 1 and "waiting for 2 of the 4" in notices[0]
        assert mine.held == 0  # nothing kept while waiting
    finally:
        holder.kill()
        holder.wait()
    assert mine.acquire(2, timeout=10, poll_seconds=0.05) == 4
    mine.release()


def test_one_watchdog_follows_a_process_however_often_ray_starts(monkeypatch):
    from raysim.engine.launch import watchdog

    monkeypatch.setattr(watchdog, "_WATCHDOGS", {})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = watchdog.start_watchdog(sleeper.pid)
        assert first is not None and watchdog.start_watchdog(sleeper.pid) is first
    finally:
        sleeper.kill()
        sleeper.wait()
    assert first.wait(timeout=30) == 0  # it ends once the process it follows is gone
