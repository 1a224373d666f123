"""Small generated datasets in the layouts raysim reads (MedMNIST npz files, site folders of
images and masks, folders of recordings): offline stand-ins for real data (no download), for
tests, benchmarks, estimates and trying a config before the real files are at hand. Each
carries a learnable pattern on noise (a class's texture or tone, a disc to segment), so a model
can learn it and one that learns nothing stays at chance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def write_medmnist_npz(root: Path, flag: str = "pneumoniamnist", *, n_train: int = 400,
                       n_test: int = 200, size: int = 28, channels: int = 1,
                       num_classes: int = 2, seed: int = 0, n_val: int | None = None,
                       compress: bool = True) -> Path:
    """Write ``<root>/<flag>.npz`` with class-dependent bright blobs on noise.

    Class c has a bright 8x8 square at a class-specific position, so a ConvNet can learn it,
    while a model that learns nothing stays at chance. The validation split holds ``n_val``
    images (default half of ``n_test``). The images are drawn in chunks, so a file of full
    MedMNIST size at 224 px needs no more memory than its uint8 arrays; ``compress=False``
    writes them uncompressed (faster for large files).
    """
    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {}
    counts = (("train", n_train), ("val", n_test // 2 if n_val is None else n_val),
              ("test", n_test))
    for split, count in counts:
        labels = rng.integers(0, num_classes, size=count)
        images = np.empty((count, size, size, channels), dtype=np.uint8)
        for start, chunk in _noise(rng, count, (size, size, channels)):
            for index, label in enumerate(labels[start:start + len(chunk)]):
                row = 2 + (label * 9) % (size - 10)
                col = 2 + (label * 5) % (size - 10)
                chunk[index, row:row + 8, col:col + 8] += 110
            images[start:start + len(chunk)] = np.clip(chunk, 0, 255).astype(np.uint8)
        arrays[f"{split}_images"] = images[..., 0] if channels == 1 else images
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    return _save(root, flag, size, arrays, compress)


_CHUNK = 256
"""Images drawn at a time (the same random stream as one draw of all of them)."""


def _noise(rng: np.random.Generator, count: int, shape: tuple[int, ...]
           ) -> Iterator[tuple[int, np.ndarray]]:
    """``count`` float64 noise images of ``shape`` (mean 90, std 30), as (first index, chunk)
    of at most ``_CHUNK`` images: the values one draw of all of them would give."""
    for start in range(0, count, _CHUNK):
        yield start, rng.normal(90, 30, size=(min(_CHUNK, count - start), *shape))


def write_multilabel_npz(root: Path, flag: str = "chestmnist", *, n_train: int = 400,
                         n_test: int = 200, size: int = 28, num_labels: int = 14,
                         seed: int = 0) -> Path:
    """Write ``<root>/<flag>.npz`` in ChestMNIST's layout: grey images, a (N, 14) uint8 row of
    0/1 labels per image. Label k is present with probability from 0.35 down to 0.05 (common
    and rare findings, and images with none) and draws a bright 4x4 square at its own place
    on a 4x4 grid, so a ConvNet can learn every label."""
    rng = np.random.default_rng(seed)
    rates = np.linspace(0.35, 0.05, num_labels)
    step = (size - 4) // 4
    arrays: dict[str, Any] = {}
    for split, count in (("train", n_train), ("val", n_test // 2), ("test", n_test)):
        labels = (rng.random((count, num_labels)) < rates).astype(np.uint8)
        images = np.empty((count, size, size), dtype=np.uint8)
        for start, chunk in _noise(rng, count, (size, size)):
            present = labels[start:start + len(chunk)]
            for label in range(num_labels):
                row, col = 2 + (label // 4) * step, 2 + (label % 4) * step
                chunk[present[:, label] == 1, row:row + 4, col:col + 4] += 120
            images[start:start + len(chunk)] = np.clip(chunk, 0, 255).astype(np.uint8)
        arrays[f"{split}_images"] = images
        arrays[f"{split}_labels"] = labels
    return _save(root, flag, size, arrays)


def write_volume_npz(root: Path, flag: str = "adrenalmnist3d", *, n_train: int = 160,
                     n_test: int = 80, size: int = 28, num_classes: int = 2,
                     seed: int = 0) -> Path:
    """Write ``<root>/<flag>.npz`` in the MedMNIST 3D layout: (N, D, H, W) uint8 volumes with a
    bright 6^3 cube at a class-specific place on noise, and (N, 1) labels."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, Any] = {}
    for split, count in (("train", n_train), ("val", n_test // 2), ("test", n_test)):
        labels = rng.integers(0, num_classes, size=count)
        volumes = np.empty((count, size, size, size), dtype=np.uint8)
        for start, drawn in _noise(rng, count, (size, size, size)):
            chunk = drawn.astype(np.float32)
            classes = labels[start:start + len(chunk)]
            for label in range(num_classes):
                at = 2 + (label * 7) % (size - 8)
                chunk[classes == label, at:at + 6, at:at + 6, 2:8] += 110
            volumes[start:start + len(chunk)] = np.clip(chunk, 0, 255).astype(np.uint8)
        arrays[f"{split}_images"] = volumes
        arrays[f"{split}_labels"] = labels.reshape(-1, 1).astype(np.uint8)
    return _save(root, flag, size, arrays)


def write_stand_in(root: Path, flag: str, size: int) -> Path:
    """Write a generated file in the layout of MedMNIST subset ``flag`` at ``size``: the
    official split sizes, channels, classes (or labels) and image or volume size from the
    medmnist package's metadata, uncompressed. What a model costs to train and evaluate does
    not depend on the pixel values, so ``raysim estimate`` can time a config on it when the
    real file is not at hand."""
    from raysim.data.medmnist_io import is_volumetric, medmnist_info, task_of

    meta = medmnist_info()[flag]
    splits = meta["n_samples"]
    counts = {"n_train": int(splits["train"]), "n_test": int(splits["test"])}
    classes = len(meta["label"])
    if is_volumetric(flag):
        return write_volume_npz(root, flag, size=size, num_classes=classes, **counts)
    if task_of(flag) == "multi-label":
        return write_multilabel_npz(root, flag, size=size, num_labels=classes, **counts)
    return write_medmnist_npz(root, flag, size=size, channels=int(meta["n_channels"]),
                              num_classes=classes, n_val=int(splits["val"]), compress=False,
                              **counts)


__all__ = ["write_medmnist_npz", "write_multilabel_npz", "write_recordings",
           "write_segmentation_sites", "write_site", "write_stand_in", "write_volume_npz"]


def _save(root: Path, flag: str, size: int, arrays: dict[str, Any],
          compress: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / (f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz")
    (np.savez_compressed if compress else np.savez)(path, **arrays)
    return path


def write_recordings(folder: Path, *, subjects: int = 6, nights: int = 2, epochs: int = 40,
                     length: int = 100, num_classes: int = 5, channels: int = 1,
                     seed: int = 0, header: bool = True) -> Path:
    """Write a folder of generated recordings in DeepSleepNet's npz format, Sleep-EDF's names
    (``SC4<subject><night>E0.npz``): ``x`` (epochs, length, channels) float32 at 100 Hz,
    ``y`` int32, ``fs``, ``ch_label``, and (``header``) a pickled header entry as the real
    files carry, which a loader must never unpickle. Class c is a sine of (c + 1) * 3 Hz on
    noise, with a per-subject amplitude, so a sequence model can learn it."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    time = np.arange(length) / 100.0
    for subject in range(subjects):
        gain = rng.uniform(20, 40)
        for night in range(1, nights + 1):
            labels = np.concatenate([np.arange(num_classes),
                                     rng.integers(0, num_classes, epochs - num_classes)])
            phase = rng.uniform(0, 2 * np.pi, size=(epochs, 1, channels))
            signal = np.sin(2 * np.pi * 3 * (labels[:, None, None] + 1) * time[None, :, None]
                            + phase)
            x = gain * signal + rng.normal(0, 10, size=(epochs, length, channels))
            arrays: dict[str, Any] = {"x": x.astype(np.float32), "y": labels.astype(np.int32),
                                      "fs": np.float64(100.0),
                                      "ch_label": np.str_("EEG Fpz-Cz")}
            if header:
                arrays["header_raw"] = np.array({"local_subject_id": str(subject)},
                                                dtype=object)
            np.savez(folder / f"SC4{subject:02d}{night}E0.npz", **arrays)
    return folder


def write_segmentation_sites(root: Path, *, sites: int = 2, images: int = 12, size: int = 40,
                             seed: int = 0) -> list[Path]:
    """Write ``sites`` generated site folders under ``root`` (``site<k>/images/*.png`` and
    ``site<k>/masks/*.png``, masks 0/255): a bright disc of random centre and radius on noise,
    its mask the disc, each site with its own brightness and image size (``size`` + 8 k), so
    that a U-Net can learn them and sites differ in appearance and resolution."""
    rng = np.random.default_rng(seed)
    return [write_site(root / f"site{site}", images=images, size=size + 8 * site,
                       brightness=70 + 20 * site, rng=rng) for site in range(sites)]


def write_site(folder: Path, *, images: int, size: int, brightness: float,
               rng: np.random.Generator, suffix: str = ".png") -> Path:
    """Write one generated site folder (``images/`` and ``masks/``, pairs named by index;
    images in ``suffix``'s format, masks 0/255 PNG): a bright disc of random centre and
    radius on noise of mean ``brightness``, ``size`` pixels square, its mask the disc."""
    from PIL import Image

    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "masks").mkdir(parents=True, exist_ok=True)
    rows, cols = np.mgrid[0:size, 0:size]
    for index in range(images):
        centre = rng.uniform(0.3 * size, 0.7 * size, size=2)
        radius = rng.uniform(0.12 * size, 0.25 * size)
        disc = (rows - centre[0]) ** 2 + (cols - centre[1]) ** 2 < radius ** 2
        picture = rng.normal(brightness, 20, size=(size, size, 3)) + 100 * disc[..., None]
        Image.fromarray(np.clip(picture, 0, 255).astype(np.uint8)).save(
            folder / "images" / f"{index:03d}{suffix}")
        Image.fromarray((disc * 255).astype(np.uint8)).save(
            folder / "masks" / f"{index:03d}.png")
    return folder
