"""Datasets (MedMNIST 2D and embedded scikit-learn sets) and seeded partitions."""

from __future__ import annotations

from raysim.data.builtin import BUILTIN_DATASETS, load_builtin
from raysim.data.dataset import ArrayDataset, DataInfo, to_tensor
from raysim.data.medmnist_io import load_medmnist
from raysim.data.partition import Partition, make_partition
from raysim.schema import DatasetConfig

__all__ = ["ArrayDataset", "DataInfo", "Partition", "load_dataset", "make_partition", "to_tensor"]


def load_dataset(config: DatasetConfig, data_root: str | None = None) -> ArrayDataset:
    """Load the dataset a config names; ``data_root`` overrides ``config.root``."""
    name = config.name.lower()
    if name in BUILTIN_DATASETS:
        return load_builtin(name)
    return load_medmnist(
        name, config.size, data_root or config.root, config.download, config.verify_checksum
    )
