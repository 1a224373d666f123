"""MedSegBench's npz releases as segmentation datasets: the official splits, PolypGen's
centres as sites, resizing from the smallest release at least the asked size, and one
paragraph for a missing file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from raysim.configuration.schema import DatasetConfig, PartitionConfig
from raysim.data import load_dataset, make_partition
from raysim.data.medsegbench_io import release_size
from raysim.errors import MissingDataError


def write_release(root: Path, name: str, size: int, centres: int = 0) -> Path:
    """A small file in MedSegBench's layout: discs on noise, masks 0/255 (as some releases
    store them), per centre when ``centres``."""
    rng = np.random.default_rng(0)
    arrays = {}
    yy, xx = np.mgrid[:size, :size]
    for split, count in (("train", 6), ("val", 2), ("test", 4)):
        for suffix in ([f"_C{k}" for k in range(1, centres + 1)] or [""]):
            images = rng.integers(0, 80, (count, size, size, 3)).astype(np.uint8)
            masks = np.zeros((count, size, size), np.uint8)
            for i in range(count):
                disc = (yy - size / 2) ** 2 + (xx - size / 2) ** 2 < (size / (3 + i)) ** 2
                images[i][disc] = 220
                masks[i][disc] = 255
            arrays[f"{split}_images{suffix}"] = images
            arrays[f"{split}_label{suffix}"] = masks
    path = root / f"{name}_{size}.npz"
    np.savez(path, **arrays)
    return path


def test_a_multi_centre_release_loads_with_its_splits_and_centres_as_sites(tmp_path):
    write_release(tmp_path, "polypgen", 128, centres=2)
    assert release_size(64) == 128 and release_size(300) == 512
    dataset = load_dataset(DatasetConfig(name="polypgen", medsegbench="polypgen", resize=32),
                           str(tmp_path))
    info = dataset.info
    assert (info.task, info.num_classes, info.input_shape) == ("segmentation", 2, (3, 32, 32))
    assert dataset.train_y.shape == (12, 32, 32) and set(np.unique(dataset.train_y)) == {0, 1}
    assert dataset.val_y is not None and len(dataset.val_y) == 4
    assert dataset.train_groups is not None and dataset.test_groups is not None
    partition = make_partition(dataset.train_y, dataset.test_y,
                               PartitionConfig(scheme="sites", num_clients=2), 2, 0,
                               dataset.train_groups, dataset.test_groups)
    assert [set(dataset.train_groups[s]) for s in partition.train] == [{0}, {1}]


def test_a_single_centre_release_is_one_site(tmp_path):
    write_release(tmp_path, "kvasir", 128)
    dataset = load_dataset(DatasetConfig(name="kvasir", medsegbench="kvasir", resize=128),
                           str(tmp_path))
    assert dataset.train_x.shape == (6, 128, 128, 3)
    assert dataset.train_groups is not None and set(dataset.train_groups) == {0}


def test_a_missing_release_is_one_paragraph_naming_the_file_and_the_data_root(tmp_path):
    with pytest.raises(MissingDataError, match=r"polypgen_256\.npz.*--data-root") as raised:
        load_dataset(DatasetConfig(name="p", medsegbench="polypgen", resize=200), str(tmp_path))
    assert "\n" not in str(raised.value)
