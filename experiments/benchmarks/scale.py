"""Scale: memory and rounds per second with 100, 1,000 and 10,000 virtual clients.

Workload (experiments/scale/synthetic_10k.yaml with the client count changed): FedAvg on the
built-in ``synthetic`` set (40,000 training rows, 30 features), 4 rows per client, 100 clients
sampled per round (all of them at 100 clients), one local SGD step, MLP (hidden 32), 2 workers,
evaluation on the 10,000-row test set every 100 rounds.

For each client count, one JSON line: raysim's steady-state rounds per second (first to last
round), start-up seconds (Ray, partition, workers), the driver's and the largest worker's
resident memory at 10% of the rounds and at the end and the growth rate fitted over the second
half (MiB per 1,000 rounds); and a plain PyTorch loop in this process over the same clients
(one model, weights loaded per sampled client, one SGD step, sample-weighted average), its
rounds per second and the ratio.

    python experiments/benchmarks/scale.py [--clients 100 1000 10000] [--rounds 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from raysim.configuration.experiment import load_config
from raysim.data import load_dataset, make_partition, to_tensor
from raysim.engine.runner import run_experiment
from raysim.models import build_model
from raysim.results import load
from raysim.rounds.process_memory import resident_memory_mb
from raysim.seeding import numpy_rng

CONFIG = Path(__file__).resolve().parents[1] / "scale" / "synthetic_10k.yaml"


def config_for(clients: int, rounds: int):
    return load_config(CONFIG, [f"partition.num_clients={clients}", f"training.rounds={rounds}",
                                f"training.clients_per_round={min(100, clients)}",
                                "evaluation.every=100", "engine.flush_seconds=5"])


def measure_raysim(clients: int, rounds: int, output: Path) -> dict:
    started = time.perf_counter()
    outcome = run_experiment(config_for(clients, rounds), output=str(output), progress=False)[0]
    total = time.perf_counter() - started
    frame = load(outcome.run_dir)
    span = frame["wall_time"].iloc[-1] - frame["wall_time"].iloc[0]
    early = frame.iloc[max(1, rounds // 10)]
    late = frame.iloc[rounds // 2:]
    growth = {name: float(np.polyfit(late["round"], late[f"{name}_memory_mb"], 1)[0] * 1000)
              for name in ("driver", "worker")}
    return {
        "raysim_rounds_per_s": (len(frame) - 1) / span,
        "raysim_startup_s": total - span,
        "final_accuracy": float(frame["accuracy"].dropna().iloc[-1]),
        "driver_mb_early": float(early["driver_memory_mb"]),
        "driver_mb_end": float(frame["driver_memory_mb"].iloc[-1]),
        "worker_mb_early": float(early["worker_memory_mb"]),
        "worker_mb_end": float(frame["worker_memory_mb"].iloc[-1]),
        "driver_mb_per_1000_rounds": growth["driver"],
        "worker_mb_per_1000_rounds": growth["worker"],
    }


def measure_plain(clients: int, rounds: int) -> dict:
    """FedAvg as a plain loop: one model, weights loaded for each sampled client."""
    config = config_for(clients, rounds)
    dataset = load_dataset(config.dataset, None)
    partition = make_partition(dataset.train_y, dataset.test_y, config.partition,
                               dataset.info.num_classes, 0)
    x = to_tensor(dataset.train_x, dataset.info)
    y = torch.from_numpy(dataset.train_y)
    torch.manual_seed(0)
    model = build_model(config.model, dataset.info)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_fn = torch.nn.CrossEntropyLoss()
    per_round = config.clients_per_round
    started = None
    for round_ in range(rounds + 1):
        if round_ == 1:
            started = time.perf_counter()  # round 0 is warm-up
        sampled = numpy_rng(0, "sample", round_).choice(clients, per_round, replace=False)
        total = {k: torch.zeros_like(v) for k, v in global_state.items()}
        weight = 0
        for client in sampled:
            model.load_state_dict(global_state)
            optimizer = torch.optim.SGD(model.parameters(), lr=config.training.optimizer.lr)
            index = torch.from_numpy(partition.train[client])
            optimizer.zero_grad()
            loss_fn(model(x[index]), y[index]).backward()
            optimizer.step()
            for k, v in model.state_dict().items():
                total[k] += v * len(index)
            weight += len(index)
        global_state = {k: v / weight for k, v in total.items()}
    return {"plain_rounds_per_s": rounds / (time.perf_counter() - started),
            "plain_process_mb": resident_memory_mb()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", nargs="+", type=int, default=[100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--plain-rounds", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for clients in args.clients:
            result = {"clients": clients, "rounds": args.rounds,
                      "clients_per_round": min(100, clients)}
            result.update(measure_raysim(clients, args.rounds, Path(tmp) / str(clients)))
            result.update(measure_plain(clients, args.plain_rounds))
            result["raysim_over_plain"] = result["raysim_rounds_per_s"] / result[
                "plain_rounds_per_s"]
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
