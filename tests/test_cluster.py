"""Multi-node: a two-node Ray cluster on this machine; workers spread over both nodes and the
numbers equal a single-node run's; a plug-in's module that only this process can import
travels to the nodes' workers with the job."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import quickstart_raw
from inprocess import simulate
from test_plugins import PLUGINS, moons_raw

from raysim.config import parse_config
from raysim.engine.runner import run_experiment
from raysim.results import load

SCRIPT = Path(__file__).with_name("two_node_cluster.py")


def test_two_node_cluster_spreads_workers_and_matches_single_node(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 4}, algorithm={"name": "local"},
                         engine={"num_workers": 2, "cpus_per_worker": 1, "placement": "spread"})
    config_path = tmp_path / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    plugin_dir = tmp_path / "lab"  # beside its config, on no node's import path
    plugin_dir.mkdir()
    shutil.copy(PLUGINS / "fedtrim.py", plugin_dir / "fedtrim.py")
    plugin_raw = moons_raw(engine={"num_workers": 2, "cpus_per_worker": 1,
                                   "placement": "spread"})
    (plugin_dir / "moons.yaml").write_text(yaml.safe_dump(plugin_raw))
    completed = subprocess.run([sys.executable, str(SCRIPT), str(config_path),
                                str(plugin_dir / "moons.yaml"), str(tmp_path / "cluster")],
                               capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result, plugin_result = (json.loads(line)
                             for line in completed.stdout.strip().splitlines()[-2:])
    assert result["error"] is None
    assert len(result["nodes"]) == 2
    assert sorted(result["worker_nodes"]) == sorted(result["nodes"])  # one worker per node
    single = run_experiment(parse_config(raw), output=str(tmp_path / "single"), progress=False)[0]
    columns = ["round", "accuracy", "loss", "train_loss", "personal_accuracy", "bytes_up"]
    pd.testing.assert_frame_equal(load(result["run_dir"])[columns], load(single.run_dir)[columns])
    eval_columns = ["round", "client", "own_accuracy", "own_loss"]
    pd.testing.assert_frame_equal(load(result["run_dir"], "client_eval")[eval_columns],
                                  load(single.run_dir, "client_eval")[eval_columns])
    assert plugin_result["error"] is None
    assert sorted(plugin_result["worker_nodes"]) == sorted(plugin_result["nodes"])
    expected = simulate(parse_config(plugin_raw, near=PLUGINS))
    assert load(plugin_result["run_dir"])["train_loss"].tolist() == pytest.approx(
        [row["train_loss"] for row in expected.rows["rounds"]], rel=1e-6)
