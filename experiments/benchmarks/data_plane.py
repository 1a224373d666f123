"""A data-plane-bound shape (``mlp1024-1000x4-synthetic`` of ``workloads.py``): raysim against
a plain in-process loop that keeps the weights as torch tensors.

Workload: FedAvg on the built-in ``synthetic`` set (30 features, 2 classes), 1,000 clients x 4
rows (iid), 100 clients per round, MLP with hidden [1024, 1024] (about 1.08 M parameters), one
SGD step of batch 4 (lr 0.05), 40 rounds, 2 workers of 1 CPU, no evaluation. Almost no
arithmetic per client: what costs is moving and summing weights.

In one invocation it measures

(a) raysim: steady rounds/s (the rounds after the first, from the rounds table's
    ``wall_time``), and the driver's share of a round: its serial time between collecting a
    round and dispatching the next (the rounds table's ``seconds_aggregate``, which spans the
    aggregation; the workers wait meanwhile) over the round period, medians; also the median
    round period and a client's median training time in its worker (the ``clients`` table's
    ``train_seconds``), which move less with the machine's drift than whole rounds;
(b) the plain loop (``--threads``, default 2): the global weights as torch tensors, loaded into
    one model per client, one SGD step, the client's state added in place to a float64 sum,
    the mean as the next global;

and prints one JSON line with both and ``over_plain``. With ``--repeats N`` the two alternate N
times (this machine's speed drifts by tens of per cent between minutes) and the line gives the
median of each and of the per-repeat ratios, and every repeat's figures.

    python experiments/benchmarks/data_plane.py [--rounds 40] [--clients 1000] [--per-round 100]
        [--workers 2] [--threads 2] [--hidden 1024 1024] [--repeats 1]
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
from raysim.data import load_dataset
from raysim.engine.runner import run_experiment
from raysim.models import MODELS, build_model
from raysim.results import load
from raysim.schema import DatasetConfig


def w4_config(args: argparse.Namespace) -> dict:
    """The experiment as a raysim config."""
    return {"name": "w4", "dataset": {"name": "synthetic"},
            "partition": {"scheme": "iid", "num_clients": args.clients,
                          "samples_per_client": args.samples},
            "model": {"name": "mlp", "hidden": list(args.hidden)},
            "algorithm": {"name": "fedavg"},
            "training": {"rounds": args.rounds, "local_steps": 1, "batch_size": args.samples,
                         "clients_per_round": args.per_round,
                         "optimizer": {"name": "sgd", "lr": 0.05}},
            "evaluation": {"every": 0}, "seeds": [0],
            "engine": {"num_workers": args.workers, "cpus_per_worker": 1,
                       "flush_seconds": 5.0}}


def measure_raysim(args: argparse.Namespace, output: Path) -> dict:
    """Steady rounds/s and the driver's share of a round (medians over rounds 1..)."""
    started = time.perf_counter()
    outcome = run_experiment(parse_config(w4_config(args)), output=str(output),
                             progress=False)[0]
    if outcome.error is not None:
        raise RuntimeError(f"the benchmark run failed: {outcome.error}")
    total = time.perf_counter() - started
    rounds = load(outcome.run_dir)
    period = np.diff(rounds["wall_time"].to_numpy())
    driver = rounds["seconds_aggregate"].to_numpy()[1:]
    clients = load(outcome.run_dir, "clients")
    return {"raysim_rounds_per_s": len(period) / float(period.sum()),
            "raysim_driver_share": float(np.median(driver) / np.median(period)),
            "raysim_round_period_ms": float(np.median(period)) * 1000,
            "raysim_client_train_ms": float(clients["train_seconds"].median()) * 1000,
            "raysim_whole_process_s": total}


def measure_plain(args: argparse.Namespace) -> float:
    """Rounds/s of the plain loop (torch weights, one model, sum in place)."""
    torch.set_num_threads(args.threads)
    data = load_dataset(DatasetConfig(name="synthetic"))
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data.train_y))[: args.clients * args.samples]
    x = torch.from_numpy(data.train_x[order]).reshape(args.clients, args.samples, -1)
    y = torch.from_numpy(data.train_y[order]).reshape(args.clients, args.samples)
    torch.manual_seed(0)
    model = build_model(MODELS["mlp"].params(hidden=tuple(args.hidden)), data.info)
    state = dict(model.state_dict())
    global_state = {k: v.clone() for k, v in state.items()}
    loss_fn = torch.nn.CrossEntropyLoss()

    def one_round() -> None:
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        for client in rng.choice(args.clients, args.per_round, replace=False):
            with torch.no_grad():
                for k, v in state.items():
                    v.copy_(global_state[k])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[client]), y[client]).backward()
            optimizer.step()
            for k, v in state.items():
                total[k].add_(v)
        for k in global_state:
            global_state[k] = (total[k] / args.per_round).to(torch.float32)

    one_round()
    started = time.perf_counter()
    for _ in range(args.rounds - 1):
        one_round()
    return (args.rounds - 1) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    import ray

    repeats = []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            measured = measure_raysim(args, Path(scratch))
        ray.shutdown()
        measured["plain_rounds_per_s"] = measure_plain(args)
        measured["over_plain"] = measured["raysim_rounds_per_s"] / measured["plain_rounds_per_s"]
        repeats.append({k: round(v, 3) for k, v in measured.items()})
    result: dict = {"workload": f"fedavg mlp{args.hidden} synthetic {args.clients}x"
                                f"{args.samples} {args.per_round}/round {args.rounds} rounds "
                                f"{args.workers} workers", "repeats": args.repeats}
    result.update({f"median_{k}": round(float(np.median([r[k] for r in repeats])), 3)
                   for k in repeats[0]})
    if args.repeats > 1:
        result["each"] = repeats
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
