"""Local-training throughput of raysim against a plain PyTorch loop and the machine's limit.

Workload: FedAvg, ConvNet width 128 depth 3 on 28x28x1 inputs, 100 clients x 64
samples, 1 local epoch, batch 32, SGD lr 0.01 momentum 0.9, 3 rounds, 2 workers of 1 CPU each,
no evaluation. In one invocation it measures

(a) raysim's local-training samples/s in steady state (rounds after the first; Ray start-up and
    the first round reported separately),
(b) a plain PyTorch loop training the same clients one after another in one process,
(c) the machine's limit: one process per worker, one thread each, each training one model on
    its share of the samples with no federated bookkeeping,

and prints one JSON line with the three figures and the ratios raysim/plain and raysim/limit.

    python experiments/benchmarks/throughput.py [--clients 100] [--samples 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from raysim.config import parse_config
from raysim.data.dataset import DataInfo, to_tensor
from raysim.data.generated import write_medmnist_npz
from raysim.engine.runner import run_experiment
from raysim.models import MODELS, build_model
from raysim.results import load

INFO = DataInfo("pneumoniamnist", "image", 2, (1, 28, 28), (0.5,), (0.5,))
MODEL = MODELS["convnet"].params(width=128, depth=3, norm="instance")


def workload(root: Path, clients: int, samples: int, rounds: int, workers: int) -> dict:
    return {
        "name": "throughput",
        "dataset": {"name": "pneumoniamnist", "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": clients, "samples_per_client": samples},
        "model": MODEL.model_dump(),
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 32,
                     "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9}},
        "evaluation": {"every": 0},
        "engine": {"num_workers": workers, "cpus_per_worker": 1},
    }


def measure_raysim(config: dict, output: Path) -> dict:
    started = time.perf_counter()
    outcome = run_experiment(parse_config(config), output=str(output), progress=False)[0]
    total = time.perf_counter() - started
    rounds = load(outcome.run_dir)
    clients = load(outcome.run_dir, "clients")
    per_round = rounds["seconds_train"] + rounds["seconds_aggregate"]
    samples = clients.groupby("round")["num_samples"].sum()
    steady = samples.iloc[1:].sum() / per_round.iloc[1:].sum()
    return {"raysim_samples_per_s": float(steady),
            "raysim_first_round_s": float(per_round.iloc[0]),
            "raysim_startup_s": float(total - per_round.sum())}


def _train_batches(model, x, y, batch_size: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for start in range(0, len(y), batch_size):
        optimizer.zero_grad()
        loss_fn(model(x[start:start + batch_size]), y[start:start + batch_size]).backward()
        optimizer.step()


def measure_plain(images: np.ndarray, labels: np.ndarray, clients: int, samples: int,
                  rounds: int) -> float:
    """FedAvg as a plain loop: clients one after another in this process, all threads."""
    torch.manual_seed(0)
    model = build_model(MODEL, INFO)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    x_all = to_tensor(images[: clients * samples], INFO)
    y_all = torch.from_numpy(labels[: clients * samples].astype(np.int64))
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        for client in range(clients):
            model.load_state_dict(global_state)
            part = slice(client * samples, (client + 1) * samples)
            _train_batches(model, x_all[part], y_all[part], 32)
            for k, v in model.state_dict().items():
                total[k] += v.double()
        global_state = {k: (v / clients).to(global_state[k].dtype) for k, v in total.items()}
        timings.append(time.perf_counter() - started)
    return clients * samples / float(np.mean(timings[1:]))


def _limit_worker(args: tuple) -> float:
    images, labels, repeats = args
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(MODEL, INFO)
    x = to_tensor(images, INFO)
    y = torch.from_numpy(labels.astype(np.int64))
    _train_batches(model, x[:64], y[:64], 32)  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        _train_batches(model, x, y, 32)
    return time.perf_counter() - started


def measure_limit(images: np.ndarray, labels: np.ndarray, total: int, workers: int,
                  repeats: int) -> float:
    shares = np.array_split(np.arange(total), workers)
    with mp.get_context("spawn").Pool(workers) as pool:
        seconds = pool.map(_limit_worker, [(images[s], labels[s], repeats) for s in shares])
    return total * repeats / max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    total = args.clients * args.samples
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_medmnist_npz(root / "data", n_train=total, n_test=64)
        with np.load(root / "data" / "pneumoniamnist.npz") as npz:
            images, labels = npz["train_images"], npz["train_labels"].reshape(-1)
        result = {"workload": f"fedavg convnet128x3 28px {args.clients}x{args.samples} "
                              f"{args.rounds} rounds {args.workers} workers"}
        result.update(measure_raysim(workload(root / "data", args.clients, args.samples,
                                              args.rounds, args.workers), root / "out"))
    import ray

    ray.shutdown()
    result["plain_samples_per_s"] = measure_plain(images, labels, args.clients, args.samples,
                                                  args.rounds)
    result["limit_samples_per_s"] = measure_limit(images, labels, total, args.workers,
                                                  max(1, args.rounds - 1))
    result["raysim_over_plain"] = result["raysim_samples_per_s"] / result["plain_samples_per_s"]
    result["raysim_over_limit"] = result["raysim_samples_per_s"] / result["limit_samples_per_s"]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
