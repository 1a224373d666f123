"""In-memory datasets as plain numpy arrays (cheap to share through Ray's object store).

numpy only at import: torch is imported by the functions that make tensors, so that a data
file can be read in one thread while another imports torch (``raysim run``'s start-up)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

Task = Literal["multi-class", "binary-class", "ordinal-regression", "multi-label",
               "segmentation"]
"""MedMNIST's task types (``multi-label`` is INFO's "multi-label, binary-class"), and
``segmentation``: a class index per pixel (masks (N, H, W) uint8, class 0 the background)."""


@dataclass(frozen=True)
class DataInfo:
    """What a model and a metric need to know about a dataset."""

    name: str
    kind: Literal["image", "tabular", "signal"]
    num_classes: int
    """Classes, or for a multi-label task the number of binary labels per sample."""
    input_shape: tuple[int, ...]
    """(channels, height, width) for images, (channels, depth, height, width) for volumes,
    (features,) for tabular data, (channels, length) for signals."""
    mean: tuple[float, ...] = ()
    """Per-channel normalisation applied to images scaled to [0, 1]."""
    std: tuple[float, ...] = ()
    task: Task = "multi-class"
    """A multi-label task stores a 0/1 vector of ``num_classes`` labels per sample, trains with
    binary cross-entropy on logits and predicts one sigmoid probability per label."""
    label_names: tuple[str, ...] = ()
    """The names of the classes (or labels), where the dataset has them."""
    sampling_rate: float | None = None
    """Samples per second of a signal (e.g. 100 Hz EEG); None for images and tabular data."""

    @property
    def multi_label(self) -> bool:
        """True for a multi-label task (labels are (N, num_classes) 0/1 arrays)."""
        return self.task == "multi-label"

    @property
    def segmentation(self) -> bool:
        """True for a segmentation task (labels are (N, H, W) uint8 masks of class indices,
        ``num_classes`` counting the background, class 0)."""
        return self.task == "segmentation"

    @property
    def stored_as_float(self) -> bool:
        """True when inputs are stored as float32, already standardised (tabular features and
        signals); images are stored as bytes and normalised per batch."""
        return self.kind != "image"

    @property
    def volumetric(self) -> bool:
        """True for 3D volumes (inputs (C, D, H, W))."""
        return self.kind == "image" and len(self.input_shape) == 4


@dataclass(frozen=True)
class ArrayDataset:
    """Train and test arrays of one dataset.

    Images are kept as uint8 (N, H, W) or (N, H, W, C), volumes as uint8 (N, D, H, W), and
    normalised per batch
    (:func:`to_tensor`), so large MedMNIST sizes stay small in memory; tabular features are
    float32, already standardised, and signals float32 (N, C, L), standardised per channel with
    the training split's moments.
    """

    info: DataInfo
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    val_x: np.ndarray | None = None
    """The dataset's own validation split (MedMNIST's ``val``), where it has one."""
    val_y: np.ndarray | None = None
    public_x: np.ndarray | None = None
    """Samples no client holds, for the methods that distil on a public set (e.g. the
    recordings of subjects kept out of every client), where the dataset has them."""
    public_y: np.ndarray | None = None
    public_from: int | None = None
    """Set once the public set is appended to the training arrays (before a run): rows
    ``public_from`` on of ``train_x`` are the public set, which no client's share indexes."""
    train_groups: np.ndarray | None = None
    """The group (subject, patient, site) of each training sample, int64, where the dataset
    knows it: ``partition.scheme: subjects`` deals whole groups to clients."""
    test_groups: np.ndarray | None = None
    train_blocks: np.ndarray | None = None
    """Runs of near-duplicate training samples (a video's consecutive frames), int64 ids, where
    the dataset knows them: a validation split or a site split into several clients keeps each
    run on one side. None: every sample stands alone."""
    test_blocks: np.ndarray | None = None

    def __post_init__(self) -> None:
        splits = [("train", self.train_x, self.train_y), ("test", self.test_x, self.test_y)]
        if self.val_x is not None and self.val_y is not None:
            splits.append(("val", self.val_x, self.val_y))
        if self.public_x is not None and self.public_y is not None:
            splits.append(("public", self.public_x, self.public_y))
        if self.train_groups is not None:
            splits.append(("train groups", self.train_x, self.train_groups))
        if self.test_groups is not None:
            splits.append(("test groups", self.test_x, self.test_groups))
        if self.train_blocks is not None:
            splits.append(("train blocks", self.train_x, self.train_blocks))
        if self.test_blocks is not None:
            splits.append(("test blocks", self.test_x, self.test_blocks))
        for split, x, y in splits:
            if len(x) != len(y):
                raise ValueError(f"{split}: {len(x)} inputs but {len(y)} labels")


def to_tensor(x: np.ndarray, info: DataInfo) -> torch.Tensor:
    """Turn a batch of stored inputs into a normalised float32 tensor (NCHW for images)."""
    import torch

    if info.stored_as_float:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return normalise(torch.from_numpy(np.ascontiguousarray(x)), info)


def normalise(batch: torch.Tensor, info: DataInfo) -> torch.Tensor:
    """Stored image inputs (uint8, NHW or NHWC, on any device) as a normalised float32 NCHW
    tensor on the same device, volumes (NDHW) as NCDHW; tabular inputs and signals (stored
    standardised) as float32."""
    import torch

    if info.stored_as_float:
        return batch.to(torch.float32)
    grey = batch.ndim == len(info.input_shape)  # no channel axis stored: one channel
    # channels moved first while the values are still bytes: the strided copy moves a
    # quarter of the memory it would move in float32 (the same values)
    batch = batch.unsqueeze(1) if grey else batch.movedim(-1, 1).contiguous()
    batch = batch.to(torch.float32).div_(255.0)
    mean, std = _moments(tuple(info.mean), tuple(info.std), batch.device, batch.ndim)
    return batch.sub_(mean).div_(std)


@functools.lru_cache(maxsize=32)
def _moments(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device, ndim: int
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel mean and std as broadcastable tensors on ``device`` (made once)."""
    import torch

    shape = (1, -1) + (1,) * (ndim - 2)
    return (torch.tensor(mean, dtype=torch.float32, device=device).view(shape),
            torch.tensor(std, dtype=torch.float32, device=device).view(shape))
