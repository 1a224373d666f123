"""Run experiments in one invocation on a Ray cluster of several nodes started on this machine
(Ray's cluster utilities: a head without CPUs, where the driver runs, and ``--nodes`` more nodes,
each its own raylet and object store with 2 CPUs) and print, as one JSON line per run, its
label (the config file's name), the cluster's nodes, the driver's node, the nodes the workers
landed on and the run directory.

Usage: python tests/local_cluster.py [--nodes N] CONFIG.yaml [CONFIG.yaml ...] OUTPUT_DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from raysim.config import load_config
from raysim.engine.runner import run_experiments
from raysim.results.manifest import read_manifest


def main(config_paths: list[str], output: str, nodes: int) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        # one invocation joins the cluster through the configs, as `engine.address: auto`
        # does after `ray start`; its runs of one worker shape share the workers
        experiments = {Path(path).stem: load_config(path, [f"engine.address={cluster.address}"])
                       for path in config_paths}
        outcomes = run_experiments(experiments, output=output, progress=False)
        alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
        for outcome in outcomes:
            manifest = read_manifest(outcome.run_dir)
            print(json.dumps({"label": outcome.run_dir.parent.name, "error": outcome.error,
                              "run_dir": str(outcome.run_dir), "nodes": alive,
                              "driver_node": manifest["driver"]["node_id"],
                              "worker_nodes": [w["node_id"] for w in manifest["workers"]]}),
                  flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="nodes besides the head")
    parser.add_argument("paths", nargs="+", help="configs, then the output directory")
    arguments = parser.parse_args()
    main(arguments.paths[:-1], arguments.paths[-1], arguments.nodes)
