"""Datasets beyond MedMNIST: a plug-in's loader registered by name, and a ``.npz`` file in
MedMNIST's layout or a folder of images per class named by ``dataset.path``.

A registered loader takes the config's ``dataset`` section and the ``--data-root`` directory
and returns an :class:`ArrayDataset` (train and test splits, optionally the dataset's own
validation split), whose :class:`DataInfo` says whether it holds images or tabular features
and which task its labels are (:func:`arrays_dataset` fills it in from the arrays)::

    from raysim.data.registry import arrays_dataset, register_dataset

    @register_dataset("my_scans")
    def load_my_scans(config, data_root):
        arrays = np.load(Path(data_root or ".") / "my_scans.npz")
        return arrays_dataset("my_scans", arrays)

Partitions, metrics, reports and the membership audit then work on it as on MedMNIST.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from raysim.configuration.schema import DatasetConfig
from raysim.data.dataset import ArrayDataset, DataInfo, Task
from raysim.data.paths import under_data_root
from raysim.data.recordings import is_recording_folder, load_recordings
from raysim.errors import ConfigError

Loader = Callable[[DatasetConfig, "str | None"], ArrayDataset]

DATASETS: dict[str, Loader] = {}
"""Registered dataset loaders by (lower-case) config name."""


def register_dataset(name: str) -> Callable[[Loader], Loader]:
    """Decorator: register ``load(config, data_root) -> ArrayDataset`` under ``name`` (the
    config's ``dataset.name``). Names of MedMNIST subsets and built-in sets are refused."""

    def decorator(load: Loader) -> Loader:
        key = name.lower()
        taken = DATASETS.get(key)
        if taken is not None and (taken.__module__, taken.__qualname__) != (
                load.__module__, load.__qualname__):
            raise ValueError(f"the dataset name {name!r} is taken by "
                             f"{taken.__module__}.{taken.__qualname__}")
        DATASETS[key] = load
        return load

    return decorator


_SPLITS = ("train", "val", "test")


def arrays_dataset(name: str, arrays: Mapping[str, np.ndarray],
                   label_names: tuple[str, ...] = (), *, task: Task | None = None
                   ) -> ArrayDataset:
    """An :class:`ArrayDataset` from arrays in MedMNIST's layout: ``train_images`` and
    ``train_labels``, ``test_images`` and ``test_labels``, optionally ``val_images`` and
    ``val_labels``. uint8 images are (N, H, W), (N, H, W, C) or volumes (N, D, H, W) and are
    scaled to [-1, 1] as MedMNIST's are; any other dtype is taken as tabular features (N, F),
    used as given (standardise them first). Labels are class indices (N,) or (N, 1), or a
    0/1 row per sample for a multi-label task. ``task``: default multi-label for 0/1 rows,
    binary-class for two classes, else multi-class."""
    missing = [key for split in ("train", "test") for key in (f"{split}_images",
                                                              f"{split}_labels")
               if key not in arrays]
    if missing:
        raise ConfigError(
            f"Dataset {name!r} lacks {', '.join(missing)}: a dataset file holds train_images, "
            "train_labels, test_images and test_labels (and optionally val_images and "
            "val_labels), as MedMNIST's npz files do.")
    for split in _SPLITS:
        if f"{split}_images" in arrays and f"{split}_labels" in arrays and \
                len(arrays[f"{split}_images"]) != len(arrays[f"{split}_labels"]):
            raise ConfigError(
                f"Dataset {name!r}: {split}_images holds {len(arrays[f'{split}_images'])} "
                f"samples but {split}_labels {len(arrays[f'{split}_labels'])} labels; a dataset "
                "file needs one label per sample in each split. Fix the file (or the folder it "
                "was made from) so that the counts agree.")
    images = np.asarray(arrays["train_images"])
    labels = {split: _labels(np.asarray(arrays[f"{split}_labels"]))
              for split in _SPLITS if f"{split}_labels" in arrays}
    multi_label = labels["train"].ndim == 2
    num_classes = (labels["train"].shape[1] if multi_label
                   else int(max(int(y.max()) for y in labels.values()) + 1))
    if task is None:
        task = "multi-label" if multi_label else "binary-class" if num_classes == 2 \
            else "multi-class"
    if images.dtype == np.uint8 and images.ndim >= 3:
        channels = images.shape[3] if images.ndim == 4 and images.shape[3] in (1, 3) else 1
        spatial = images.shape[1:3] if channels > 1 or images.ndim == 3 else images.shape[1:]
        info = DataInfo(name=name, kind="image", num_classes=num_classes,
                        input_shape=(channels, *spatial), mean=(0.5,) * channels,
                        std=(0.5,) * channels, task=task, label_names=label_names)
    else:
        info = DataInfo(name=name, kind="tabular", num_classes=num_classes,
                        input_shape=(int(np.prod(images.shape[1:])),), task=task,
                        label_names=label_names)
        arrays = {key: (np.asarray(value, dtype=np.float32).reshape(len(value), -1)
                        if key.endswith("_images") else value) for key, value in arrays.items()}
    return ArrayDataset(
        info, np.asarray(arrays["train_images"]), labels["train"],
        np.asarray(arrays["test_images"]), labels["test"],
        np.asarray(arrays["val_images"]) if "val_images" in arrays else None, labels.get("val"))


def _labels(raw: np.ndarray) -> np.ndarray:
    """int64 class indices (N,), or the (N, L) 0/1 rows of a multi-label task."""
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    return raw.astype(np.int64)


def load_path(config: DatasetConfig, data_root: str | None) -> ArrayDataset:
    """The dataset at ``dataset.path`` (relative paths: under ``--data-root`` when given, else
    the current directory), named ``dataset.name``: a ``.npz`` file in MedMNIST's layout, a
    folder of images with ``train/``, ``test/`` and optionally ``val/``, each holding one
    folder of image files per class (the class names sorted give the labels), or a folder of
    recordings (:mod:`raysim.data.recordings`)."""
    assert config.path is not None
    path = under_data_root(config.path, data_root)
    if path.is_dir() and is_recording_folder(path):
        return load_recordings(path, config)
    if path.is_dir():
        return arrays_dataset(config.name, *_image_folders(path))
    if not path.is_file():
        raise ConfigError(
            f"Invalid config field `dataset.path` = {config.path!r}: no file or folder at "
            f"{path}. Point it at a .npz file holding train_images, train_labels, test_images "
            "and test_labels, or a folder with train/ and test/ holding one folder of images "
            "per class (relative paths are read under --data-root when given).")
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    return arrays_dataset(config.name, arrays)


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


def _image_folders(root: Path) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """The arrays of an image-folder dataset (``<split>/<class>/<image>``) and its class
    names; every image must have the same size and mode."""
    from PIL import Image  # (a dependency of matplotlib and medmnist)

    splits = [split for split in _SPLITS if (root / split).is_dir()]
    if "train" not in splits or "test" not in splits:
        raise ConfigError(
            f"Invalid config field `dataset.path` = {str(root)!r}: an image folder needs "
            "train/ and test/ subfolders (and optionally val/), each with one folder of "
            "images per class.")
    classes = sorted(child.name for child in (root / "train").iterdir() if child.is_dir())
    arrays: dict[str, np.ndarray] = {}
    for split in splits:
        images, labels = [], []
        for label, name in enumerate(classes):
            folder = root / split / name
            files = sorted(p for p in folder.iterdir()
                           if p.suffix.lower() in IMAGE_SUFFIXES) if folder.is_dir() else []
            for file in files:
                with Image.open(file) as image:
                    images.append(np.asarray(image.convert("L" if image.mode in ("L", "I",
                                  "I;16", "1") else "RGB")))
                labels.append(label)
        shapes = {image.shape for image in images}
        if len(shapes) != 1:
            raise ConfigError(
                f"Invalid config field `dataset.path` = {str(root)!r}: the images of "
                f"{split}/ have {len(shapes)} different sizes ({sorted(shapes)[:3]}); resize "
                "them to one size first.")
        arrays[f"{split}_images"] = np.stack(images).astype(np.uint8)
        arrays[f"{split}_labels"] = np.asarray(labels, dtype=np.int64)
    return arrays, tuple(classes)
