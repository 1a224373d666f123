"""Multi-node: a Ray cluster of a head (the driver's node) and two worker nodes on this machine.
Workers spread over the nodes and the numbers equal a single-node run's; the partials of the
workers of one node merge there, so one partial per node and round crosses to the driver's
node, with every metric unchanged (FedAvg, FedDC's relays, DP); a plug-in's module that only
this process can import travels to the nodes' workers with the job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import CLUSTER_TESTS, quickstart_raw, small_federation
from inprocess import simulate
from test_feddc import feddc_raw
from test_plugins import PLUGINS, moons_raw

from raysim.configuration.experiment import parse_config
from raysim.engine.runner import run_experiment
from raysim.estimator.cluster_projection import ProbeTraffic, round_bytes
from raysim.results import load

pytestmark = CLUSTER_TESTS

SCRIPT = Path(__file__).with_name("local_cluster.py")
FOUR = {"num_workers": 4, "cpus_per_worker": 1, "placement": "spread"}
"""Two workers on each worker node; every run of the invocation shares them."""
SINGLE = {"num_workers": 2, "cpus_per_worker": 1, "count_transfers": True}
"""The single-node runs compared with the cluster's (one worker shape: they share workers; two
workers relay FedDC's states between them, so a relayed state's size is counted)."""
VOLATILE = ("seconds", "memory", "wall_time", "time", "run", "status", "experiment")


def _configs() -> dict[str, dict]:
    feddc = feddc_raw(aggregation_period=3)
    feddc["training"]["rounds"] = 6
    feddc["evaluation"] = {"every": 3}
    return {
        "local": quickstart_raw(training={"rounds": 4}, algorithm={"name": "local"},
                                engine=FOUR),
        "moons": moons_raw(engine=FOUR),
        "fedavg": quickstart_raw(training={"rounds": 2, "clients_per_round": None},
                                 engine=FOUR),  # every client: every group has a partial
        "feddc": {**feddc, "engine": FOUR},
        "dp": small_federation(name="dp", algorithm={"name": "fedavg", "weighted": False},
                               privacy={"clip": 1.0, "noise_multiplier": 0.5}, engine=FOUR),
    }


DEAD_NODE = "dead_node"
"""The config run last, in an invocation of its own, whose first worker's node is killed."""


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
    """Every config run on the three-node cluster in one invocation, then the dead-node run
    (:data:`DEAD_NODE`) in another on the same cluster: {name: (raw config, the script's
    line)}."""
    folder = tmp_path_factory.mktemp("cluster")
    plugin_dir = folder / "lab"  # beside its config, on no node's import path
    plugin_dir.mkdir()
    shutil.copy(PLUGINS / "fedtrim.py", plugin_dir / "fedtrim.py")
    configs = {**_configs(), DEAD_NODE: quickstart_raw(
        training={"rounds": 2000}, engine={**FOUR, "checkpoint_every": 5})}
    paths = []
    for name, raw in configs.items():
        path = (plugin_dir if name == "moons" else folder) / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        paths.append(str(path))
    environment = {**os.environ, "RAYSIM_NODE_GRACE_SECONDS": "10"}  # (only a death waits)
    completed = subprocess.run([sys.executable, str(SCRIPT), "--nodes", "2",
                                "--remove-a-worker-node", *paths, str(folder / "runs")],
                               capture_output=True, text=True, timeout=900, env=environment)
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = {DEAD_NODE if "node-removed" in line["run_dir"] else line["label"]: line
             for line in map(json.loads, (text for text in completed.stdout.strip()
                                          .splitlines() if text.startswith("{")))}
    assert sorted(lines) == sorted(configs)
    return {name: (configs[name], lines[name]) for name in configs}


def _single_node(raw: dict, tmp_path: Path) -> Path:
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is None, outcome.error
    return outcome.run_dir


def _steady(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """A table's columns that do not depend on where the clients ran, in a fixed order."""
    columns = sorted(c for c in frame.columns if not any(v in c for v in VOLATILE))
    return frame[columns].sort_values(keys).reset_index(drop=True)


def test_workers_spread_over_nodes_and_match_single_node(ray_session, cluster_runs, tmp_path):
    raw, result = cluster_runs["local"]
    assert result["error"] is None
    assert len(result["nodes"]) == 3
    assert len(set(result["worker_nodes"])) == 2  # on both worker nodes
    single = _single_node({**raw, "engine": SINGLE}, tmp_path)
    columns = ["round", "accuracy", "loss", "train_loss", "personal_accuracy", "bytes_up"]
    pd.testing.assert_frame_equal(load(result["run_dir"])[columns], load(single)[columns])
    eval_columns = ["round", "client", "own_accuracy", "own_loss"]
    pd.testing.assert_frame_equal(load(result["run_dir"], "client_eval")[eval_columns],
                                  load(single, "client_eval")[eval_columns])


def test_a_plugin_travels_to_the_nodes(cluster_runs):
    raw, result = cluster_runs["moons"]
    assert result["error"] is None
    assert len(set(result["worker_nodes"])) == 2
    expected = simulate(parse_config(raw, near=PLUGINS))
    assert load(result["run_dir"])["train_loss"].tolist() == pytest.approx(
        [row["train_loss"] for row in expected.rows["rounds"]], rel=1e-6)


@pytest.mark.parametrize("name", ["fedavg", "feddc", "dp"])
def test_partials_merge_on_their_node_with_every_metric_unchanged(ray_session, cluster_runs,
                                                                   tmp_path, name):
    raw, result = cluster_runs[name]
    assert result["error"] is None
    assert result["driver_node"] not in result["worker_nodes"]
    assert sorted(pd.Series(result["worker_nodes"]).value_counts()) == [2, 2]
    single = _single_node({**raw, "engine": SINGLE}, tmp_path)
    for table, keys in [("rounds", ["round"]), ("clients", ["round", "client"]),
                        ("communication", ["round", "direction", "message_type"])]:
        pd.testing.assert_frame_equal(_steady(load(result["run_dir"], table), keys),
                                      _steady(load(single, table), keys))
    transfers = load(result["run_dir"], "transfers")
    inbound = transfers[(transfers["kind"] == "partial") & (transfers["link"] == "in")]
    aggregated = inbound["round"].unique()
    assert len(aggregated) > 0
    # one partial from each worker node per round, not one per worker
    assert (inbound.groupby("round")["objects"].sum() == 2).all()
    assert set(inbound["source_node"]) == {1, 2}
    if name == "feddc":  # the daisy chain relays models between the worker nodes
        relays = transfers[(transfers["kind"] == "relay") & (transfers["link"] == "between")]
        assert relays["bytes"].sum() > 0
    # the projection of this cluster (no workers on the driver's node, two nodes of two) from
    # the single-node run's counted bytes: the bytes the cluster counted
    config = parse_config(raw)
    rounds = load(single)
    traffic = ProbeTraffic.from_tables(load(single, "transfers"), rounds,
                                       load(single, "communication"), 2, 1.0,
                                       load(single, "clients"), config.partition.num_clients)
    projected = round_bytes(config, traffic, 3, [0, 2, 2])
    measured = transfers.groupby("link")["bytes"].sum() / rounds["round"].nunique()
    out = transfers[(transfers["kind"] == "broadcast") & (transfers["link"] == "out")]
    assert projected.broadcast_out == pytest.approx(out["bytes"].sum() / len(rounds), rel=0.01)
    assert projected.partials_in == pytest.approx(measured.get("in", 0), rel=0.02 if name != "dp"
                                                  else 0.5)  # DP: Poisson-sampled groups
    assert projected.relays_between == pytest.approx(measured.get("between", 0), rel=0.25,
                                                     abs=1)


def test_a_dead_worker_node_stops_the_run_in_bounded_time_with_a_paragraph(cluster_runs):
    """A machine of the cluster dies mid-run (its raylet and processes killed) and the nodes
    left cannot host the run's four workers: the run stops within the grace period with one
    paragraph saying so and how to resume, its manifest says failed, and the invocation ends
    without a traceback (with CPUs to spare, the worker is restarted there instead: the
    recovery tests of test_resilience.py)."""
    _, line = cluster_runs[DEAD_NODE]
    assert line["status"] == "failed" and "a node died" in line["error"], line
    assert "--resume" in line["error"] and "Traceback" not in line["error"]
    assert line["seconds_after_removal"] < 180
