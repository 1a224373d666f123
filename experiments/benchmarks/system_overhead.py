"""What the simulated clock costs (the target: <= 5 % of a run's wall time): the
``mlp32-1000x4-synthetic`` workload (``workloads.py``: 1,000 clients x 4 samples of the
synthetic set, 100 per round, an MLP, one local step, 50 rounds, FedAvg on 2 workers of 1 CPU)
run without
``system:`` and with it under each policy (sync, deadline, overselect, fedbuff; the three
built-in tiers), alternating, in one Ray session. One JSON line per configuration: the median
over repeats of the steady rounds' seconds (rounds 5 on, from the ``rounds`` table's
wall_time) and of the whole ``run_experiment`` call (``run_seconds``: preparation, the clock's
planning, actors, every round; the run's wall time) and the planning time of the clock
alone; ``overhead`` and ``run_overhead`` = with / without - 1 (of the medians), and
``run_overhead_paired`` the median over repeats of each run against the plain run of its repeat.
Beside the end-to-end ratio (which this machine's drift of 15-30 % between minutes can hide),
the clock's own work measured alone: planning (once per run, on the driver, in a thread while
the workers are configured; measured here on its own), the config check of ``system:``
(``config_check_seconds``) and recording (per round, on the driver: the clock's rows and
columns and their Parquet write), and ``clock_share_of_plain_round`` = (planning + recording
per round) / the run without ``system:``'s seconds per round. For FedBuff also its work on a
client worker alone (``fedbuff_worker_ms``: the FedBuff layer training from several start
versions and its staleness-weighted partials per client group, merged along the reduction
tree, against the same clients from one model: ``fedbuff_worker_extra``).

    python experiments/benchmarks/system_overhead.py [--repeats 3] [--policies sync fedbuff]
        [--algorithm fedprox] [--hidden 1024 1024]

``--algorithm fedprox`` runs the workload with FedProx (mu 0.01) instead of FedAvg: under FedBuff each
client's proximal anchor is its own start version. ``--hidden`` sets the MLP's hidden layers
(default 32, about 1,000 parameters; 1024 1024: about 1.08 M, where moving weights costs).

``run_overhead_paired_mean`` and ``run_overhead_paired_t``: the mean of the paired differences
and its t statistic, leaving out the first pair (it includes the pool's start). ``--runs-only``
skips the in-process probes, so that ``PYTHONPATH=<older checkout>`` times an older tree's runs
with this script (alternate the trees' invocations: the machine drifts between minutes).

``--cold N`` measures instead what a user's command costs: ``raysim run`` of each config as a
new process (its own Ray, workers and driver started from nothing), the configurations
alternating N times; one JSON line per configuration with the median seconds of the command
and the median over the N alternations of its difference to the run without ``system:``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import raysim_config

from raysim.configuration.experiment import parse_config
from raysim.engine.runner import run_experiment
from raysim.preparation import initial_weights, prepare, run_context
from raysim.results import load

TIERS = {"workstation_gpu": 0.2, "cpu_server": 0.4, "constrained_site": 0.4}


def with_system(raw: dict[str, Any], policy: str | None) -> dict[str, Any]:
    """The workload's config with (or, for None, without) a ``system:`` section of
    ``policy``."""
    raw = {**raw, "name": f"w3-{policy or 'none'}"}
    if policy is not None:
        raw["system"] = {"tiers": TIERS, "policy": policy,
                         **({"deadline_s": 0.002} if policy == "deadline" else {})}
    return raw


def steady_seconds(raw: dict[str, Any], scratch: str) -> tuple[float, float]:
    """(median seconds per round from round 5 on (the rounds table's wall clock), seconds of
    the whole run_experiment call: preparation, the clock's planning, actors, every round)."""
    started = time.perf_counter()
    outcome = run_experiment(parse_config(raw), output=scratch, progress=False)[0]
    whole = time.perf_counter() - started
    assert outcome.error is None, outcome.error
    stamps = load(outcome.run_dir)["wall_time"].to_numpy()
    return float(np.median(np.diff(stamps[4:]))), whole


def timed_plan(raw: dict[str, Any]) -> tuple[Any, float]:
    """The clock's plan of the whole run and the seconds it took (alone, in this process)."""
    from raysim.system.plan import architecture_flops
    from raysim.system.planning import ClockSettings, plan_for_run

    config = parse_config(raw)
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    weights = initial_weights(config, dataset, 0)
    # counted before the timer, as a client worker counts them for the driver
    flops = architecture_flops(context, partition.num_clients)
    started = time.perf_counter()
    assert config.system is not None
    plan = plan_for_run(ClockSettings(config.system, config.clients_per_round), context,
                        partition, weights, flops)
    return plan, time.perf_counter() - started


def config_check_seconds(raw: dict[str, Any], repeats: int = 20) -> float:
    """The fastest of ``repeats`` runs of the ``system:`` section's config check (before the
    run, in the starting process)."""
    from raysim.layers.simulated_clock import check as check_system

    config = parse_config(raw)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        check_system(config)
        best = min(best, time.perf_counter() - started)
    return best


def fedbuff_worker_ms(raw: dict[str, Any], plan: Any, round_: int = 30,
                     repeats: int = 200) -> dict[str, float]:
    """FedBuff's own work on a client worker, measured alone (in-process, one thread): one
    worker's half of round ``round_``'s buffer (the plan's clients with even ids) trained by
    the FedBuff layer around the config's algorithm (the wrapped local updates once per start
    version) and reduced per client group (the engine's 64) into staleness-weighted partials
    merged along the reduction tree, against the same clients trained by the algorithm alone
    from the round's model; median ms of each over ``repeats`` alternating calls."""
    import torch
    from per_client_overhead import Worker

    from raysim.algorithms import ALGORITHMS
    from raysim.layers.fedbuff import MESSAGE, FedBuff
    from raysim.vectors.reduction_tree import subtree_roots
    from raysim.vectors.weighted_sum import merge_partials, settle
    from raysim.vectors.weights import FlatWeights, on_device

    torch.set_num_threads(1)
    worker = Worker(raw)
    runtime = worker.runtime
    algorithm = ALGORITHMS[raw["algorithm"]["name"]](parse_config(raw).algorithm,
                                                     worker.context)
    layer = FedBuff(algorithm, 1.0)
    current = on_device(worker.start, runtime.device)
    starts = plan.records.buffered(round_)
    clients = [c for c in starts[0].tolist() if c % 2 == 0]
    bases = {v: FlatWeights(torch.as_tensor(current.vector) * (1 - 0.001 * (round_ - v)),
                            current.layout, current.extras)
             for v in set(starts[1].tolist()) if v != round_}
    message = {"model": current, MESSAGE: {"starts": starts, "bases": bases}}
    groups = sorted(set(worker.group_of[clients].tolist()))
    members = {g: [c for c in clients if worker.group_of[c] == g] for g in groups}

    def reduced(done: Any, reduce: Any) -> None:
        """Each group's partial, merged along the tree and settled."""
        by_client = dict(zip(clients, done, strict=True))
        partials = {g: reduce([(c, by_client[c]) for c in members[g]]) for g in groups}
        settle(subtree_roots(partials, groups[0], groups[-1] + 1, merge_partials))

    def synchronous() -> None:
        reduced(algorithm.local_updates(runtime, clients, round_, message,
                                        [None] * len(clients)), algorithm.reduce)

    def fedbuff() -> None:
        reduced(layer.local_updates(runtime, clients, round_, message, [None] * len(clients)),
                layer.reduce)

    timings: dict[str, list[float]] = {"sync": [], "fedbuff": []}
    for _ in range(repeats):
        for label, work in (("sync", synchronous), ("fedbuff", fedbuff)):
            started = time.perf_counter()
            work()
            timings[label].append((time.perf_counter() - started) * 1000)
    sync, fed = (float(np.median(timings[k])) for k in ("sync", "fedbuff"))
    return {"fedbuff_worker_clients": len(clients), "fedbuff_worker_ms": round(fed, 3),
            "sync_worker_ms": round(sync, 3), "fedbuff_worker_extra": round(fed / sync - 1, 3)}


def recording_seconds_per_round(plan: Any) -> float:
    """Seconds per round of the clock's work on the driver for its records, measured alone:
    computing every round's records with the plan (:class:`ClockRecords`), then per round
    the rounds row's clock columns, the ``system`` table's rows and the clients' clock columns
    (what the round loop adds per round with ``system:``), and writing those rows to Parquet,
    over every round of ``plan``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from raysim.system.records import ClockRecords

    parts = []
    started = time.perf_counter()
    records = ClockRecords(plan.rounds, plan.tiers)
    for round_ in range(len(plan.rounds)):  # what the round loop does per round
        records.columns(round_)
        parts.append(pa.table(records.table(round_)))
        records.clock_columns(round_, records.trained(round_))
    with tempfile.TemporaryDirectory() as scratch:
        pq.write_table(pa.concat_tables(parts), Path(scratch) / "system.parquet")
    return (time.perf_counter() - started) / len(plan.rounds)


def cold_commands(base: dict[str, Any], labels: list[str | None], alternations: int) -> None:
    """Seconds of ``raysim run`` as a new process per configuration (see the module
    docstring), printed as one JSON line each."""
    import subprocess

    import yaml

    seconds: dict[str | None, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as scratch:
        paths = {}
        for label in labels:
            paths[label] = Path(scratch) / f"w3-{label or 'none'}.yaml"
            paths[label].write_text(yaml.safe_dump(with_system(base, label)))
        for _ in range(alternations):
            for label in labels:
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(paths[label]),
                                "--output", str(Path(scratch) / "results"), "--no-progress"],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               cwd=scratch)  # (not the checkout: PYTHONPATH picks the tree)
                seconds[label].append(time.perf_counter() - started)
    plain = np.array(seconds[None])
    for label in labels:
        mine = np.array(seconds[label])
        print(json.dumps({"policy": label or "none", "cold": True,
                          "command_seconds": round(float(np.median(mine)), 3),
                          "repeats": [round(float(t), 3) for t in mine],
                          "paired_extra_seconds": round(float(np.median(mine - plain)), 3),
                          "paired_overhead": round(float(np.median(mine / plain)) - 1, 3)}),
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--policies", nargs="+",
                        default=["sync", "deadline", "overselect", "fedbuff"])
    parser.add_argument("--algorithm", choices=["fedavg", "fedprox"], default="fedavg")
    parser.add_argument("--hidden", type=int, nargs="+", default=[32])
    parser.add_argument("--runs-only", action="store_true",
                        help="only the end-to-end runs (no in-process probes: runs against an "
                        "older tree with PYTHONPATH=<checkout>)")
    parser.add_argument("--cold", type=int, default=0, metavar="N",
                        help="time N alternations of `raysim run` as new processes instead")
    args = parser.parse_args()
    base = raysim_config("mlp32-1000x4-synthetic", {"name": "synthetic"})
    base = {**base, "training": {**base["training"], "rounds": args.rounds},
            "model": {"name": "mlp", "hidden": args.hidden},
            "algorithm": {"name": args.algorithm,
                          **({"mu": 0.01} if args.algorithm == "fedprox" else {})}}
    if args.cold:
        cold_commands(base, [None, *args.policies], args.cold)
        return
    labels = [None, *args.policies]
    timings: dict[str | None, list[float]] = {label: [] for label in labels}
    wholes: dict[str | None, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.repeats):
            for label in labels:
                steady, whole = steady_seconds(with_system(base, label), scratch)
                timings[label].append(steady)
                wholes[label].append(whole)
    plain = float(np.median(timings[None]))
    plain_whole = float(np.median(wholes[None]))
    for label in labels:
        seconds = float(np.median(timings[label]))
        whole = float(np.median(wholes[label]))
        row = {"policy": label or "none", "seconds_per_round": round(seconds, 4),
               "repeats": [round(t, 5) for t in timings[label]],
               "overhead": round(seconds / plain - 1, 3), "run_seconds": round(whole, 3),
               "run_repeats": [round(t, 3) for t in wholes[label]],
               "run_overhead": round(whole / plain_whole - 1, 3),
               # each repeat against the plain run just before it: the machine's drift
               # between minutes cancels within a pair
               "run_overhead_paired": round(float(np.median(
                   np.array(wholes[label]) / np.array(wholes[None]))) - 1, 3)}
        if label is not None and args.repeats > 2:  # the first pair includes the pool's start
            pairs = np.array(wholes[label][1:]) / np.array(wholes[None][1:]) - 1
            row["run_overhead_paired_mean"] = round(float(pairs.mean()), 4)
            row["run_overhead_paired_t"] = round(float(
                pairs.mean() / (pairs.std(ddof=1) / np.sqrt(len(pairs)))), 2)
        if label is not None and not args.runs_only:
            raw = with_system(base, label)
            plan, planning = timed_plan(raw)
            row["planning_seconds_whole_run"] = round(planning, 4)
            row["planning_seconds_per_round"] = round(row["planning_seconds_whole_run"]
                                                      / raw["training"]["rounds"], 5)
            row["config_check_seconds"] = round(config_check_seconds(raw), 5)
            recording = recording_seconds_per_round(plan)
            row["recording_seconds_per_round"] = round(recording, 5)
            row["clock_share_of_plain_round"] = round(
                (recording + row["planning_seconds_per_round"]) / plain, 4)
            if label == "fedbuff":
                row.update(fedbuff_worker_ms(raw, plan, round_=min(30, len(plan.rounds) - 1)))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
