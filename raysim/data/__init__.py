"""Datasets (MedMNIST 2D and embedded scikit-learn sets) and seeded partitions."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from raysim.configuration.schema import DatasetConfig
from raysim.data.builtin import BUILTIN_DATASETS, load_builtin
from raysim.data.dataset import ArrayDataset, DataInfo, to_tensor
from raysim.data.medmnist_io import load_medmnist
from raysim.data.medsegbench_io import load_medsegbench
from raysim.data.partition import Partition, label_keys, make_partition, mask_keys
from raysim.data.registry import DATASETS, load_path
from raysim.data.segmentation import load_sites
from raysim.seeding import numpy_rng

__all__ = ["ArrayDataset", "DataInfo", "Partition", "load_dataset", "make_partition", "to_tensor"]


def load_dataset(config: DatasetConfig, data_root: str | None = None) -> ArrayDataset:
    """Load the dataset a config names; ``data_root`` overrides ``config.root``. With
    ``train_subset`` only that many training samples are kept (a fixed, seed-independent,
    class-stratified draw: :func:`subset_keys`)."""
    name = config.name.lower()
    if config.sites is not None:
        dataset = load_sites(config, data_root)
    elif config.medsegbench is not None:
        dataset = load_medsegbench(config, data_root or config.root)
    elif config.path is not None:
        dataset = load_path(config, data_root)
    elif name in DATASETS:  # a plug-in's
        dataset = DATASETS[name](config, data_root)
    elif name in BUILTIN_DATASETS:
        dataset = load_builtin(name)
    else:
        dataset = load_medmnist(
            name, config.size, data_root or config.root, config.download, config.verify_checksum
        )
    if config.train_subset is None or config.train_subset >= len(dataset.train_y):
        return dataset
    groups = dataset.train_groups
    keep = stratified_subset(subset_keys(dataset), config.train_subset)
    blocks = dataset.train_blocks
    return replace(dataset, train_x=dataset.train_x[keep], train_y=dataset.train_y[keep],
                   train_groups=None if groups is None else groups[keep],
                   train_blocks=None if blocks is None else blocks[keep])


def subset_keys(dataset: ArrayDataset) -> np.ndarray:
    """The strata of a ``train_subset`` draw, one per training sample: its class (multi-label:
    its dominant finding); for masks, whether it holds foreground within its site (so that
    every site keeps its share)."""
    labels = dataset.train_y
    if not dataset.info.segmentation:
        return label_keys(labels, labels)
    keys = mask_keys(labels)
    if dataset.train_groups is None:
        return keys
    return np.asarray(dataset.train_groups, dtype=np.int64) * (int(keys.max()) + 1) + keys


def stratified_subset(labels: np.ndarray, size: int) -> np.ndarray:
    """Sorted indices of ``size`` samples with the class proportions of ``labels`` (largest
    remainders), drawn from the fixed stream (0, "train-subset")."""
    rng = numpy_rng(0, "train-subset")
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * size / len(labels)
    take = np.floor(quota).astype(np.int64)
    take[np.argsort(-(quota - take), kind="stable")[: size - int(take.sum())]] += 1
    picks = [rng.permutation(np.flatnonzero(labels == cls))[:n] for cls, n in zip(classes, take,
                                                                                    strict=True)]
    return np.sort(np.concatenate(picks))
