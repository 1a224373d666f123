"""Run experiments one after another on a two-node Ray cluster started on this machine (Ray's
cluster utilities: a head and a second node, each its own raylet with 2 CPUs) and print, as one
JSON line per config, the cluster's nodes, the nodes the workers landed on and the run directory.

Usage: python tests/two_node_cluster.py CONFIG.yaml [CONFIG.yaml ...] OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys

import ray
from ray.cluster_utils import Cluster

from raysim.config import load_config
from raysim.engine.runner import run_experiment
from raysim.results.manifest import read_manifest


def main(config_paths: list[str], output: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    try:
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        for config_path in config_paths:
            # joins the cluster through the config, as `engine.address: auto` does after
            # `ray start`; each config its own job (its own runtime environment)
            config = load_config(config_path, [f"engine.address={cluster.address}"])
            outcome = run_experiment(config, output=output, progress=False)[0]
            workers = read_manifest(outcome.run_dir)["workers"]
            print(json.dumps({"error": outcome.error, "run_dir": str(outcome.run_dir),
                              "nodes": [node["NodeID"] for node in ray.nodes() if node["Alive"]],
                              "worker_nodes": [worker["node_id"] for worker in workers]}),
                  flush=True)
            ray.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1:-1], sys.argv[-1])
