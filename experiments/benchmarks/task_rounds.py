"""A FedAvg round of each task three ways, in this process, on the CPU at one thread or on a
GPU: raysim's client runtime on its per-client loop, the same runtime on its vectorised path
(``torch.func`` over the clients), and a plain PyTorch loop (copy the global state into one
model, SGD over each client's batches, sum the states in place, divide).

Workloads (generated data, so that they run anywhere):

    unet8-4x32-discs64     segmentation: MONAI's U-Net (8-64 channels, InstanceNorm), 4 sites x
                           32 training images at 64 px (discs on noise), MONAI's Dice +
                           cross-entropy, 1 local epoch of batch 8, SGD 0.05
    tcn16-4x240-sleep5s    time series: raysim's TCN (16 channels, 3 levels, no dropout: the
                           vectorised path draws no per-client masks), 4 clients x 240
                           EEG epochs of 5 s at 100 Hz (Sleep-EDF's DeepSleepNet layout, one
                           subject a client), cross-entropy, 1 local epoch of batch 16, SGD 0.05

The sides alternate order between repeats (A B C, C B A, ...); each measures rounds per second
over ``--rounds`` rounds after a warm-up round. Records go to ``--records`` (default
``records/task_rounds_<device>_<commit>.jsonl``): one per workload, side and repeat, and a
summary per workload with the median rate of each side and each raysim side's mean ratio to
the plain loop over the repeats (with its t against 1).

    python experiments/benchmarks/task_rounds.py [--workloads NAME ...] [--device cpu|cuda]
        [--rounds 3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from baselines import rounds_per_second  # noqa: E402
from harness import (  # noqa: E402
    Records,
    commit,
    cpu_device,
    device_slug,
    paired_ratios,
    record_path,
)

from raysim.configuration.experiment import ExperimentConfig, parse_config  # noqa: E402
from raysim.data.generated import write_recordings, write_segmentation_sites  # noqa: E402
from raysim.preparation import initial_weights, prepare, run_context  # noqa: E402
from raysim.training.context import ClientData  # noqa: E402
from raysim.training.losses import loss_function, training_loss  # noqa: E402
from raysim.training.runtime import ClientRuntime  # noqa: E402
from raysim.vectors.weighted_sum import mean_partial, weighted_mean  # noqa: E402

CLIENTS = 4


@dataclass(frozen=True)
class TaskWorkload:
    """A workload: what it is (for the tables), and its config with data written under a
    folder."""

    description: str
    config: Callable[[Path], dict[str, Any]]


def _unet_config(root: Path) -> dict[str, Any]:
    write_segmentation_sites(root, sites=CLIENTS, images=40, size=64)
    sites = [{"name": f"site{k}", "path": str(root / f"site{k}")} for k in range(CLIENTS)]
    return {"name": "unet-round", "dataset": {"name": "discs", "sites": sites, "resize": 64},
            "partition": {"scheme": "sites", "num_clients": CLIENTS},
            "model": {"name": "unet", "channels": [8, 16, 32, 64]},
            "training": {"batch_size": 8, "loss": "dice_ce"}}


def _tcn_config(root: Path) -> dict[str, Any]:
    write_recordings(root / "recordings", subjects=2 * CLIENTS, nights=1, epochs=240,
                     length=500)
    return {"name": "tcn-round", "dataset": {"name": "sleep", "path": str(root / "recordings"),
                                             "test_subjects": CLIENTS},
            "partition": {"scheme": "subjects", "num_clients": CLIENTS},
            "model": {"name": "tcn", "channels": 16, "levels": 3, "dropout": 0.0},
            "training": {"batch_size": 16}}


WORKLOADS = {
    "unet8-4x32-discs64": TaskWorkload(
        "U-Net 8-64 channels (MONAI), 4 clients x 32 images at 64 px, Dice + CE, 1 epoch of "
        "batch 8, SGD", _unet_config),
    "tcn16-4x240-sleep5s": TaskWorkload(
        "TCN 16 channels x 3 levels, 4 clients x 240 EEG epochs of 5 s (100 Hz), CE, 1 epoch "
        "of batch 16, SGD", _tcn_config),
}
LR = 0.05


def workload_config(name: str, root: Path) -> ExperimentConfig:
    """Workload ``name``'s config, its data written under ``root``."""
    raw = WORKLOADS[name].config(root)
    raw["algorithm"] = {"name": "fedavg"}
    raw["training"] |= {"rounds": 100, "local_epochs": 1,
                        "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.0}}
    raw["seeds"] = [0]
    return parse_config(raw)


def raysim_round(config: ExperimentConfig, vectorize: str, device: torch.device
                 ) -> Callable[[], None]:
    """One FedAvg round of raysim's client runtime (the worker's training and partial sum,
    the driver's mean)."""
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    start = initial_weights(config, dataset, 0)
    runtime = ClientRuntime(context, ClientData(dataset.train_x, dataset.train_y,
                                                partition.train, start),
                            device, vectorize=vectorize)
    expected = "vectorized" if vectorize == "always" else "loop"
    assert runtime.path == expected, runtime.path
    clients = list(range(partition.num_clients))
    sizes = [len(share) for share in partition.train]
    state = {"weights": start, "round": 0}

    def one_round() -> None:
        trained = runtime.train_many(clients, state["round"], [state["weights"]] * len(clients),
                                     [None] * len(clients))
        partial = mean_partial([w for w, _ in trained], sizes, True)
        state["weights"] = weighted_mean([partial])
        state["round"] += 1

    return one_round


def plain_round(config: ExperimentConfig, device: torch.device) -> Callable[[], None]:
    """One FedAvg round of a plain PyTorch loop over the same clients, model and loss."""
    from raysim.data.dataset import to_tensor
    from raysim.models import build_model

    dataset, partition = prepare(config, None)[0]
    model = build_model(config.model, dataset.info).to(device)
    loss = loss_function(training_loss(config.training.loss, dataset.info))
    x = [to_tensor(dataset.train_x[share], dataset.info).to(device)
         for share in partition.train]
    y = [torch.from_numpy(dataset.train_y[share]).to(device) for share in partition.train]
    batch = config.training.batch_size
    state = model.state_dict()
    global_state = {k: v.clone() for k, v in state.items()}
    generator = torch.Generator().manual_seed(0)

    def one_round() -> None:
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        for client in range(len(y)):
            with torch.no_grad():
                for k, v in state.items():
                    v.copy_(global_state[k])
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            model.train()
            order = torch.randperm(len(y[client]), generator=generator).to(device)
            for first in range(0, len(order), batch):
                rows = order[first:first + batch]
                optimizer.zero_grad(set_to_none=True)
                loss(model(x[client][rows]), y[client][rows]).backward()
                optimizer.step()
            for k, v in state.items():
                total[k].add_(v, alpha=float(len(y[client])))
        count = float(sum(len(t) for t in y))
        for k in global_state:
            global_state[k] = (total[k] / count).to(global_state[k].dtype)

    return one_round


def device_label(device: torch.device) -> str:
    """How records name the device: ``cpu-<cores>cores``, or the GPU's name as a slug
    (``nvidia-h200``)."""
    if device.type != "cuda":
        return cpu_device()
    return device_slug(torch.cuda.get_device_name(device))


def measure(name: str, device: torch.device, rounds: int, repeats: int,
            records: Records) -> None:
    """Every side of workload ``name``, alternating over ``repeats``, into ``records``."""
    with tempfile.TemporaryDirectory() as scratch:
        config = workload_config(name, Path(scratch))
        sides = {"raysim_loop": raysim_round(config, "never", device),
                 "raysim_vectorized": raysim_round(config, "always", device),
                 "plain_pytorch_loop": plain_round(config, device)}
        rates: dict[str, list[float]] = {side: [] for side in sides}
        for repeat in range(repeats):
            order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
            for side in order:
                rate = rounds_per_second(sides[side], rounds, device)
                rates[side].append(rate)
                records.add(workload=name, side=side, repeat=repeat, rounds_per_s=rate)
    summary: dict[str, Any] = {f"{side}_median_rounds_per_s": float(np.median(values))
                               for side, values in rates.items()}
    for side in ("raysim_loop", "raysim_vectorized"):
        ratio = paired_ratios(rates["plain_pytorch_loop"], rates[side])
        summary |= {f"{side}_over_plain_{key}": value for key, value in ratio.items()}
        summary[f"{side}_over_plain_n"] = repeats
    records.add(workload=name, description=WORKLOADS[name].description, side="summary",
                rounds=rounds, **summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS),
                        default=list(WORKLOADS))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--records")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    label, at = device_label(device), commit()
    records = Records("task_rounds", args.records or record_path("task_rounds", label, at), {
        "device": label, "commit": at, "threads": torch.get_num_threads()
        if device.type == "cpu" else None,
        "load_at_start": round(os.getloadavg()[0], 2),
        "date": datetime.now(UTC).date().isoformat()})
    for name in args.workloads:
        measure(name, device, args.rounds, args.repeats, records)


if __name__ == "__main__":
    main()
