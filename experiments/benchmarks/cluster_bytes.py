"""Cluster scale: the bytes a round moves between Ray nodes, counted on a cluster of several
nodes started on this machine, and checked against the arithmetic.

The cluster: a head without CPUs (the driver runs there) and ``--nodes`` worker nodes of 2 CPUs,
each its own raylet and object store (Ray's cluster utilities, as a `ray start --address` node
would be), ``--workers-per-node`` workers on each. The runs: FedAvg
(``convnet32-150x8-pneumonia``) and FedDC (``feddc-convnet32-150x8-pneumonia``, aggregating
every 2nd round so that a few rounds show both kinds) with their ConvNet (width 32) and with a
ResNet18 (BatchNorm, 28 px; ``--resnet-clients`` clients, as each FedDC client keeps a model of
45 MB). Each run's ``transfers`` table (sizes of the objects at each hand-off: the broadcast,
the partials, the relayed client states) gives the bytes per round into the driver's node, out
of it and between worker nodes.

One JSON line per (method, model): the counted bytes per round by kind and link, and the
arithmetic beside them: the model's bytes (float32 parameters and buffers), so the broadcast
should cross once per worker node (the object store pulls it once per node), the partials once
per node at float64 (twice the model), FedDC's relays one model per client whose next holder
is on another node (for a random permutation over ``--nodes`` equal nodes, a fraction
1 - 1/nodes of the clients); the partials one per worker would have sent; and what Flower's
and pfl-research's designs move for the same round (every client's update through the server;
a ring all-reduce of float32 models, about twice the model per node).

    python experiments/benchmarks/cluster_bytes.py [--nodes 3] [--rounds 4] [--records]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
from harness import bench_config, record_path, workload_dataset

from raysim.configuration.experiment import parse_config
from raysim.data import load_dataset
from raysim.engine.runner import run_experiment
from raysim.estimator.cluster_projection import node_roots
from raysim.models import build_model
from raysim.results import load

INLINE_BYTES = 100 * 1024
"""Ray sends a task's arguments below this size inline, in every task."""

RUNS = {
    ("fedavg", "convnet32"): ("convnet32-150x8-pneumonia", None),
    ("feddc", "convnet32"): ("feddc-convnet32-150x8-pneumonia", None),
    ("fedavg", "resnet18"): ("convnet32-150x8-pneumonia", {"name": "resnet18", "norm": "batch"}),
    ("feddc", "resnet18"): ("feddc-convnet32-150x8-pneumonia",
                            {"name": "resnet18", "norm": "batch"}),
}
"""(method, model) -> (workload, the model that replaces the workload's)."""


def model_bytes(raw: dict) -> int:
    """Bytes of the model's state: float32 parameters and buffers (BatchNorm's running
    statistics and its int64 step count)."""
    config = parse_config(raw)
    model = build_model(config.model, load_dataset(config.dataset).info)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def run_config(workload: str, model: dict | None, dataset: dict, rounds: int, workers: int,
               resnet_clients: int) -> dict:
    """The workload as a config on the cluster's workers."""
    raw = bench_config(workload, dataset, rounds, {"num_workers": workers})
    if raw["algorithm"]["name"] == "feddc":
        raw["algorithm"] = {**raw["algorithm"], "aggregation_period": 2}
    if model is not None:
        raw["model"] = model
        raw["partition"] = {**raw["partition"], "num_clients": resnet_clients}
    return raw


def per_round(transfers: pd.DataFrame, rounds: pd.DataFrame) -> list[dict]:
    """Each round's bytes and objects by kind and link."""
    rows = []
    for round_, frame in transfers.groupby("round"):
        row: dict = {"round": int(round_)}
        for (kind, link), part in frame.groupby(["kind", "link"]):
            row[f"{kind}_{link}_bytes"] = int(part["bytes"].sum())
            row[f"{kind}_{link}_objects"] = int(part["objects"].sum())
        row["clients"] = int(rounds.loc[rounds["round"] == round_, "clients_sampled"].iloc[0])
        rows.append(row)
    return rows


def tree_roots(clients: int, groups: int, nodes: int, workers_per_node: int
               ) -> tuple[int, int]:
    """(roots per round from the nodes, roots the workers would send): the aligned blocks of
    the reduction tree that tile each node's and each worker's range of groups, for clients of
    equal size (the engine's layout, as ``raysim estimate --nodes`` projects it)."""
    from_nodes = node_roots(clients, groups, nodes, [workers_per_node] * nodes)
    from_workers = node_roots(clients, groups, nodes * workers_per_node,
                              [1] * (nodes * workers_per_node))
    return sum(from_nodes), sum(from_workers)


def arithmetic(method: str, model: int, nodes: int, workers_per_node: int, clients: int,
               aggregated: bool, inline: bool) -> dict:
    """What a round should move between nodes, by design: the broadcast once per node from
    the object store (in every task when inline), each node's roots of the reduction tree at
    float64 (twice the model), and what the workers' own roots would have been."""
    node_roots, worker_roots = tree_roots(clients, 64, nodes, workers_per_node)
    expected = {"broadcast_out_bytes": model * nodes * (workers_per_node if inline else 1),
                "partial_in_bytes": 2 * model * node_roots if aggregated else 0,
                "partial_local_bytes": 2 * model * worker_roots if aggregated else 0}
    if method == "feddc":
        expected["relay_between_bytes_random_permutation"] = model * clients * (1 - 1 / nodes)
    expected["flower_server_bytes"] = 2 * model * clients  # every model through the server
    expected["allreduce_per_node_bytes"] = 2 * model * (nodes - 1) / nodes if aggregated else 0
    return expected


def measure(nodes: int, workers_per_node: int, rounds: int, resnet_clients: int,
            data_root: str, scratch: Path, only: list[str] | None) -> list[dict]:
    from ray.cluster_utils import Cluster  # (after raysim's import set Ray's authentication)

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 500 * 2**20})
    results = []
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=workers_per_node, object_store_memory=2 * 2**30)
        cluster.wait_for_nodes()
        for (method, model_name), (workload, model) in RUNS.items():
            if only and f"{method}-{model_name}" not in only:
                continue
            dataset, real = workload_dataset(workload, data_root, scratch)
            raw = run_config(workload, model, dataset, rounds, nodes * workers_per_node,
                             resnet_clients)
            raw["engine"]["address"] = cluster.address
            started = time.perf_counter()
            outcome = run_experiment(parse_config(raw), output=str(scratch / "runs"),
                                     progress=False)[0]
            import ray

            ray.shutdown()
            if outcome.error is not None:
                raise RuntimeError(f"{method} {model_name}: {outcome.error}")
            size = model_bytes(raw)
            transfers = load(outcome.run_dir, "transfers")
            table = load(outcome.run_dir)
            counted = per_round(transfers, table)
            for row in counted:
                aggregated = row.get("partial_in_objects", 0) > 0
                row["expected"] = arithmetic(method, size, nodes, workers_per_node,
                                             row["clients"], aggregated, size <= INLINE_BYTES)
            results.append({
                "method": method, "model": model_name, "workload": workload,
                "model_bytes": size, "nodes": nodes, "workers_per_node": workers_per_node,
                "clients": int(raw["partition"]["num_clients"]), "real_data": real,
                "seconds": round(time.perf_counter() - started, 1), "rounds": counted})
            print(json.dumps(summary(results[-1])), flush=True)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()
    return results


def summary(result: dict) -> dict:
    """A run's rounds in models: each counted figure over the model's bytes, beside its
    expected value (also in models)."""
    model = result["model_bytes"]
    lines = []
    for row in result["rounds"]:
        line = {"round": row["round"]}
        for key, value in row.items():
            if key.endswith("_bytes"):
                line[key.removesuffix("_bytes") + "_models"] = round(value / model, 3)
        line["expected_models"] = {k.removesuffix("_bytes"): round(v / model, 3)
                                   for k, v in row["expected"].items()}
        lines.append(line)
    return {"method": result["method"], "model": result["model"],
            "model_mb": round(model / 2**20, 2), "rounds": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--workers-per-node", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--resnet-clients", type=int, default=32)
    parser.add_argument("--only", nargs="*", help="runs by method-model, e.g. feddc-resnet18")
    parser.add_argument("--data-root", default=os.environ.get(
        "RAYSIM_TEST_MEDMNIST", str(Path.home() / ".medmnist")))
    parser.add_argument("--records", action="store_true",
                        help="append the results to records/cluster_bytes_cpu-<n>cores_<commit>")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raysim-cluster-bytes-") as scratch:
        results = measure(args.nodes, args.workers_per_node, args.rounds, args.resnet_clients,
                          args.data_root, Path(scratch), args.only)
    if args.records:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        path = record_path("cluster_bytes", f"cpu-{os.cpu_count()}cores", commit)
        command = "python experiments/benchmarks/cluster_bytes.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in
            [("nodes", args.nodes), ("rounds", args.rounds)])
        with path.open("a") as records:
            for result in results:
                records.write(json.dumps({**result, "commit": commit, "command": command,
                                          "date": time.strftime("%Y-%m-%d")}) + "\n")
        print(f"records: {path}")


if __name__ == "__main__":
    main()
