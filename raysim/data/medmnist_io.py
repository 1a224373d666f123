"""MedMNIST files (2D and 3D): located, checked and downloaded through the medmnist package's
metadata."""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from raysim.cache import cache_root
from raysim.data.builtin import BUILTIN_DATASETS
from raysim.data.dataset import ArrayDataset, DataInfo, Task
from raysim.errors import ConfigError, DataError, MissingDataError

_TASKS: dict[str, Task] = {"multi-class": "multi-class", "binary-class": "binary-class",
                           "ordinal-regression": "ordinal-regression",
                           "multi-label, binary-class": "multi-label"}
"""INFO's task names -> raysim's."""
SIZES_3D = (28, 64)
"""The sizes MedMNIST releases its 3D subsets at."""


def _package_module(name: str, alias: str) -> Any:
    """The medmnist package's module file ``<name>.py``, executed as module ``alias`` without
    running the package's ``__init__`` (which imports its datasets and evaluator: scikit-learn,
    pandas, torchvision)."""
    package = importlib.util.find_spec("medmnist")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'medmnist' (pip install medmnist)")
    location = Path(next(iter(package.submodule_search_locations))) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(alias, location)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _info_module() -> Any:
    """medmnist's ``info`` module (its metadata: file names, MD5s, URLs, labels).

    Read from the installed package without running the package's ``__init__``: about 1.3 s of
    an invocation's start-up for a table of constants. The metadata is the package's own file.
    """
    if "medmnist.info" in sys.modules:
        return sys.modules["medmnist.info"]
    return _package_module("info", "raysim._medmnist_info")


@functools.cache
def medmnist_evaluator() -> Any:
    """The ``medmnist`` package's ``evaluator`` module (``getAUC``, ``getACC``), loaded the same
    way (its ``from medmnist.info import ...`` finds the table loaded above)."""
    if "medmnist.evaluator" in sys.modules:
        return sys.modules["medmnist.evaluator"]
    added = "medmnist.info" not in sys.modules
    if added:
        sys.modules["medmnist.info"] = _info_module()
    try:
        return _package_module("evaluator", "raysim._medmnist_evaluator")
    finally:
        if added:
            sys.modules.pop("medmnist.info", None)


def medmnist_info() -> dict[str, dict]:
    """The medmnist package's INFO table: every 2D and 3D subset (3D flags end in ``3d``)."""
    return dict(_info_module().INFO)


def is_volumetric(flag: str) -> bool:
    """True for a MedMNIST 3D subset (its flag ends in ``3d``)."""
    return flag.endswith("3d")


def task_of(flag: str) -> Task | None:
    """raysim's task type of a MedMNIST subset (None for a name that is not one)."""
    meta = medmnist_info().get(flag)
    return None if meta is None else _TASKS[meta["task"]]


def default_root() -> str:
    """medmnist's own default data directory (``~/.medmnist``)."""
    return str(_info_module().DEFAULT_ROOT)


def file_name(flag: str, size: int) -> str:
    """The official file name of a subset at a size (``pneumoniamnist_64.npz``)."""
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def load_medmnist(
    flag: str, size: int, root: str | None, download: bool, verify_checksum: bool
) -> ArrayDataset:
    """Load the train, validation and test splits of a MedMNIST subset (2D or 3D).

    The file is read from ``root`` (default: medmnist's root), its MD5 is checked against the
    medmnist metadata, and it is downloaded when missing and ``download`` is true. Labels are
    int64: one class per sample, or a 0/1 row of every label for a multi-label task.
    """
    info_table = medmnist_info()
    if flag not in info_table:
        from raysim.data.registry import DATASETS

        close = difflib.get_close_matches(flag, [*DATASETS, *BUILTIN_DATASETS, *info_table], n=1)
        raise ConfigError(
            f"Invalid config field `dataset.name` = {flag!r}: not a MedMNIST subset or built-in "
            f"dataset{f' (did you mean {close[0]!r}?)' if close else ''}. Allowed: "
            f"{', '.join([*DATASETS, *BUILTIN_DATASETS])}, {', '.join(sorted(info_table))}; "
            "or any label with `dataset.path` naming a .npz file. Fix the name in the YAML "
            "file or with `--set dataset.name=...`, or import the plug-in that registers it "
            "(`plugins:` / `--plugin`)."
        )
    meta = info_table[flag]
    volumetric = is_volumetric(flag)
    if volumetric and size not in SIZES_3D:
        raise ConfigError(
            f"Invalid config field `dataset.size` = {size}: MedMNIST releases the 3D subset "
            f"{flag} at {' and '.join(map(str, SIZES_3D))} px (volumes of size^3) only. Set "
            "dataset.size to 28 or 64."
        )
    suffix = "" if size == 28 else f"_{size}"
    url, md5 = meta[f"url{suffix}"], meta[f"MD5{suffix}"]
    path = Path(root or default_root()).expanduser() / file_name(flag, size)
    if not path.exists():
        fetch_file(path, url, download)
    if verify_checksum:
        check_md5(path, md5)
    arrays = _read_npz(path)
    channels = int(meta["n_channels"])
    task = _TASKS[meta["task"]]
    layout = _Layout(size, channels, len(meta["label"]), volumetric, task == "multi-label")
    layout.check(path, arrays)
    spatial = (size,) * (3 if volumetric else 2)
    info = DataInfo(
        name=flag if size == 28 else f"{flag}_{size}",
        kind="image",
        num_classes=len(meta["label"]),
        input_shape=(channels, *spatial),
        mean=(0.5,) * channels,
        std=(0.5,) * channels,
        task=task,
        label_names=tuple(meta["label"][str(k)] for k in range(len(meta["label"]))),
    )
    labels = {split: layout.labels(arrays[f"{split}_labels"]) for split in _SPLITS
              if f"{split}_labels" in arrays}  # (a hand-made file may lack the val split)
    return ArrayDataset(
        info,
        arrays["train_images"], labels["train"],
        arrays["test_images"], labels["test"],
        arrays.get("val_images"), labels.get("val"),
    )


def fetch_file(path: Path, url: str, download: bool, label: str = "MedMNIST") -> None:
    """Download ``url`` to ``path`` (atomically) when ``download``; else, or when it fails,
    one paragraph naming the ``label`` file, where it is missing and ``--data-root``."""
    hint = (
        f"Put the file there, point `--data-root DIR` (or `dataset.root`) at a directory that "
        f"holds it, or download it from {url}"
    )
    if not download:
        raise MissingDataError(f"{label} file {path.name} is missing at {path} and downloading is off "
                        f"(dataset.download=false). {hint}.")
    created = [d for d in (path.parent, *path.parent.parents) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, tempfile.NamedTemporaryFile(
            dir=path.parent, delete=False, suffix=".part"
        ) as tmp:
            shutil.copyfileobj(response, tmp)
        os.replace(tmp.name, path)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        for directory in created:  # a failed download leaves no empty --data-root behind
            with contextlib.suppress(OSError):
                directory.rmdir()
        raise MissingDataError(
            f"{label} file {path.name} is missing at {path} and could not be downloaded from "
            f"{url} ({exc}). If this machine is offline, {hint[0].lower() + hint[1:]} on a "
            "machine with internet access."
        ) from None


def _checksum_cache() -> Path:
    """Where verified MD5s are remembered (``RAYSIM_CACHE`` or ~/.cache/raysim)."""
    return cache_root() / "checksums.json"


def _file_md5(path: Path) -> str:
    """The file's MD5, remembered by (path, size, modification time) so an unchanged file is
    read once, not at every start-up (224 px files are hundreds of MB)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    cache = _checksum_cache()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and isinstance(known.get(key), str):
        return known[key]
    digest = hashlib.md5()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    known = {**(known if isinstance(known, dict) else {}), key: digest.hexdigest()}
    with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
        cache.parent.mkdir(parents=True, exist_ok=True)
        temporary = cache.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(known))
        os.replace(temporary, cache)
    return digest.hexdigest()


def check_md5(path: Path, expected: str, label: str = "MedMNIST") -> None:
    """Refuse a ``label`` file whose MD5 is not the release's ``expected`` one."""
    actual = _file_md5(path)
    if actual != expected:
        raise DataError(
            f"{label} file {path} has MD5 {actual}, but the {label.lower()} metadata says "
            f"{expected}: the file is corrupt, truncated or not the official release. Delete it "
            "to download it again, or set dataset.verify_checksum=false for a file you made."
        )


_SPLITS = ("train", "test", "val")


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The npz's arrays: train and test are required, val is read where present."""
    keys = ("train_images", "train_labels", "test_images", "test_labels")
    try:
        with np.load(path) as npz:
            missing = [key for key in keys if key not in npz.files]
            if missing:
                raise DataError(
                    f"{path} is not in the MedMNIST layout: it lacks {', '.join(missing)} "
                    f"(has {', '.join(npz.files)}). Use an official MedMNIST npz file."
                )
            present = keys + tuple(k for k in ("val_images", "val_labels") if k in npz.files)
            members = {key: npz.zip.getinfo(f"{key}.npy") for key in present}
            return {key: _read_member(npz.zip, info) for key, info in members.items()}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise DataError(
            f"{path} cannot be read as an npz file ({exc}): it is corrupt or truncated. "
            "Delete it to download it again, or replace it with the official file."
        ) from None


_NPY_HEADERS = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}


def _read_member(archive: zipfile.ZipFile, member: zipfile.ZipInfo) -> np.ndarray:
    """One ``.npy`` member of an npz as a read-only array over the inflated bytes (as arrays
    that come through Ray's object store are). The member is inflated in one call, without
    the GIL, so that reading a file in one thread goes at full speed while another imports
    torch (numpy's own reader takes the GIL back every 256 KiB and waits for it each time)."""
    raw = archive.read(member)
    header = io.BytesIO(raw[:65536])
    read_header = _NPY_HEADERS.get(npy_format.read_magic(header))
    if read_header is None:  # (a newer .npy version: numpy's own reader)
        return npy_format.read_array(io.BytesIO(raw), allow_pickle=False)
    shape, fortran_order, dtype = read_header(header)
    if dtype.hasobject:
        raise ValueError(f"{member.filename} holds Python objects, not numbers")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(raw, dtype=dtype, count=count, offset=header.tell())
    return flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)


@dataclass(frozen=True)
class _Layout:
    """What a subset's arrays must be: (N, size, size) grey or (N, size, size, 3) RGB uint8
    images, or (N, size, size, size) volumes; one label per sample in [0, classes), or a 0/1
    row of ``classes`` labels for a multi-label task. Checked so that a file made by hand
    (dataset.verify_checksum=false) fails with a clear message, not inside a run."""

    size: int
    channels: int
    classes: int
    volumetric: bool
    multi_label: bool

    def image_shape(self) -> tuple[int, ...]:
        spatial = (self.size,) * (3 if self.volumetric else 2)
        return spatial if self.channels == 1 else (*spatial, self.channels)

    def describe(self) -> str:
        if self.volumetric:
            return f"a 3D subset: volumes (N, D, H, W) with D = H = W = {self.size}"
        if self.channels == 1:
            return f"grey (N, H, W) with H = W = {self.size}"
        return f"RGB (N, H, W, {self.channels}) with H = W = {self.size}"

    def labels(self, raw: np.ndarray) -> np.ndarray:
        """The stored labels as raysim holds them (int64 (N,) or (N, classes))."""
        if self.multi_label:
            return raw.reshape(len(raw), -1).astype(np.int64)
        return raw.reshape(-1).astype(np.int64)

    def check(self, path: Path, arrays: dict[str, np.ndarray]) -> None:
        for split in _SPLITS:
            if f"{split}_images" not in arrays or f"{split}_labels" not in arrays:
                continue
            problem = self._problem(split, arrays[f"{split}_images"], arrays[f"{split}_labels"])
            if problem:
                raise DataError(
                    f"{path} does not fit its MedMNIST subset: {problem}. Use the official "
                    "file, or fix the file you made (dataset.size must match its image size)."
                )

    def _problem(self, split: str, images: np.ndarray, labels: np.ndarray) -> str | None:
        shape = self.image_shape()
        if images.shape[1:] != shape:
            return (f"{split}_images has shape {images.shape}, but this subset at {self.size} "
                    f"px is {self.describe()}, i.e. (N, {', '.join(map(str, shape))})")
        if self.multi_label:
            if labels.ndim != 2 or labels.shape != (len(images), self.classes):
                return (f"{split}_labels has shape {labels.shape}, but this multi-label subset "
                        f"has {self.classes} binary labels per image, i.e. shape "
                        f"({len(images)}, {self.classes})")
            if labels.size and not np.isin(labels, (0, 1)).all():
                return (f"{split}_labels holds values other than 0 and 1; each of the "
                        f"{self.classes} labels of an image is 0 or 1")
            return None
        if labels.size != len(images):
            return (f"{split}_labels holds {labels.size} labels for {len(images)} "
                    f"{split}_images; there must be one label per image")
        if labels.size and (labels.min() < 0 or labels.max() >= self.classes):
            return (f"{split}_labels holds values from {labels.min()} to {labels.max()}, but "
                    f"this subset has {self.classes} classes (labels 0-{self.classes - 1})")
        return None
