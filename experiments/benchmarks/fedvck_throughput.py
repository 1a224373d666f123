"""FedVCK rounds per second: raysim against a plain PyTorch loop.

Workload: PneumoniaMNIST at 28 px, 10 clients, Dirichlet(0.05), ConvNet width 32 with
BatchNorm; a round is FedVCK's condensation on every client (`--iterations` distribution-matching
steps, 64 real images per class per step, the siamese augmentation, the latent constraint:
real batches in train mode, synthetic in eval mode) followed by the server's `--server-epochs`
epochs of cross-entropy on the synthetic sets of all rounds so far. Uniform selection and no
contrastive loss, so that the plain loop can mirror the work exactly. Uses the real
PneumoniaMNIST from --data-root when present, else a generated file of that layout.

The plain loop runs in one process (all threads): the same client partition, per-client
synthetic tensors kept across rounds, the same augmentation function and the same ConvNet;
real batches drawn with numpy, one SGD step per iteration on the synthetic images, uint8
quantisation of the upload, then server training. raysim runs with 2 workers x 1 CPU and no
evaluation; its rate is measured from the first to the last round's completion (start-up
excluded and reported separately).

    python experiments/benchmarks/fedvck_throughput.py [--rounds 4] [--iterations 50]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from harness import measure_raysim, medmnist_source, print_ratio

from raysim.condensation.augment import augment
from raysim.condensation.synthetic import to_uint8
from raysim.config import parse_config
from raysim.data import load_dataset, to_tensor
from raysim.data.partition import make_partition
from raysim.models import build_model

CLIENTS = 10
REAL_PER_CLASS = 64


def config(dataset: dict, rounds: int, iterations: int, server_epochs: int) -> dict:
    return {
        "name": "fedvck-bench", "dataset": dataset,
        "partition": {"scheme": "dirichlet", "num_clients": CLIENTS, "beta": 0.05, "min_size": 10},
        "model": {"name": "convnet", "width": 32, "depth": 3, "norm": "batch"},
        "algorithm": {"name": "fedvck", "iterations": iterations, "real_per_class": REAL_PER_CLASS,
                      "selection": "uniform", "contrastive": False,
                      "server_epochs": server_epochs},
        "training": {"rounds": rounds},
        "evaluation": {"every": 0},
        "engine": {"num_workers": 2, "cpus_per_worker": 1, "flush_seconds": 5.0,
                   "server_threads": 2},  # the server step uses both CPUs while workers wait
    }


def measure_plain(raw: dict, data_root: str, rounds: int) -> float:
    parsed = parse_config(raw)
    algorithm = parsed.algorithm
    dataset = load_dataset(parsed.dataset, data_root)
    info = dataset.info
    partition = make_partition(dataset.train_y, dataset.test_y, parsed.partition,
                               info.num_classes, 0)
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    model = build_model(parsed.model, info)
    clients = []  # (class -> real indices, class -> synthetic images)
    for indices in partition.train:
        labels = dataset.train_y[indices]
        counts = np.bincount(labels, minlength=info.num_classes)
        sizes = {c: max(5, int(np.ceil(0.01 * n))) for c, n in enumerate(counts) if n >= 10}
        clients.append(({c: indices[labels == c] for c in sizes},
                        {c: torch.randn((n, *info.input_shape)) for c, n in sizes.items()}))
    buffer_x, buffer_y = [], []
    started = None
    for t in range(rounds + 1):
        if t == 1:
            started = time.perf_counter()  # round 0 is warm-up
        model.requires_grad_(False)
        for by_class, synthetic in clients:
            if not synthetic:
                continue
            classes = sorted(synthetic)
            images = [synthetic[c].requires_grad_(True) for c in classes]
            optimizer = torch.optim.SGD(images, lr=algorithm.image_lr, momentum=algorithm.momentum)
            for _ in range(algorithm.iterations):
                picks = [by_class[c] if len(by_class[c]) <= REAL_PER_CLASS else
                         rng.choice(by_class[c], REAL_PER_CLASS, replace=False) for c in classes]
                seed = int(rng.integers(0, 2**62))
                real = augment(to_tensor(dataset.train_x[np.concatenate(picks)], info), seed)
                syn = augment(torch.cat(images), seed)
                model.train()
                with torch.no_grad():
                    real_embedding = model.embed(real)
                model.eval()
                syn_embedding = model.embed(syn)
                loss = sum(((r.mean(0) - s.mean(0)) ** 2).sum() for r, s in zip(
                    real_embedding.split([len(p) for p in picks]),
                    syn_embedding.split([len(s) for s in images]), strict=True))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(images, 10.0)
                optimizer.step()
            buffer_x.append(to_uint8(torch.cat(images), info))
            buffer_y.append(np.repeat(classes, [len(s) for s in images]))
            for c, image in zip(classes, images, strict=True):
                synthetic[c] = image.detach()
        model.requires_grad_(True)
        model.train()
        x, y = to_tensor(np.concatenate(buffer_x), info), torch.from_numpy(np.concatenate(buffer_y))
        optimizer = torch.optim.SGD(model.parameters(), lr=algorithm.server_lr, momentum=0.9,
                                    weight_decay=1e-6)
        for epoch in range(algorithm.server_epochs):
            if epoch == algorithm.server_epochs // 2:  # the authors' StepLR
                for group in optimizer.param_groups:
                    group["lr"] *= 0.1
            for batch in torch.randperm(len(y)).split(256):
                inputs = augment(x[batch], int(rng.integers(0, 2**62)))  # one op per batch
                loss = F.cross_entropy(model(inputs), y[batch])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return rounds / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=str(Path(__file__).resolve().parents[3] /
                                                   "shared" / "data" / "medmnist"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--server-epochs", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset, data_root, real = medmnist_source(args.data_root, "pneumoniamnist", Path(tmp),
                                                   n_train=4708, n_test=624)
        raw = config(dataset, args.rounds, args.iterations, args.server_epochs)
        result = {"workload": "fedvck-10-clients-dir0.05", "rounds": args.rounds,
                  "iterations": args.iterations, "server_epochs": args.server_epochs,
                  "real_data": real}
        result.update(measure_raysim(raw, Path(tmp) / "out"))
        result["plain_rounds_per_s"] = measure_plain(raw, data_root, min(args.rounds, 3))
        print_ratio(result)


if __name__ == "__main__":
    main()
