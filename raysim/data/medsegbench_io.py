"""MedSegBench (Kuş and Aydin, Scientific Data 2024) segmentation sets from their npz releases:
``<name>_<size>.npz`` (size 128, 256 or 512) with ``{split}_images`` and ``{split}_label`` for
the splits train, val and test, and for multi-centre sets (PolypGen) also
``{split}_images_C<k>`` / ``{split}_label_C<k>`` per centre k.

The file is read from the data root; when it is missing it is downloaded from the URL in the
``medsegbench`` package's metadata (``medsegbench.info.INFO``; install it with ``pip install
--no-deps medsegbench``: raysim reads only its table) and checked against its MD5, as MedMNIST
files are. Images are resized to ``dataset.resize`` (bilinear) and masks with them (nearest);
the official validation split is kept as the dataset's (``evaluation.validation: official``);
each centre of a multi-centre set is a site (``partition.scheme: sites``).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np

from raysim.configuration.schema import DatasetConfig
from raysim.data.dataset import ArrayDataset, DataInfo
from raysim.data.medmnist_io import check_md5, fetch_file
from raysim.errors import ConfigError, DataError, MissingDataError

RELEASED_SIZES = (128, 256, 512)
_SPLITS = ("train", "val", "test")


def medsegbench_info() -> dict[str, dict[str, Any]] | None:
    """The medsegbench package's table of datasets (URLs, MD5s), or None when it is not
    installed (its import prints a notice when its own training dependencies are missing,
    kept off the terminal)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            from medsegbench.info import INFO  # type: ignore[import-not-found]
    except ImportError:
        return None
    return dict(INFO)


def release_size(resize: int) -> int:
    """The smallest released size at least ``resize`` (512 for larger ones)."""
    return next((size for size in RELEASED_SIZES if size >= resize), RELEASED_SIZES[-1])


def load_medsegbench(config: DatasetConfig, root: str | None) -> ArrayDataset:
    """The MedSegBench set ``config.medsegbench`` as a segmentation :class:`ArrayDataset`."""
    assert config.medsegbench is not None
    name = config.medsegbench.lower()
    size = release_size(config.resize)
    file = f"{name}_{size}.npz"
    path = Path(root or Path.home() / ".medsegbench").expanduser() / file
    info = medsegbench_info()
    meta = None if info is None else info.get(name)
    if info is not None and meta is None:
        raise ConfigError(
            f"Invalid config field `dataset.medsegbench` = {config.medsegbench!r}: not a "
            f"MedSegBench dataset. Allowed: {', '.join(sorted(info))}.")
    if not path.exists():
        if meta is None:
            raise MissingDataError(
                f"MedSegBench file {file} is missing at {path}. Put the file there or point "
                "`--data-root DIR` at a directory that holds it; to download it, install the "
                "medsegbench package's metadata (`pip install --no-deps medsegbench`) on a "
                "machine with internet access and run again.")
        fetch_file(path, meta[f"url_{size}"], config.download, "MedSegBench")
    if meta is not None and config.verify_checksum:
        check_md5(path, meta[f"MD5_{size}"], "MedSegBench")
    arrays = _read(path)
    centres = sorted({key.rsplit("_C", 1)[1] for key in arrays if "_images_C" in key},
                     key=int)
    splits = {split: _split(arrays, split, centres, path) for split in _SPLITS
              if f"{split}_images" in arrays or f"{split}_images_C1" in arrays}
    for needed in ("train", "test"):
        if needed not in splits:
            raise DataError(f"{path} is not in MedSegBench's layout: it has no {needed} split "
                            f"(keys: {', '.join(sorted(arrays))}).")
    resized = {split: (*_resize(*parts[:2], config.resize), parts[2])
               for split, parts in splits.items()}
    masks = np.concatenate([resized[s][1] for s in resized])
    num_classes = config.num_classes or max(2, int(masks.max()) + 1)
    if masks.max() >= num_classes:
        raise DataError(f"{path}: a mask holds the value {int(masks.max())}, not a class of "
                        f"0..{num_classes - 1} (dataset.num_classes).")
    channels = 3 if resized["train"][0].ndim == 4 else 1
    data_info = DataInfo(name=f"{name}_{config.resize}", kind="image", num_classes=num_classes,
                         input_shape=(channels, config.resize, config.resize),
                         mean=(0.5,) * channels, std=(0.5,) * channels, task="segmentation",
                         label_names=("background", "foreground") if num_classes == 2 else ())
    train, test = resized["train"], resized["test"]
    val = resized.get("val")
    return ArrayDataset(data_info, train[0], train[1], test[0], test[1],
                        None if val is None else val[0], None if val is None else val[1],
                        train_groups=train[2], test_groups=test[2])


def _read(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (ValueError, OSError, EOFError) as error:
        raise DataError(f"{path} cannot be read as an npz file ({error}): it is corrupt or "
                        "truncated. Delete it to download it again.") from None


def _split(arrays: dict[str, np.ndarray], split: str, centres: list[str], path: Path
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images, masks as uint8 classes, centre index per image) of one split."""
    if centres:
        parts = [(arrays[f"{split}_images_C{c}"], arrays[f"{split}_label_C{c}"])
                 for c in centres]
    else:
        parts = [(arrays[f"{split}_images"], arrays[f"{split}_label"])]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    if labels.ndim == 4:  # (N, H, W, 1)
        labels = labels[..., 0]
    if len(images) != len(labels) or images.shape[1:3] != labels.shape[1:3]:
        raise DataError(f"{path}: the {split} split holds {len(images)} images of "
                        f"{images.shape[1:3]} and {len(labels)} masks of {labels.shape[1:3]}; "
                        "every image needs a mask of its size.")
    masks = (labels > 127) if labels.max(initial=0) > 1 and len(np.unique(labels)) <= 2 \
        else labels
    groups = np.concatenate([np.full(len(p[0]), k, np.int64) for k, p in enumerate(parts)])
    return images.astype(np.uint8), masks.astype(np.uint8), groups


def _resize(images: np.ndarray, masks: np.ndarray, size: int
            ) -> tuple[np.ndarray, np.ndarray]:
    if images.shape[1] == size and images.shape[2] == size:
        return images, masks
    from PIL import Image

    resized = np.stack([np.asarray(Image.fromarray(image).resize(
        (size, size), Image.Resampling.BILINEAR)) for image in images])
    labels = np.stack([np.asarray(Image.fromarray(mask).resize(
        (size, size), Image.Resampling.NEAREST)) for mask in masks])
    return resized, labels
