"""Small generated datasets in the MedMNIST npz layout (no download, no real data needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_medmnist_npz(root: Path, flag: str = "pneumoniamnist", *, n_train: int = 400,
                       n_test: int = 200, size: int = 28, channels: int = 1,
                       num_classes: int = 2, seed: int = 0) -> Path:
    """Write ``<root>/<flag>.npz`` with class-dependent bright blobs on noise.

    Class c has a bright 8x8 square at a class-specific position, so a ConvNet can learn it,
    while a model that learns nothing stays at chance.
    """
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", n_train), ("val", n_test // 2), ("test", n_test)):
        labels = rng.integers(0, num_classes, size=count)
        images = rng.normal(90, 30, size=(count, size, size, channels))
        for index, label in enumerate(labels):
            row = 2 + (label * 9) % (size - 10)
            col = 2 + (label * 5) % (size - 10)
            images[index, row:row + 8, col:col + 8] += 110
        images = np.clip(images, 0, 255).astype(np.uint8)
        if channels == 1:
            images = images[..., 0]
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"
    path = root / name
    np.savez_compressed(path, **arrays)
    return path
