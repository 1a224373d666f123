"""Live metrics where researchers look (issue #37, item 8): `logging: {tensorboard: DIR,
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
        events = EventAccumulator(str(tmp_path / "tb" / "quickstart" / f"seed_{seed}"))
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
