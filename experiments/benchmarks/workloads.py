"""Every benchmark workload, defined once under a name that says what it is: the model, the
clients x samples each, and the data. Each is a federated round shape (FedAvg with SGD unless
it says); the scripts choose the engine, the rounds and where the data comes from.

    convnet128-70x64-pneumonia    ConvNet width 128, 70 clients x 64 PneumoniaMNIST images,
                                  1 local epoch of batch 32, 3 rounds
    convnet32-150x8-pneumonia     ConvNet width 32, 150 clients x 8 PneumoniaMNIST images,
                                  every client, 1 step of batch 8, 30 rounds
    mlp32-1000x4-synthetic        MLP 32, 1,000 clients x 4 rows of the synthetic set,
                                  100 per round, 1 step of batch 4, 50 rounds
    mlp1024-1000x4-synthetic      the same clients with an MLP of 1.08 M parameters (1024 x
                                  1024), lr 0.05, 40 rounds: moving weights is what costs
    cnn-1000x50-cifar-shape       pfl-research's CIFAR-10 benchmark: CNN 32/64 + 128,
                                  1,000 clients x 50 images of 28x28x3, 50 per round, 1 epoch
                                  of batch 10, lr 0.1
    feddc-resnet18-150x8-pneumonia224
                                  FedDC (d=1, b=10), ResNet18 with BatchNorm, 150 clients x 8
                                  PneumoniaMNIST images at 224 px, 1 step of batch 8, lr 0.1
    feddc-mlp32-400x4-synthetic   FedDC (d=1, b=10), MLP 32, 400 clients x 4 synthetic rows,
                                  1 step of batch 4, lr 0.1, 500 rounds
    feddc-convnet32-150x8-pneumonia
                                  FedDC (d=1, b=10), ConvNet width 32, 150 clients x 8
                                  PneumoniaMNIST images, 1 step of batch 8, lr 0.1, 200 rounds
    fedvck-convnet32-10x-pneumonia
                                  FedVCK (50 condensation iterations of 64 real images per
                                  class, uniform selection, no contrastive loss, 30 server
                                  epochs), ConvNet width 32 with BatchNorm, 10 clients of
                                  PneumoniaMNIST under Dirichlet(0.05), 4 rounds
    mhpflid-8-architectures-8x60-breast
                                  MH-pFLID's default round, 8 clients of 8 architectures x 60
                                  BreastMNIST images, batch 8, 4 rounds
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

EQUAL_THREADS = 1
"""The threads per process of every side in a CPU benchmark's equal-budget rows: what each of
raysim's ``raysim_2x1cpu`` workers uses (a worker runs one torch thread per CPU it holds)."""


@dataclass(frozen=True)
class Workload:
    """A federated round shape."""

    description: str
    short: str
    """A few words for narrow tables."""
    data: str
    """A MedMNIST flag, or a built-in set (``synthetic``)."""
    clients: int
    samples: int
    """Training samples per client."""
    model: dict[str, Any]
    batch: int
    lr: float
    rounds: int
    per_round: int | None = None
    """Clients sampled per round (None: every client)."""
    steps: int | None = None
    """Local SGD steps per round (None: one local epoch)."""
    size: int = 28
    algorithm: dict[str, Any] = field(default_factory=lambda: {"name": "fedavg"})
    partition: dict[str, Any] | None = None
    """The config's partition section (None: iid, ``clients`` x ``samples``)."""
    sections: dict[str, Any] = field(default_factory=dict)
    """Further config sections (e.g. ``clients``), and ``engine`` keys to merge."""


WORKLOADS: dict[str, Workload] = {
    "convnet128-70x64-pneumonia": Workload(
        "ConvNet (width 128), 70 clients x 64 PneumoniaMNIST images, 1 epoch",
        "ConvNet, 70 clients x 64 images", "pneumoniamnist", 70, 64,
        {"name": "convnet", "width": 128, "depth": 3}, batch=32, lr=0.01, rounds=3),
    "convnet32-150x8-pneumonia": Workload(
        "ConvNet (width 32), 150 clients x 8 PneumoniaMNIST images, every client, 1 step",
        "ConvNet, 150 clients x 8 images", "pneumoniamnist", 150, 8,
        {"name": "convnet", "width": 32, "depth": 3}, batch=8, lr=0.01, rounds=30, steps=1),
    "mlp32-1000x4-synthetic": Workload(
        "MLP 32, 1,000 clients x 4 synthetic rows, 100 per round, 1 step",
        "MLP, 1,000 clients x 4 rows", "synthetic", 1000, 4, {"name": "mlp", "hidden": [32]},
        batch=4, lr=0.01, rounds=50, per_round=100, steps=1),
    "mlp1024-1000x4-synthetic": Workload(
        "MLP 1024 x 1024 (1.08 M parameters), 1,000 clients x 4 synthetic rows, 100 per round, "
        "1 step", "MLP 1.08 M, 1,000 clients x 4 rows", "synthetic", 1000, 4,
        {"name": "mlp", "hidden": [1024, 1024]}, batch=4, lr=0.05, rounds=40, per_round=100,
        steps=1),
    "cnn-1000x50-cifar-shape": Workload(
        "CNN 32/64/128, 1,000 clients x 50 images 28x28x3, 50 per round, 1 epoch of batch 10 "
        "(pfl-research's CIFAR-10 shape)", "CNN, 1,000 clients x 50 images", "pathmnist",
        1000, 50, {"name": "cnn", "channels": [32, 64], "hidden": 128}, batch=10, lr=0.1,
        rounds=20, per_round=50),
    "feddc-resnet18-150x8-pneumonia224": Workload(
        "FedDC (d=1, b=10), ResNet18 with BatchNorm, 150 clients x 8 PneumoniaMNIST images at "
        "224 px, 1 step", "FedDC ResNet18, 150 clients x 8 images", "pneumoniamnist", 150, 8,
        {"name": "resnet18", "norm": "batch"}, batch=8, lr=0.1, rounds=30, steps=1, size=224,
        algorithm={"name": "feddc", "daisy_period": 1, "aggregation_period": 10}),
    "feddc-mlp32-400x4-synthetic": Workload(
        "FedDC (d=1, b=10), MLP 32, 400 clients x 4 synthetic rows, 1 step",
        "FedDC MLP, 400 clients x 4 rows", "synthetic", 400, 4, {"name": "mlp", "hidden": [32]},
        batch=4, lr=0.1, rounds=500, steps=1,
        algorithm={"name": "feddc", "daisy_period": 1, "aggregation_period": 10}),
    "feddc-convnet32-150x8-pneumonia": Workload(
        "FedDC (d=1, b=10), ConvNet (width 32), 150 clients x 8 PneumoniaMNIST images, 1 step",
        "FedDC ConvNet, 150 clients x 8 images", "pneumoniamnist", 150, 8,
        {"name": "convnet", "width": 32, "depth": 3}, batch=8, lr=0.1, rounds=200, steps=1,
        algorithm={"name": "feddc", "daisy_period": 1, "aggregation_period": 10}),
    "fedvck-convnet32-10x-pneumonia": Workload(
        "FedVCK (50 iterations, uniform selection, no contrastive loss, 30 server epochs), "
        "ConvNet (width 32, BatchNorm), 10 PneumoniaMNIST clients under Dirichlet(0.05)",
        "FedVCK ConvNet, 10 clients", "pneumoniamnist", 10, 0,
        {"name": "convnet", "width": 32, "depth": 3, "norm": "batch"}, batch=32, lr=0.01,
        rounds=4, algorithm={"name": "fedvck", "iterations": 50, "real_per_class": 64,
                             "selection": "uniform", "contrastive": False,
                             "server_epochs": 30},
        partition={"scheme": "dirichlet", "num_clients": 10, "beta": 0.05, "min_size": 10},
        sections={"engine": {"server_threads": 2}}),  # the server step uses both CPUs
    "mhpflid-8-architectures-8x60-breast": Workload(
        "MH-pFLID's default round, 8 clients of 8 architectures x 60 BreastMNIST images",
        "MH-pFLID, 8 architectures", "breastmnist", 8, 60, {"name": "resnet17"}, batch=8,
        lr=0.01, rounds=4, algorithm={"name": "mhpflid"},
        sections={"clients": {"architectures": [
            "resnet17", "shufflenetv2", "resnext", "squeezenet", "senet", "mobilenetv2",
            "densenet", "vgg"]}}),
}


def raysim_config(name: str, dataset: dict[str, Any], *, rounds: int | None = None,
                  engine: dict[str, Any] | None = None, seeds: tuple[int, ...] = (0,),
                  evaluate_last: bool = True) -> dict[str, Any]:
    """Workload ``name`` as a raysim config on ``dataset`` (the config's dataset section),
    ``rounds`` (default: the workload's), ``engine`` (default: 2 workers of 1 CPU), evaluated
    after the last round (``evaluate_last``) or never."""
    spec = WORKLOADS[name]
    rounds = spec.rounds if rounds is None else rounds
    training: dict[str, Any] = {"rounds": rounds, "batch_size": spec.batch}
    if spec.algorithm["name"] in ("fedavg", "feddc"):  # (the others' optimizers are their own)
        training["optimizer"] = {"name": "sgd", "lr": spec.lr}
        training.update({"local_steps": spec.steps} if spec.steps else {"local_epochs": 1})
    if spec.per_round is not None:
        training["clients_per_round"] = spec.per_round
    extra = {k: v for k, v in spec.sections.items() if k != "engine"}
    return {"name": name, "dataset": dataset,
            "partition": spec.partition or {"scheme": "iid", "num_clients": spec.clients,
                                            "samples_per_client": spec.samples},
            "model": spec.model, "algorithm": spec.algorithm, "training": training,
            "evaluation": {"every": rounds, "clients": False} if evaluate_last else {"every": 0},
            "seeds": list(seeds), **extra,
            "engine": {**(engine or {"num_workers": 2, "cpus_per_worker": 1}),
                       **spec.sections.get("engine", {})}}


def dataset_section(name: str, root: str, real: bool) -> dict[str, Any]:
    """The config's dataset section of workload ``name`` under ``root`` (``real``: a
    downloaded MedMNIST file, whose checksum is verified)."""
    spec = WORKLOADS[name]
    if spec.data == "synthetic":
        return {"name": "synthetic"}
    return {"name": spec.data, "size": spec.size, "root": root, "download": False,
            "verify_checksum": real}
