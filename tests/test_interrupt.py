"""Ctrl-C without loss: the first SIGINT (or SIGTERM) stops every run at a
round boundary with every completed round flushed and a checkpoint of the last one, marks the
manifests `interrupted` and prints the command that continues exactly that work; `--resume`
alone (the root remembers --set and --variant) then gives every round once and the tables of
an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import SIGNAL_TESTS, quickstart_raw
from test_resilience import _same_metrics, _wait_for

from raysim.cli import main
from raysim.engine.startup_phases import startup_phases
from raysim.results import load
from raysim.rounds.checkpoint import CHECKPOINT_FILE, load_checkpoint
from raysim.training.evaluation import METRICS

pytestmark = SIGNAL_TESTS

ROUNDS = 60


def _interrupted_run(raw: dict, tmp_path: Path, extra: list[str],
                     signals: list[signal.Signals], to_group: bool = False
                     ) -> tuple[Path, Path, str]:
    """Run ``raw`` as `raysim run` in a process of its own (and a process group of its own);
    once it shows progress, send ``signals`` (each after the previous one was acknowledged) to
    the process, or with ``to_group`` to its whole process group as a batch scheduler,
    ``timeout`` or ``docker stop`` do; it must exit 128 + the first signal (130 after SIGINT,
    143 after SIGTERM). Returns the config path, the output directory and its stderr."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    output = tmp_path / "results"
    process = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", str(config), "--output", str(output),
         *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    total = f"/{raw['training']['rounds']}"
    try:
        _wait_for(lambda: any("round " in line and total in line for line in lines),
                  timeout=180, what="no progress line")
        for number, sent in enumerate(signals):
            if number:
                _wait_for(lambda: any("stopping at the next round boundary" in line
                                      for line in lines),
                          timeout=30, what="the first signal was not acknowledged")
            if to_group:
                os.killpg(process.pid, sent)
            else:
                process.send_signal(sent)
        assert process.wait(timeout=120) == 128 + signals[0]
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    return config, output, "".join(lines)


@pytest.mark.parametrize("algorithm, sent, to_group", [  # local: personal client state
    ("fedavg", signal.SIGTERM, True), ("local", signal.SIGINT, False)])
def test_first_signal_stops_at_a_round_boundary_and_resume_completes_the_same_run(
        ray_session, tmp_path, algorithm, sent, to_group):
    """SIGTERM to the whole process group (Ray's processes run in a session of their own, so
    they are not in it) stops as SIGINT to the process does."""
    raw = quickstart_raw(training={"rounds": ROUNDS}, algorithm={"name": algorithm},
                         evaluation={"every": 5},  # metrics every 5th round, losses every one
                         seeds=[0], engine={"num_workers": 1, "cpus_per_worker": 1,
                                            "flush_seconds": 600})  # rows only flushed on stop
    override = "training.local_epochs=2"
    config, output, text = _interrupted_run(raw, tmp_path, ["--set", override], [sent],
                                            to_group)
    assert "Traceback" not in text
    run_dir = next(output.glob("*/seed_0"))
    root = run_dir.parent
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stopped = manifest["interrupted_before_round"]
    assert manifest["status"] == "interrupted" and 0 < stopped < ROUNDS
    assert load_checkpoint(run_dir).next_round == stopped  # the last completed round's state
    assert (run_dir / CHECKPOINT_FILE).is_file()
    assert load(run_dir)["round"].tolist() == list(range(stopped))  # every completed round
    expected = f"raysim run {config} --resume {root} --set {override} --output {output}"
    assert expected in text

    resuming = time.time()
    assert main(["run", str(config), "--resume", str(root), "--no-progress"]) == 0
    took = time.time() - resuming
    phases = startup_phases(json.loads((run_dir / "manifest.json").read_text()))
    assert phases is not None and 0 < phases["first_round"] <= took  # the resuming command's
    assert main(["run", str(config), "--output", str(tmp_path / "clean"), "--set", override,
                 "--no-progress"]) == 0
    clean = next((tmp_path / "clean").glob("*/seed_0"))
    resumed = load(run_dir)
    assert resumed["round"].tolist() == list(range(ROUNDS))
    _same_metrics(resumed, load(clean), list(METRICS))
    clients = load(run_dir, "clients")
    assert not clients.duplicated(["round", "client"]).any()
    _same_metrics(clients, load(clean, "clients"), ["round", "client", "train_loss"])
    finished = json.loads((run_dir / "manifest.json").read_text())
    assert finished["status"] == "completed" and finished["resumed_from"] == stopped


def test_resume_remembers_the_variants_it_was_given(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 2}, seeds=[0])
    raw["variants"] = {"a": {}, "b": {"training.rounds": 3}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    output = tmp_path / "results"
    assert main(["run", str(config), "--output", str(output), "--variant", "b",
                 "--no-progress"]) == 0
    root = next(output.iterdir())
    assert json.loads((root / "invocation.json").read_text())["variants"] == ["b"]
    assert main(["run", str(config), "--output", str(output), "--resume", "--no-progress"]) == 0
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["b"]  # not variant a


def test_a_second_signal_stops_at_once_and_keeps_every_written_row(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 100}, seeds=[0],
                         engine={"num_workers": 1, "cpus_per_worker": 1, "flush_seconds": 0,
                                 "checkpoint_every": 5, "checkpoint_seconds": 0, "checkpoint_share": 0})
    config, output, _ = _interrupted_run(raw, tmp_path, [], [signal.SIGINT, signal.SIGINT])
    run_dir = next(output.glob("*/seed_0"))
    written = load(run_dir)["round"].tolist()
    assert written == list(range(len(written))) and len(written) > 0  # no gap, no duplicate
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "interrupted"
    time.sleep(2)  # Ray tears down the stopped job's actors
    assert main(["run", str(config), "--resume", str(run_dir.parent), "--no-progress"]) == 0
    assert load(run_dir)["round"].tolist() == list(range(100))


def test_sigterm_to_an_estimate_projects_the_variants_it_probed(ray_session, tmp_path):
    """`ray.init` installs a SIGTERM handler that exits at once; the estimate's own takes it
    back, so SIGTERM (``timeout``, a scheduler) to the process group during the second
    variant's probe ends as Ctrl-C does: the first variant projected, its CSV row written,
    exit 143, neither a traceback nor Ray's signal dump."""
    raw = quickstart_raw(training={"rounds": 2}, seeds=[0])
    raw["variants"] = {"quick": {}, "slow": {"training.local_epochs": 5000}}
    config = tmp_path / "estimate.yaml"
    config.write_text(yaml.safe_dump(raw))
    table = tmp_path / "estimate.csv"
    process = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "estimate", str(config), "--rounds", "2",
         "--csv", str(table)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    try:
        _wait_for(lambda: any(line.startswith("probed quick (1 of 2)") for line in lines),
                  timeout=180, what="the first variant's probe did not end")
        time.sleep(2)  # into the second variant's probe
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) == 143
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    text = "".join(lines)
    assert "interrupted: projecting the 1 of 2 variants probed" in text
    assert "Traceback" not in text and "SIGTERM received" not in text
    assert "quick" in table.read_text()
