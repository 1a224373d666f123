"""A U-Net FedAvg round three ways, in this process on the CPU, at one thread each: raysim's
client runtime on its per-client loop, the same runtime on its vectorised path
(``torch.func`` over the clients), and a plain PyTorch loop (copy the global state into one
model, SGD over each client's batches, sum the states in place, divide).

Workload: 4 generated sites x 32 training images at 64 px (discs on noise), MONAI's U-Net
(8-64 channels, InstanceNorm), MONAI's Dice + cross-entropy, 1 local epoch of batch 8, SGD
0.05. The sides alternate order between repeats (A B C, C B A, ...); each measures rounds per
second over ``--rounds`` rounds after a warm-up round. Records go to ``--records`` (default
``records/segmentation_speed_<device>_<commit>.jsonl``): one per side and repeat, and a
summary with the median rate of each side and each raysim side's mean ratio to the plain loop
over the repeats (with its t against 1).

    python experiments/benchmarks/segmentation_speed.py [--rounds 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from baselines import rounds_per_second  # noqa: E402
from harness import Records, commit, cpu_device, paired_ratios, record_path  # noqa: E402

from raysim.configuration.experiment import ExperimentConfig, parse_config  # noqa: E402
from raysim.data.generated import write_segmentation_sites  # noqa: E402
from raysim.preparation import initial_weights, prepare, run_context  # noqa: E402
from raysim.training.context import ClientData  # noqa: E402
from raysim.training.losses import SegmentationLoss  # noqa: E402
from raysim.training.runtime import ClientRuntime  # noqa: E402
from raysim.vectors.weighted_sum import mean_partial, weighted_mean  # noqa: E402

CLIENTS, IMAGES, SIZE, BATCH, LR = 4, 40, 64, 8, 0.05


def workload(root: Path) -> ExperimentConfig:
    """The benchmark's config (the data written under ``root``)."""
    write_segmentation_sites(root, sites=CLIENTS, images=IMAGES, size=SIZE)
    sites = [{"name": f"site{k}", "path": str(root / f"site{k}")} for k in range(CLIENTS)]
    return parse_config({
        "name": "unet-round", "dataset": {"name": "discs", "sites": sites, "resize": SIZE},
        "partition": {"scheme": "sites", "num_clients": CLIENTS},
        "model": {"name": "unet", "channels": [8, 16, 32, 64]},
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 100, "batch_size": BATCH, "local_epochs": 1, "loss": "dice_ce",
                     "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.0}},
        "seeds": [0]})


def raysim_round(config: ExperimentConfig, vectorize: str) -> Callable[[], None]:
    """One FedAvg round of raysim's client runtime (the worker's training and partial sum,
    the driver's mean)."""
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    start = initial_weights(config, dataset, 0)
    runtime = ClientRuntime(context, ClientData(dataset.train_x, dataset.train_y,
                                                partition.train, start),
                            torch.device("cpu"), vectorize=vectorize)
    expected = "vectorized" if vectorize == "always" else "loop"
    assert runtime.path == expected, runtime.path
    clients = list(range(CLIENTS))
    state = {"weights": start, "round": 0}

    def one_round() -> None:
        trained = runtime.train_many(clients, state["round"], [state["weights"]] * CLIENTS,
                                     [None] * CLIENTS)
        partial = mean_partial([w for w, _ in trained], [len(s) for s in partition.train],
                               True)
        state["weights"] = weighted_mean([partial])
        state["round"] += 1

    return one_round


def plain_round(config: ExperimentConfig) -> Callable[[], None]:
    """One FedAvg round of a plain PyTorch loop over the same clients and model."""
    from raysim.data.dataset import to_tensor
    from raysim.models import build_model

    dataset, partition = prepare(config, None)[0]
    model = build_model(config.model, dataset.info)
    loss = SegmentationLoss("dice_ce")
    x = [to_tensor(dataset.train_x[share], dataset.info) for share in partition.train]
    y = [torch.from_numpy(dataset.train_y[share]) for share in partition.train]
    state = model.state_dict()
    global_state = {k: v.clone() for k, v in state.items()}
    generator = torch.Generator().manual_seed(0)

    def one_round() -> None:
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        for client in range(CLIENTS):
            with torch.no_grad():
                for k, v in state.items():
                    v.copy_(global_state[k])
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            model.train()
            order = torch.randperm(len(y[client]), generator=generator)
            for start in range(0, len(order), BATCH):
                batch = order[start:start + BATCH]
                optimizer.zero_grad(set_to_none=True)
                loss(model(x[client][batch]), y[client][batch]).backward()
                optimizer.step()
            for k, v in state.items():
                total[k].add_(v, alpha=float(len(y[client])))
        count = float(sum(len(t) for t in y))
        for k in global_state:
            global_state[k] = (total[k] / count).to(global_state[k].dtype)

    return one_round


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device, at = cpu_device(), commit()
    records = Records("segmentation_speed", args.records or record_path(
        "segmentation_speed", device, at), {
            "device": device, "commit": at, "threads": 1,
            "load_at_start": round(os.getloadavg()[0], 2),
            "date": datetime.now(UTC).date().isoformat()})
    with tempfile.TemporaryDirectory() as scratch:
        config = workload(Path(scratch))
        sides = {"raysim_loop": raysim_round(config, "never"),
                 "raysim_vectorized": raysim_round(config, "always"),
                 "plain_pytorch_loop": plain_round(config)}
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for repeat in range(args.repeats):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for name in order:
                rate = rounds_per_second(sides[name], args.rounds, torch.device("cpu"))
                rates[name].append(rate)
                records.add(workload="unet8-4x32-discs64", side=name, repeat=repeat,
                            rounds_per_s=rate)
    summary = {f"{name}_median_rounds_per_s": float(np.median(values))
               for name, values in rates.items()}
    for name in ("raysim_loop", "raysim_vectorized"):
        ratio = paired_ratios(rates["plain_pytorch_loop"], rates[name])
        summary |= {f"{name}_over_plain_{key}": value for key, value in ratio.items()}
        summary[f"{name}_over_plain_n"] = args.repeats
    records.add(workload="unet8-4x32-discs64", side="summary", rounds=args.rounds, **summary)


if __name__ == "__main__":
    main()
