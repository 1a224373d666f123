"""Datasets beyond MedMNIST: a plug-in's loader registered by name, and any ``.npz`` file in
MedMNIST's layout named by ``dataset.path``.

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

from raysim.data.dataset import ArrayDataset, DataInfo, Task
from raysim.errors import ConfigError
from raysim.schema import DatasetConfig

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


def arrays_dataset(name: str, arrays: Mapping[str, np.ndarray], *,
                   task: Task | None = None, label_names: tuple[str, ...] = ()
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


def load_npz_file(config: DatasetConfig, data_root: str | None) -> ArrayDataset:
    """The dataset in the ``.npz`` file ``dataset.path`` (relative paths: under
    ``--data-root`` when given, else the current directory), named ``dataset.name``."""
    assert config.path is not None
    path = Path(config.path).expanduser()
    if not path.is_absolute() and data_root is not None:
        path = Path(data_root) / path
    if not path.is_file():
        raise ConfigError(
            f"Invalid config field `dataset.path` = {config.path!r}: no file at {path}. Point "
            "it at a .npz file holding train_images, train_labels, test_images and "
            "test_labels (relative paths are read under --data-root when given).")
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    return arrays_dataset(config.name, arrays)
