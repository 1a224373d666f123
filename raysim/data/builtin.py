"""Embedded offline datasets from scikit-learn (no download needed).

Each dataset is made once per scikit-learn and numpy version and kept in raysim's cache
(``RAYSIM_CACHE``, else ``~/.cache/raysim``) as an npz file: later loads read it without importing
scikit-learn (about 0.9 s of CPU on the development machine, in the middle of a command's
start-up). The file holds the arrays scikit-learn's functions gave, so a load from it is the
same data bit for bit; a file that cannot be read or written is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from raysim.cache import cache_root
from raysim.data.dataset import ArrayDataset, DataInfo

BUILTIN_DATASETS = ("breast-cancer", "digits", "synthetic", "synthetic-susy", "synthetic-100")
TABULAR_DATASETS = ("breast-cancer", "synthetic", "synthetic-susy", "synthetic-100")
"""The built-in datasets of feature vectors; every other dataset holds images."""
SYNTHETIC_SAMPLES = 50_000
_TEST_FRACTION = 0.2
_SPLIT_SEED = 0  # the split belongs to the dataset, not to the run: every seed sees the same test set


CACHE_FORMAT = 1
"""The layout of the cached files (part of their names: a new layout makes new files)."""

_ARRAYS = ("train_x", "train_y", "test_x", "test_y")


def load_builtin(name: str) -> ArrayDataset:
    """A built-in dataset (:func:`make_builtin`), from raysim's cache when it was made before
    with the same scikit-learn and numpy versions."""
    if name not in BUILTIN_DATASETS:
        raise KeyError(name)
    path = cache_path(name)
    if path is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            return _read(path)
    dataset = make_builtin(name)
    if path is not None:
        with contextlib.suppress(OSError):
            _write(path, dataset)
    return dataset


def cache_path(name: str) -> Path | None:
    """Where the built-in dataset ``name`` is kept for the installed scikit-learn and numpy, or
    None when scikit-learn's version cannot be read."""
    try:
        sklearn_version = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return None
    return (cache_root() / "builtin"
            / f"{name}-v{CACHE_FORMAT}-sklearn{sklearn_version}-numpy{np.__version__}.npz")


def _read(path: Path) -> ArrayDataset:
    with np.load(path, allow_pickle=False) as stored:
        fields: dict[str, Any] = {key: tuple(value) if isinstance(value, list) else value
                                  for key, value in json.loads(str(stored["info"])).items()}
        info = DataInfo(**fields)
        return ArrayDataset(info, *(stored[key] for key in _ARRAYS))


def _write(path: Path, dataset: ArrayDataset) -> None:
    """Write atomically (a concurrent reader sees the whole file or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    info = json.dumps(dataclasses.asdict(dataset.info))
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".npz.tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez(file, info=np.array(info),
                     **{key: getattr(dataset, key) for key in _ARRAYS})
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def make_builtin(name: str) -> ArrayDataset:
    """Make ``breast-cancer`` (30 tabular features, 2 classes), ``digits`` (8x8 images) or
    ``synthetic`` (scikit-learn's make_classification: 50,000 samples, 30 features, 2 classes;
    breast-cancer-shaped data for scale tests and benchmarks, not real data) or
    ``synthetic-susy`` (make_classification in the shape of the SUSY benchmark that FedDC's
    Radon experiment uses: 18 features, 2 classes, noisy labels, so that a linear model reaches
    about the 0.77-0.80 accuracy of linear models on SUSY; not real data) or ``synthetic-100``
    (make_classification with 100 features and its other defaults, as FedDC's synthetic
    small-data experiment describes its data)."""
    # imported here: worker processes import this module but never load data (seconds saved
    # at every worker's start)
    from sklearn.datasets import load_breast_cancer, load_digits, make_classification
    from sklearn.preprocessing import StandardScaler

    if name in TABULAR_DATASETS:
        if name == "breast-cancer":
            bunch = load_breast_cancer()
            features, target = bunch.data, bunch.target
        elif name == "synthetic-susy":
            features, target = make_classification(
                SYNTHETIC_SAMPLES, n_features=18, n_informative=8, n_redundant=4,
                class_sep=0.55, flip_y=0.15, random_state=_SPLIT_SEED)
        elif name == "synthetic-100":
            features, target = make_classification(SYNTHETIC_SAMPLES, n_features=100,
                                                   random_state=_SPLIT_SEED)
        else:
            features, target = make_classification(
                SYNTHETIC_SAMPLES, n_features=30, n_informative=10, n_redundant=5,
                class_sep=0.8, flip_y=0.05, random_state=_SPLIT_SEED)
        x_train, x_test, y_train, y_test = _split(features, target)
        scaler = StandardScaler().fit(x_train)
        info = DataInfo(name, "tabular", 2, (x_train.shape[1],))
        return ArrayDataset(
            info,
            scaler.transform(x_train).astype(np.float32),
            y_train.astype(np.int64),
            scaler.transform(x_test).astype(np.float32),
            y_test.astype(np.int64),
        )
    if name == "digits":
        bunch = load_digits()
        images = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
        x_train, x_test, y_train, y_test = _split(images, bunch.target)
        info = DataInfo(name, "image", 10, (1, 8, 8), mean=(0.5,), std=(0.5,))
        return ArrayDataset(info, x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64))
    raise KeyError(name)


def _split(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    from sklearn.model_selection import train_test_split

    return train_test_split(x, y, test_size=_TEST_FRACTION, random_state=_SPLIT_SEED, stratify=y)
