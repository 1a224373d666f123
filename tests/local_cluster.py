"""Run experiments in one invocation on a Ray cluster of several nodes started on this machine
(Ray's cluster utilities: a head without CPUs, where the driver runs, and ``--nodes`` more nodes,
each its own raylet and object store with 2 CPUs) and print, as one JSON line per run, its
label (the config file's name), the cluster's nodes, the driver's node, the nodes the workers
landed on and the run directory.

Usage: python tests/local_cluster.py [--nodes N] [--remove-a-worker-node] CONFIG.yaml
       [CONFIG.yaml ...] OUTPUT_DIR

``--remove-a-worker-node``: the last config runs after the others, in an invocation of its own
(into ``OUTPUT_DIR/node-removed``); once its workers are placed and it has written a round,
the node of its first worker is killed (its raylet and every process on it, no graceful
shutdown), as a machine of a cluster dies; its line then also says how many seconds the
invocation took after that. The other configs' runs end before, on the whole cluster.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from raysim.configuration.experiment import load_config
from raysim.engine.runner import run_experiments
from raysim.results.manifest import read_manifest


def remove_a_worker_node(cluster: Cluster, workers: list, output: str, removed: list) -> None:
    """Kill the node of the first run's first worker once that run has written a round."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        manifests = list(Path(output).glob("*/seed_*/manifest.json")) + list(
            Path(output).glob("*/*/seed_*/manifest.json"))
        for path in manifests:
            manifest = read_manifest(path.parent)
            if manifest.get("workers") and list(path.parent.glob("rounds/part-*.parquet")):
                target = manifest["workers"][0]["node_id"]
                node = next(n for n in workers if n.node_id == target)
                cluster.remove_node(node, allow_graceful=False)
                removed.append(time.monotonic())
                return
        time.sleep(0.5)


def main(config_paths: list[str], output: str, nodes: int, remove: bool = False) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        workers = [cluster.add_node(num_cpus=2) for _ in range(nodes)]
        cluster.wait_for_nodes()
        removed: list[float] = []
        if remove:
            invoke(config_paths[:-1], output, cluster.address, removed)
            watched = str(Path(output) / "node-removed")
            threading.Thread(target=remove_a_worker_node, daemon=True,
                             args=(cluster, workers, watched, removed)).start()
            invoke(config_paths[-1:], watched, cluster.address, removed)
        else:
            invoke(config_paths, output, cluster.address, removed)
    finally:
        ray.shutdown()
        cluster.shutdown()


def invoke(config_paths: list[str], output: str, address: str, removed: list[float]) -> None:
    """One invocation of ``config_paths`` on the cluster at ``address``, one line per run."""
    if not config_paths:
        return
    # one invocation joins the cluster through the configs, as `engine.address: auto`
    # does after `ray start`; its runs of one worker shape share the workers
    experiments = {Path(path).stem: load_config(path, [f"engine.address={address}"])
                   for path in config_paths}
    outcomes = run_experiments(experiments, output=output, progress=False)
    alive = [node["NodeID"] for node in ray.nodes() if node["Alive"]]
    for outcome in outcomes:
        manifest = read_manifest(outcome.run_dir)
        print(json.dumps({"label": outcome.run_dir.parent.name, "error": outcome.error,
                          "run_dir": str(outcome.run_dir), "nodes": alive,
                          "driver_node": manifest["driver"]["node_id"],
                          "worker_nodes": [w["node_id"] for w in manifest["workers"]],
                          "status": manifest["status"],
                          "seconds_after_removal": (time.monotonic() - removed[0]
                                                    if removed else None)}),
              flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2, help="nodes besides the head")
    parser.add_argument("--remove-a-worker-node", action="store_true",
                        help="run the last config after the others and kill its first "
                             "worker's node once it has a round")
    parser.add_argument("paths", nargs="+", help="configs, then the output directory")
    arguments = parser.parse_args()
    main(arguments.paths[:-1], arguments.paths[-1], arguments.nodes,
         arguments.remove_a_worker_node)
