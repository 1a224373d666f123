"""A 3D round: raysim's per-client work on MedMNIST 3D volumes against the plain
PyTorch loop, on one worker, in one process, as ``per_client_overhead.py`` measures it (the
algorithm's ``local_updates`` through :class:`ClientRuntime`, the per-group ``reduce`` and the
merge, against one model per client trained with the same SGD steps and summed in float64).

Workloads, FedAvg, 20 clients (iid) of AdrenalMNIST3D at 28^3 (the real file where
``--data-root`` holds it, else a generated one of the same shape), one local epoch of batch
16, one of two workers' half of the round (10 clients):

- ``convnet3d``: the 3D ConvNet (width 16, depth 3, GroupNorm) on raysim's chosen path (the
  per-client loop on a CPU);
- ``convnet3d_vectorised``: the BatchNorm-free 3D ConvNet (norm none) on the vectorised path
  (``engine.vectorize: always``: every client of the round in one torch.func call per step);
- ``resnet18_3d`` (GPU-sized, not in the default list): MedMNIST v2's ResNet-18 (3D).

Rounds alternate between raysim and the plain loop; one JSON line per workload: median ms per
client of each and ``overhead`` = raysim / plain - 1.

    python experiments/benchmarks/volumes_3d.py [--workloads convnet3d convnet3d_vectorised]
        [--rounds 5] [--data-root DIR] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from per_client_overhead import benchmark_data, measure

from raysim.data.generated import write_volume_npz

MODELS: dict[str, tuple[dict[str, Any], str]] = {
    "convnet3d": ({"name": "convnet3d", "width": 16, "depth": 3, "norm": "instance"}, "auto"),
    "convnet3d_vectorised": ({"name": "convnet3d", "width": 16, "depth": 3, "norm": "none"},
                             "always"),
    "resnet18_3d": ({"name": "resnet18_3d", "norm": "group"}, "auto"),
}


def config(root: str, real: bool, model: dict[str, Any]) -> dict[str, Any]:
    """FedAvg on AdrenalMNIST3D (28^3), 20 iid clients, all in the round, one epoch of 16."""
    return {"name": "volumes", "dataset": {"name": "adrenalmnist3d", "root": root,
                                           "download": False, "verify_checksum": real},
            "partition": {"scheme": "iid", "num_clients": 20},
            "model": model, "algorithm": {"name": "fedavg"},
            "training": {"rounds": 10, "local_epochs": 1, "batch_size": 16,
                         "optimizer": {"name": "sgd", "lr": 0.05}},
            "evaluation": {"every": 0}, "seeds": [0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["convnet3d", "convnet3d_vectorised"],
                        choices=sorted(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    args = parser.parse_args()
    with benchmark_data(args.data_root, "adrenalmnist3d.npz",
                        lambda d: write_volume_npz(d, n_train=1188, n_test=50), args.threads
                        ) as (root, real):
        for name in args.workloads:
            model, vectorize = MODELS[name]
            result = measure(name, config(root, real, model), args.rounds, vectorize)
            print(json.dumps({**result, "threads": args.threads, "real_data": real}),
                  flush=True)


if __name__ == "__main__":
    main()
