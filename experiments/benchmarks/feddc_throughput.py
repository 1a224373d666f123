"""FedDC rounds per second: raysim against a plain per-client PyTorch loop.

Workloads (one JSON line each, both measured in this invocation):

(i)  ``tabular``: FedDC (d=1, b=10) on breast-cancer-shaped tabular data (the built-in
     ``synthetic`` set: 30 features, 2 classes), 400 clients x 4 samples, MLP (hidden 32),
     1 local SGD step per round, 500 rounds. Target >= 10x the plain loop.
(ii) ``pneumonia``: FedDC (d=1, b=10) on PneumoniaMNIST, 150 clients x 8 samples, ConvNet
     width 32 depth 3 at 28 px, 1 local step per round, 200 rounds, 2 workers. Target >= 1.2x.
     Uses the real file from --data-root when present, else a generated file of that layout.

The plain loop keeps one nn.Module and one torch.optim.SGD per client in one process (all
threads), takes one step per client per round on a batch from the client's data, permutes the
model list on daisy-chaining rounds and averages all models on aggregation rounds. raysim runs
without evaluation; its rate is measured from the first to the last round's completion
(start-up excluded and reported separately).

    python experiments/benchmarks/feddc_throughput.py [--workload tabular pneumonia]
        [--data-root DIR] [--rounds-tabular 500] [--rounds-pneumonia 200]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from raysim.config import parse_config
from raysim.data import load_dataset, to_tensor
from raysim.data.generated import write_medmnist_npz
from raysim.engine.runner import run_experiment
from raysim.models import build_model
from raysim.results import load


def feddc_config(dataset: dict, clients: int, samples: int, model: dict, rounds: int,
                 workers: int, lr: float) -> dict:
    return {
        "name": "feddc-bench", "dataset": dataset,
        "partition": {"scheme": "iid", "num_clients": clients, "samples_per_client": samples},
        "model": model,
        "algorithm": {"name": "feddc", "daisy_period": 1, "aggregation_period": 10},
        "training": {"rounds": rounds, "local_steps": 1, "batch_size": samples,
                     "optimizer": {"name": "sgd", "lr": lr}},
        "evaluation": {"every": 0},
        "engine": {"num_workers": workers, "cpus_per_worker": 1, "flush_seconds": 5.0},
    }


def measure_raysim(config: dict, output: Path) -> dict:
    started = time.perf_counter()
    outcome = run_experiment(parse_config(config), output=str(output), progress=False)[0]
    total = time.perf_counter() - started
    rounds = load(outcome.run_dir)
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    span = rounds["wall_time"].iloc[-1] - rounds["wall_time"].iloc[0]
    per_second = (len(rounds) - 1) / span
    return {"raysim_rounds_per_s": per_second,
            "raysim_startup_s": total - span,
            "training_path": manifest["workers"][0]["training_path"]}


def measure_plain(config: dict, data_root: str | None, rounds: int) -> float:
    """FedDC as a plain loop over per-client models in one process."""
    parsed = parse_config(config)
    dataset = load_dataset(parsed.dataset, data_root)
    clients, samples = parsed.partition.num_clients, parsed.partition.samples_per_client
    rng = np.random.default_rng(0)
    chosen = rng.permutation(len(dataset.train_y))[: clients * samples].reshape(clients, samples)
    x = to_tensor(dataset.train_x[chosen.reshape(-1)], dataset.info)
    x = x.reshape(clients, samples, *x.shape[1:])
    y = torch.from_numpy(dataset.train_y[chosen])
    torch.manual_seed(0)
    models = [build_model(parsed.model, dataset.info) for _ in range(clients)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=parsed.training.optimizer.lr)
                  for m in models]
    loss_fn = torch.nn.CrossEntropyLoss()
    batch = parsed.training.batch_size
    started = None
    for t in range(rounds + 1):
        if t == 1:
            started = time.perf_counter()  # round 0 is warm-up
        for i in range(clients):
            order = rng.permutation(samples)[:batch]
            optimizers[i].zero_grad()
            loss_fn(models[i](x[i, order]), y[i, order]).backward()
            optimizers[i].step()
        if t % 10 == 9:
            with torch.no_grad():
                states = [m.state_dict() for m in models]
                average = {k: torch.stack([s[k].float() for s in states]).mean(0)
                           for k in states[0]}
                for m in models:
                    m.load_state_dict(average)
        else:
            permutation = rng.permutation(clients)
            models = [models[j] for j in np.argsort(permutation)]
            optimizers = [optimizers[j] for j in np.argsort(permutation)]
    return rounds / (time.perf_counter() - started)


def workload(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    if name == "tabular":
        dataset = {"name": "synthetic"}
        config = feddc_config(dataset, 400, 4, {"name": "mlp", "hidden": [32]},
                              args.rounds_tabular, args.workers_tabular, 0.1)
        rounds, data_root = args.rounds_tabular, None
    else:
        real = args.data_root and (Path(args.data_root) / "pneumoniamnist.npz").exists()
        data_root = args.data_root if real else str(tmp / "data")
        if not real:
            write_medmnist_npz(tmp / "data", n_train=1200, n_test=64)
        dataset = {"name": "pneumoniamnist", "root": data_root, "download": False,
                   "verify_checksum": bool(real)}
        config = feddc_config(dataset, 150, 8, {"name": "convnet", "width": 32, "depth": 3},
                              args.rounds_pneumonia, 2, 0.1)
        rounds = args.rounds_pneumonia
    result = {"workload": name, "rounds": rounds}
    result.update(measure_raysim(config, tmp / f"out-{name}"))
    result["plain_rounds_per_s"] = measure_plain(config, data_root, min(rounds, 60))
    samples = 400 * 4 if name == "tabular" else 150 * 8
    result["raysim_samples_per_s"] = result["raysim_rounds_per_s"] * samples
    result["plain_samples_per_s"] = result["plain_rounds_per_s"] * samples
    result["raysim_over_plain"] = result["raysim_rounds_per_s"] / result["plain_rounds_per_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", nargs="+", default=["tabular", "pneumonia"],
                        choices=["tabular", "pneumonia"])
    parser.add_argument("--data-root", default=str(Path(__file__).resolve().parents[3] /
                                                   "shared" / "data" / "medmnist"))
    parser.add_argument("--rounds-tabular", type=int, default=500)
    parser.add_argument("--rounds-pneumonia", type=int, default=200)
    parser.add_argument("--workers-tabular", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workload:
            result = workload(name, args, Path(tmp))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                              for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    main()
