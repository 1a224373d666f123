"""A config's cost on a cluster of N nodes x G GPUs joined by links of B Gb/s, projected from
the rounds ``raysim estimate`` probed here (``--nodes``, ``--gpus-per-node``, ``--link-gbps``).

A round on the cluster is its compute, then what crosses the network, phase after phase:

- **compute**: the probe's worker seconds per round (``seconds_train``) scaled by the clients
  each worker runs one after another (``ceil(C / W)`` on the cluster's W workers against
  ``ceil(C / W_probe)`` in the probe), plus the rest of the probe's steady round (the driver's
  aggregation and bookkeeping, unchanged).
- **broadcast**: the probe's broadcast (one copy, from its ``transfers`` table) out of the
  driver's node to every other node once (Ray's object store pulls an object into a node once
  for all its workers; a broadcast under 100 KiB travels inline in every task instead).
- **partials**: into the driver's node, one object per other node holding that node's roots
  of the fixed reduction tree (:mod:`raysim.engine.run.cluster_links`): each root's weighted
  sums are as large as in the probe whatever clients they cover (float64: twice a float32
  model), contents that grow with the clients (concatenated lists) cross once for the other
  nodes' share of the clients. The roots per node come from the engine's layout of the
  config's client groups on the cluster's workers, for clients of equal cost.
- **relays** (FedDC's daisy chain): the probe's client states moved per round, each as large as
  a relayed state in the probe; for a uniformly random permutation, a state leaves its node
  with probability ``1 - s`` (``s``: the node's share of the clients, ``1/N`` on equal nodes),
  every node sending and receiving its share at once.

Each phase's bytes over the link rate (full duplex: a node sends and receives at B each way)
is its seconds. Beside raysim's: the floor of a ring all-reduce of the float32 mean (what
pfl-research's design moves: about ``2 (N - 1) / N`` models per node and aggregation) and
Flower's design, where every client's download and upload passes the server's link.

What is measured here and what is assumed is said with the projection: the compute term is
this machine's (a GPU cluster's rounds need a probe on a GPU), the bytes are the probe's, and
the rounds' mix of kinds (FedDC aggregating every b-th round) is the probe's rounds' mix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raysim.rounds.placement import assign_groups, client_groups
from raysim.vectors.reduction_tree import aligned_spans

if TYPE_CHECKING:
    import pandas as pd

    from raysim.configuration.experiment import ExperimentConfig

INLINE_BYTES = 100 * 1024
"""Ray sends a task's arguments below this size inline, in every task."""


@dataclass(frozen=True)
class ClusterShape:
    """Nodes, GPUs per node and the link rate between nodes."""

    nodes: int
    gpus_per_node: float
    link_gbps: float

    @property
    def link_bytes_per_s(self) -> float:
        return self.link_gbps * 1e9 / 8


@dataclass(frozen=True)
class ProbeTraffic:
    """What the probe's rounds handed off and spent, averaged per round."""

    rounds: int
    broadcast_bytes: float
    """One copy of the round's broadcast."""
    sum_bytes_per_root: float
    """A tree root's weighted sums (rounds without partials count as 0)."""
    listed_bytes: float
    """The round's partial contents that grow with the clients, over all its groups."""
    state_bytes: float
    """One relayed client state (0: the probe relayed none)."""
    moved_states: float
    """Client states moved to another client per round."""
    train_s: float
    """The workers' seconds per round (``seconds_train``)."""
    other_s: float
    """The rest of a steady round (the driver's aggregation and bookkeeping)."""
    down_bytes: float
    """The communication table's bytes down per round (every client's download)."""
    up_bytes: float
    """Its bytes up per round."""
    workers: int
    clients: int
    """Clients per round in the probe."""
    client_samples: tuple[float, ...] | None = None
    """Every client's training samples (the engine's load of a client) where the probe saw
    every client; else None (clients taken as equal)."""

    @classmethod
    def from_tables(cls, transfers: pd.DataFrame, rounds: pd.DataFrame,
                    communication: pd.DataFrame, workers: int, round_s: float,
                    clients: pd.DataFrame | None = None, num_clients: int = 0
                    ) -> ProbeTraffic:
        """From a probe run's ``transfers`` (``engine.count_transfers``), ``rounds`` and
        ``communication`` tables and its steady seconds per round; the first round (warm-up)
        is left out of the workers' seconds. ``clients`` (its clients table) gives the
        clients' loads where it holds all ``num_clients``."""
        count = max(1, int(rounds["round"].nunique())) if "round" in rounds else 1
        kinds = {kind: frame for kind, frame in transfers.groupby("kind")} \
            if "kind" in transfers else {}
        broadcast = kinds.get("broadcast")
        copies = 0.0 if broadcast is None else float(
            (broadcast.groupby("round")["bytes"].sum()
             / broadcast.groupby("round")["objects"].sum()).sum())
        partial = kinds.get("partial")
        sums = listed = 0.0
        if partial is not None:
            by_round = partial.groupby("round")[["bytes", "roots", "sum_bytes"]].sum()
            sums = float((by_round["sum_bytes"] / by_round["roots"].clip(lower=1)).sum())
            listed = float((by_round["bytes"] - by_round["sum_bytes"]).clip(lower=0).sum())
        relay, moved = kinds.get("relay"), kinds.get("moved")
        states = state_bytes = 0.0
        if relay is not None and int(relay["states"].sum()):
            states = float(relay["states"].sum())
            state_bytes = float(relay["bytes"].sum()) / states
        steady = rounds.iloc[1:] if len(rounds) > 1 else rounds
        train_s = min(float(steady["seconds_train"].mean()), round_s) \
            if "seconds_train" in steady else round_s
        directions = dict(communication.groupby("direction")["bytes"].sum()) \
            if "direction" in communication else {}
        return cls(count, copies / count, sums / count, listed / count, state_bytes,
                   0.0 if moved is None else float(moved["states"].sum()) / count,
                   train_s, round_s - train_s,
                   float(directions.get("down", 0)) / count,
                   float(directions.get("up", 0)) / count, workers,
                   int(rounds["clients_sampled"].mean()) if "clients_sampled" in rounds else 0,
                   _samples(clients, num_clients))


def _samples(clients: pd.DataFrame | None, num_clients: int) -> tuple[float, ...] | None:
    """Each client's training samples, where ``clients`` holds every one of them."""
    if clients is None or "num_samples" not in clients or not num_clients:
        return None
    sizes = clients.groupby("client")["num_samples"].first()
    if sorted(sizes.index) != list(range(num_clients)):
        return None
    return tuple(float(size) for size in sizes.sort_index())


@dataclass(frozen=True)
class RoundBytes:
    """What one round moves on a cluster, by link."""

    broadcast_out: float
    """Out of the driver's node."""
    partials_in: float
    """Into the driver's node."""
    relays_per_node: float
    """Relayed client states the busiest node sends to other nodes (and about as many it
    receives)."""
    relays_between: float
    """Relayed client states changing node, over all nodes."""


def workers_per_node(config: ExperimentConfig, shape: ClusterShape) -> int:
    """The config's workers a node holds: its GPUs over each worker's share (one per GPU
    when the config gives workers no GPU share)."""
    share = config.engine.gpus_per_worker
    return max(1, int(shape.gpus_per_node / share + 1e-9) if share > 0
               else int(shape.gpus_per_node))


def node_roots(num_clients: int, groups: int, nodes: int, per_node: Sequence[int],
               client_samples: Sequence[float] | None = None) -> list[int]:
    """The roots of the reduction tree each node holds: the aligned blocks of its range of
    groups, the engine's layout (``assign_groups`` over every worker, a node's workers
    adjacent, node 0 first) for clients of ``client_samples`` samples (equal when None)."""
    load = [1.0] * num_clients if client_samples is None else list(client_samples)
    sizes = [sum(load[c] for c in group) for group in client_groups(num_clients, groups)]
    ranges = assign_groups(sizes, sum(per_node))
    roots, first = [], 0
    for count in per_node[:nodes]:
        held = [group for r in ranges[first:first + count] for group in r]
        first += count
        roots.append(len(aligned_spans(min(held), max(held) + 1)) if held else 0)
    return roots


def round_bytes(config: ExperimentConfig, traffic: ProbeTraffic, nodes: int,
                per_node: Sequence[int]) -> RoundBytes:
    """What a round of ``config`` moves on ``nodes`` nodes holding ``per_node`` workers each
    (node 0 is the driver's), from the probe's ``traffic``."""
    remote_workers = sum(per_node[1:nodes])
    remote_nodes = sum(1 for count in per_node[1:nodes] if count)
    broadcast = traffic.broadcast_bytes * (
        remote_nodes if traffic.broadcast_bytes > INLINE_BYTES else remote_workers)
    roots = node_roots(config.partition.num_clients, config.engine.client_groups, nodes,
                       per_node, traffic.client_samples)
    share = remote_workers / max(sum(per_node[:nodes]), 1)
    scale = config.clients_per_round / max(traffic.clients, 1)
    partials = traffic.sum_bytes_per_root * sum(roots[1:]) + \
        traffic.listed_bytes * scale * share
    # a uniformly random permutation sends a state from node i elsewhere with probability
    # 1 - s_i, s_i: node i's share of the clients (of the workers, clients of equal cost)
    shares = [count / max(sum(per_node[:nodes]), 1) for count in per_node[:nodes]]
    moved = traffic.moved_states * scale * traffic.state_bytes
    leaving = [moved * share * (1 - share) for share in shares]
    return RoundBytes(broadcast, partials, max(leaving, default=0.0), sum(leaving))


@dataclass(frozen=True)
class ClusterRound:
    """One variant's round and run on one cluster shape."""

    shape: ClusterShape
    workers: int
    bytes: RoundBytes
    compute_s: float
    broadcast_s: float
    partials_s: float
    relays_s: float
    allreduce_floor_s: float
    flower_s: float
    """Flower's design: every client's download and upload through the server's link."""

    @property
    def round_s(self) -> float:
        return self.compute_s + self.broadcast_s + self.partials_s + self.relays_s


def cluster_round(config: ExperimentConfig, traffic: ProbeTraffic, shape: ClusterShape
                  ) -> ClusterRound:
    """A round of ``config`` on ``shape`` (see the module docstring)."""
    per_node = workers_per_node(config, shape)
    workers = per_node * shape.nodes
    clients = config.clients_per_round
    compute = traffic.train_s * math.ceil(clients / workers) / math.ceil(
        max(traffic.clients, 1) / traffic.workers) + traffic.other_s
    moved = round_bytes(config, traffic, shape.nodes, [per_node] * shape.nodes)
    rate = shape.link_bytes_per_s
    model = traffic.sum_bytes_per_root / 2  # the float32 mean of an aggregating round
    floor = 2 * model * (shape.nodes - 1) / shape.nodes / rate
    scale = clients / max(traffic.clients, 1)
    flower = max(traffic.down_bytes, traffic.up_bytes) * scale / rate
    return ClusterRound(shape, workers, moved, compute, moved.broadcast_out / rate,
                        moved.partials_in / rate, moved.relays_per_node / rate, floor, flower)


def cluster_rows(configs: dict[str, ExperimentConfig], traffic: dict[str, ProbeTraffic],
                 evaluation_s: dict[str, float], evaluations: dict[str, int],
                 shapes: Sequence[ClusterShape]) -> list[dict[str, object]]:
    """One row per variant and cluster shape: the round's phases, a run, every run of the
    config one after another (each on the whole cluster) and the GPU-hours."""
    rows = []
    for label, config in configs.items():
        if label not in traffic:
            continue
        for shape in shapes:
            projected = cluster_round(config, traffic[label], shape)
            run_s = config.training.rounds * projected.round_s + \
                evaluations[label] * evaluation_s[label]
            runs = len(config.seeds)
            rows.append({
                "variant": label or "(config)", "nodes": shape.nodes,
                "gpus_per_node": shape.gpus_per_node, "link_gbps": shape.link_gbps,
                "workers": projected.workers,
                "compute_s": _significant(projected.compute_s),
                "broadcast_s": _significant(projected.broadcast_s),
                "partials_s": _significant(projected.partials_s),
                "relays_s": _significant(projected.relays_s),
                "round_s": _significant(projected.round_s),
                "into_driver_node_mb": round(projected.bytes.partials_in / 2**20, 2),
                "out_of_driver_node_mb": round(projected.bytes.broadcast_out / 2**20, 2),
                "relays_per_node_mb": round(projected.bytes.relays_per_node / 2**20, 2),
                "allreduce_floor_s": _significant(projected.allreduce_floor_s),
                "flower_server_link_s": _significant(projected.flower_s),
                "run_hours": round(run_s / 3600, 3), "runs": runs,
                "all_runs_hours": round(run_s * runs / 3600, 3),
                "gpu_hours": round(run_s * runs * shape.nodes * shape.gpus_per_node / 3600, 2)})
    return rows


def _significant(value: float) -> float:
    """``value`` to 4 significant digits."""
    return float(f"{value:.4g}")


def unmeasured_relays(traffic: dict[str, ProbeTraffic]) -> list[str]:
    """The variants whose probe moved client states but relayed none between workers (one
    worker): the size of a relayed state, and so the relays' term, is unknown."""
    return [label or "(config)" for label, probe in traffic.items()
            if probe.moved_states and not probe.state_bytes]


def without_partials(traffic: dict[str, ProbeTraffic]) -> list[str]:
    """The variants whose probed rounds sent no partial (e.g. FedDC aggregating every b-th
    round, b beyond the probe's rounds): their projection has no partials' term."""
    return [label or "(config)" for label, probe in traffic.items()
            if not probe.sum_bytes_per_root and not probe.listed_bytes]


def describe_cluster(rows: list[dict[str, object]], device: str,
                     unmeasured: Sequence[str] = (), no_partials: Sequence[str] = ()) -> str:
    """The cluster projection as a table and the lines that say what it assumes."""
    lines = ["variant | nodes x GPUs | Gb/s | compute s | broadcast s | partials s | relays s | "
             "round s | all-reduce floor s | Flower server s | all runs | GPU-hours",
             "--- | --- | --- | --- | --- | --- | --- | --- | --- | --- | ---"]
    for r in rows:
        seconds = " | ".join(f"{float(r[key]):.3g}" for key in (  # type: ignore[arg-type]
            "compute_s", "broadcast_s", "partials_s", "relays_s", "round_s",
            "allreduce_floor_s", "flower_server_link_s"))
        lines.append(
            f"{r['variant']} | {r['nodes']} x {r['gpus_per_node']:g} | {r['link_gbps']:g} | "
            f"{seconds} | {r['all_runs_hours']} h | {r['gpu_hours']}")
    lines += [
        "",
        f"how: compute = the probe's worker seconds per round ({device}) scaled by the "
        "clients each worker runs one after another, plus the probe's driver seconds; "
        "broadcast, partials and relays = the probe's counted bytes placed on the cluster "
        "(broadcast once per node, one object of tree roots per node, a share 1 - 1/N of "
        "relayed states changing node) over the link rate, one phase after another. The "
        "all-reduce floor is a ring all-reduce of the float32 mean; Flower's column moves "
        "every client's download and upload through the server's link. Runs one after another, "
        "each on the whole cluster."]
    if no_partials:
        lines.append(f"no partials in the probe: {', '.join(no_partials)} aggregated in none of "
                     "its probed rounds (an aggregation every few rounds), so the rounds that "
                     "aggregate are not in the projection; pass --rounds beyond the aggregation "
                     "period to count them.")
    if unmeasured:
        lines.append(f"relays not counted: {', '.join(unmeasured)} moved client states within "
                     "its one worker, so no relayed state was measured; probe with "
                     "`--set engine.num_workers=2` to count them.")
    return "\n".join(lines)


__all__ = ["ClusterRound", "ClusterShape", "ProbeTraffic", "RoundBytes", "cluster_round",
           "cluster_rows", "describe_cluster", "node_roots", "round_bytes", "unmeasured_relays",
           "without_partials", "workers_per_node"]
