"""The hooks the edited copy of the FedVCK authors' code calls (copied next to its ``main.py``
as ``fidelity_shim.py`` by :mod:`authors_fedvck`): the common data, model width and split.

Set by the harness through the environment:

- ``FIDELITY_CONFIG``: the raysim config of the common setting (a YAML file);
- ``FIDELITY_VARIANT``: its variant (the raysim side of the run);
- ``FIDELITY_DATA_ROOT``: the directory holding ``pneumoniamnist.npz``;
- ``FIDELITY_SEED``: the seed whose raysim partition both codes use.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

MIN_CLASS_SAMPLES = 10
"""The authors' ``dataset_partition.py``: a client condenses the classes it holds at least 10
samples of."""


@functools.cache
def _experiment() -> Any:
    from raysim.configuration.experiment import load_experiments

    variant = os.environ["FIDELITY_VARIANT"]
    experiments = load_experiments(os.environ["FIDELITY_CONFIG"])
    if variant not in experiments:
        raise SystemExit(f"fidelity shim: no variant {variant!r} in "
                         f"{os.environ['FIDELITY_CONFIG']}")
    return experiments[variant]


@functools.cache
def _dataset() -> Any:
    from raysim.data import load_dataset

    return load_dataset(_experiment().dataset, os.environ["FIDELITY_DATA_ROOT"])


class CommonImages(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Normalised images and their labels, indexed as the authors' MedMNIST sets are
    (``dataset[i] -> (image, label)``, ``labels`` an int64 array)."""

    def __init__(self, images: torch.Tensor, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.images[index], int(self.labels[index])


def get_dataset(dataset: str, dataset_root: str, batch_size: int
                ) -> tuple[dict[str, Any], CommonImages, CommonImages, DataLoader]:  # type: ignore[type-arg]
    """The authors' ``get_dataset`` on the common data: the MedMNIST npz at the config's size,
    normalised as raysim normalises it, with the config's ConvNet width in ``dataset_info``."""
    from raysim.data.dataset import to_tensor

    data, model = _dataset(), _experiment().model
    train = CommonImages(to_tensor(data.train_x, data.info),
                         data.train_y.reshape(-1).astype(np.int64))
    test = CommonImages(to_tensor(data.test_x, data.info),
                        data.test_y.reshape(-1).astype(np.int64))
    channels, height, width = train.images.shape[1:]
    info = {"name": dataset, "channel": int(channels), "im_size": (int(height), int(width)),
            "num_classes": data.info.num_classes, "classes_names": data.info.label_names,
            "mean": [0.5] * channels, "std": [0.5] * channels,
            "net_width": int(getattr(model, "width", 128))}
    loader = DataLoader(TensorDataset(test.images, torch.as_tensor(test.labels)),
                        batch_size=batch_size, shuffle=False, num_workers=0)
    return info, train, test, loader


def split_file(args: Any) -> str:
    """raysim's partition of the seed in the authors' split-file layout (``client_idx``,
    ``client_classes``), written into the working directory; its path."""
    from raysim.preparation import prepare

    seed = int(os.environ["FIDELITY_SEED"])
    partition = prepare(_experiment(), os.environ["FIDELITY_DATA_ROOT"],
                        read=_dataset)[seed][1]
    if len(partition.train) != args.client_num:
        raise SystemExit(f"fidelity shim: raysim has {len(partition.train)} clients, the "
                         f"authors' run --client_num {args.client_num}")
    labels = _dataset().train_y.reshape(-1)
    indices = [np.asarray(rows, dtype=np.int64) for rows in partition.train]
    classes = [[int(c) for c, n in zip(*np.unique(labels[rows], return_counts=True),
                                       strict=True) if n >= MIN_CLASS_SAMPLES]
               for rows in indices]
    path = Path.cwd() / f"split_seed{seed}.json"
    path.write_text(json.dumps({"client_idx": [rows.tolist() for rows in indices],
                                "client_classes": classes}))
    return str(path)
