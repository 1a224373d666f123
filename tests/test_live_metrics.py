"""Live metrics where researchers look: `logging: {tensorboard: DIR,
mlflow: URI}` streams every evaluated round, the config and the final summary, read back with
the libraries themselves; Parquet stays the source of truth. Skipped where the extras are not
installed (`pip install -e '.[tensorboard,mlflow]'`)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from conftest import quickstart_raw

from raysim.cli import main
from raysim.results import load


def test_tensorboard_and_mlflow_receive_every_evaluated_round_of_every_run(
        ray_session, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    raw = quickstart_raw(training={"rounds": 4}, evaluation={"every": 2}, seeds=[0, 1])
    raw["logging"] = {"tensorboard": str(tmp_path / "tb"), "mlflow": "local"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["run", str(config), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    root = next((tmp_path / "out").iterdir())
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("quickstart")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == ["seed_0", "seed_1"]
    for seed in (0, 1):
        rounds = load(root / f"seed_{seed}")
        evaluated = rounds[rounds["accuracy"].notna()]
        assert evaluated["round"].tolist() == [1, 3]  # every 2 rounds and the last
        events = EventAccumulator(str(tmp_path / "tb" / root.name / f"seed_{seed}"))
        events.Reload()
        scalars = events.Scalars("accuracy")
        assert [s.step for s in scalars] == [1, 3]
        np.testing.assert_allclose([s.value for s in scalars], evaluated["accuracy"], rtol=1e-6)
        run = runs[f"seed_{seed}"]
        history = client.get_metric_history(run.info.run_id, "accuracy")
        assert [m.step for m in history] == [1, 3]
        np.testing.assert_allclose([m.value for m in history], evaluated["accuracy"])
        assert run.info.status == "FINISHED"
        assert run.data.params["training.rounds"] == "4" and run.data.params["seed" + "s"]
        assert run.data.metrics["final_accuracy"] == pytest.approx(evaluated["accuracy"].iloc[-1])
        artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "learning_curves_accuracy.png" in artifacts


def test_two_invocations_never_share_a_tensorboard_run(ray_session, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    raw = quickstart_raw(training={"rounds": 3}, evaluation={"every": 1})
    raw["logging"] = {"tensorboard": str(tmp_path / "tb")}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    for _ in range(2):
        assert main(["run", str(config), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    roots = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert len(roots) == 2 and sorted(p.name for p in (tmp_path / "tb").iterdir()) == roots
    for name in roots:
        events = EventAccumulator(str(tmp_path / "tb" / name / "seed_0"))
        events.Reload()
        assert [s.step for s in events.Scalars("accuracy")] == [0, 1, 2]  # once each


def test_the_mlflow_extra_serves_the_store_in_its_ui(ray_session, tmp_path):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
    import os
    import shutil
    import signal
    import socket
    import subprocess
    import time
    import urllib.request

    raw = quickstart_raw(training={"rounds": 2})
    raw["logging"] = {"mlflow": "local"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["run", str(config), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    store = next((tmp_path / "out").iterdir()) / "mlflow.db"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mlflow = shutil.which("mlflow")
    assert mlflow is not None, "the mlflow extra installs the `mlflow` command"
    server = subprocess.Popen(  # the README's command
        [mlflow, "ui", "--backend-store-uri", f"sqlite:///{store}", "--host", "127.0.0.1",
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,  # without its job runner, whose store directory in /dev/shm
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # outlives it
    try:
        deadline, page = time.monotonic() + 90, None
        while page is None:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the MLflow UI did not answer in 90 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                    page = answer.read().decode(errors="replace")
            except OSError:
                time.sleep(0.5)
        assert "MLflow" in page or "mlflow" in page
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_a_missing_extra_is_one_paragraph_and_exit_2(capsys, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real(name, *a))
    raw = quickstart_raw()
    raw["logging"] = {"mlflow": "local"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["validate", str(config)]) == 2
    err = capsys.readouterr().err
    assert "logging.mlflow" in err and "pip install -e '.[mlflow]'" in err


def test_relative_live_metric_locations_are_relative_to_where_raysim_starts(tmp_path,
                                                                             monkeypatch):
    """The drivers that write them run in another directory (the package's): a relative
    TensorBoard directory or SQLite store would land there, not beside the user."""
    from raysim.configuration.experiment import parse_config

    monkeypatch.chdir(tmp_path)
    raw = quickstart_raw(logging={"tensorboard": "tb", "mlflow": "sqlite:///runs/mlflow.db"})
    logging = parse_config(raw).logging
    assert logging.tensorboard == str(tmp_path / "tb")
    assert logging.mlflow == f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    kept = parse_config(quickstart_raw(logging={"tensorboard": "/data/tb",
                                                "mlflow": "http://tracking:5000"})).logging
    assert (kept.tensorboard, kept.mlflow) == ("/data/tb", "http://tracking:5000")
    assert parse_config(quickstart_raw(logging={"mlflow": "local"})).logging.mlflow == "local"
