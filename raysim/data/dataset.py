"""In-memory datasets as plain numpy arrays (cheap to share through Ray's object store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch


@dataclass(frozen=True)
class DataInfo:
    """What a model and a metric need to know about a dataset."""

    name: str
    kind: Literal["image", "tabular"]
    num_classes: int
    input_shape: tuple[int, ...]
    """(channels, height, width) for images, (features,) for tabular data."""
    mean: tuple[float, ...] = ()
    """Per-channel normalisation applied to images scaled to [0, 1]."""
    std: tuple[float, ...] = ()


@dataclass(frozen=True)
class ArrayDataset:
    """Train and test arrays of one dataset.

    Images are kept as uint8 (N, H, W) or (N, H, W, C) and normalised per batch
    (:func:`to_tensor`), so large MedMNIST sizes stay small in memory; tabular features are
    float32, already standardised.
    """

    info: DataInfo
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def __post_init__(self) -> None:
        for split, x, y in (("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)):
            if len(x) != len(y):
                raise ValueError(f"{split}: {len(x)} inputs but {len(y)} labels")


def to_tensor(x: np.ndarray, info: DataInfo) -> torch.Tensor:
    """Turn a batch of stored inputs into a normalised float32 tensor (NCHW for images)."""
    if info.kind == "tabular":
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return normalise(torch.from_numpy(np.ascontiguousarray(x)), info)


def normalise(batch: torch.Tensor, info: DataInfo) -> torch.Tensor:
    """Stored image inputs (uint8, NHW or NHWC, on any device) as a normalised float32 NCHW
    tensor on the same device; tabular inputs as float32."""
    if info.kind == "tabular":
        return batch.to(torch.float32)
    batch = batch.to(torch.float32).div_(255.0)
    batch = batch.unsqueeze(1) if batch.ndim == 3 else batch.permute(0, 3, 1, 2).contiguous()
    mean = torch.tensor(info.mean, dtype=torch.float32, device=batch.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, dtype=torch.float32, device=batch.device).view(1, -1, 1, 1)
    return batch.sub_(mean).div_(std)
