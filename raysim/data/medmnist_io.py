"""MedMNIST 2D files: located, checked and downloaded through the medmnist package's metadata."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from raysim.data.dataset import ArrayDataset, DataInfo
from raysim.errors import ConfigError, DataError, MissingDataError

_SUPPORTED_TASKS = ("multi-class", "binary-class", "ordinal-regression")


@functools.cache
def _info_module() -> Any:
    """medmnist's ``info`` module (its metadata: file names, MD5s, URLs, labels).

    Read from the installed package without running the package's ``__init__``, which imports
    its datasets and evaluator (scikit-learn, pandas, torchvision): about 1.3 s of an
    invocation's start-up for a table of constants. The metadata is the package's own file.
    """
    if "medmnist.info" in sys.modules:
        return sys.modules["medmnist.info"]
    package = importlib.util.find_spec("medmnist")
    if package is None or not package.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'medmnist' (pip install medmnist)")
    location = Path(next(iter(package.submodule_search_locations))) / "info.py"
    spec = importlib.util.spec_from_file_location("raysim._medmnist_info", location)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def medmnist_info() -> dict[str, dict]:
    """The medmnist package's INFO table restricted to the 2D subsets."""
    return {flag: meta for flag, meta in _info_module().INFO.items() if not flag.endswith("3d")}


def default_root() -> str:
    """medmnist's own default data directory (``~/.medmnist``)."""
    return str(_info_module().DEFAULT_ROOT)


def file_name(flag: str, size: int) -> str:
    """The official file name of a subset at a size (``pneumoniamnist_64.npz``)."""
    return f"{flag}.npz" if size == 28 else f"{flag}_{size}.npz"


def load_medmnist(
    flag: str, size: int, root: str | None, download: bool, verify_checksum: bool
) -> ArrayDataset:
    """Load the train and test splits of a MedMNIST 2D subset.

    The file is read from ``root`` (default: medmnist's root), its MD5 is checked against the
    medmnist metadata, and it is downloaded when missing and ``download`` is true.
    """
    info_table = medmnist_info()
    if flag not in info_table:
        raise ConfigError(
            f"Invalid config field `dataset.name` = {flag!r}: not a MedMNIST 2D subset or built-in "
            f"dataset. Allowed: breast-cancer, digits, {', '.join(sorted(info_table))}. "
            "Fix the name in the YAML file or with `--set dataset.name=...`."
        )
    meta = info_table[flag]
    if meta["task"] not in _SUPPORTED_TASKS:
        raise ConfigError(
            f"Invalid config field `dataset.name` = {flag!r}: its task is {meta['task']!r}, and "
            f"raysim supports {', '.join(_SUPPORTED_TASKS)} tasks (one label per image). "
            "Choose another MedMNIST subset."
        )
    suffix = "" if size == 28 else f"_{size}"
    url, md5 = meta[f"url{suffix}"], meta[f"MD5{suffix}"]
    path = Path(root or default_root()).expanduser() / file_name(flag, size)
    if not path.exists():
        _fetch(path, url, download)
    if verify_checksum:
        _check_md5(path, md5)
    arrays = _read_npz(path)
    channels = int(meta["n_channels"])
    _check_layout(path, arrays, size, channels, len(meta["label"]))
    info = DataInfo(
        name=flag if size == 28 else f"{flag}_{size}",
        kind="image",
        num_classes=len(meta["label"]),
        input_shape=(channels, size, size),
        mean=(0.5,) * channels,
        std=(0.5,) * channels,
    )
    return ArrayDataset(
        info,
        arrays["train_images"],
        arrays["train_labels"].reshape(-1).astype(np.int64),
        arrays["test_images"],
        arrays["test_labels"].reshape(-1).astype(np.int64),
    )


def _fetch(path: Path, url: str, download: bool) -> None:
    hint = (
        f"Put the file there, point `--data-root DIR` (or `dataset.root`) at a directory that "
        f"holds it, or download it from {url}"
    )
    if not download:
        raise MissingDataError(f"MedMNIST file {path.name} is missing at {path} and downloading is off "
                        f"(dataset.download=false). {hint}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=60) as response, tempfile.NamedTemporaryFile(
            dir=path.parent, delete=False, suffix=".part"
        ) as tmp:
            shutil.copyfileobj(response, tmp)
        os.replace(tmp.name, path)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        raise MissingDataError(
            f"MedMNIST file {path.name} is missing at {path} and could not be downloaded from "
            f"{url} ({exc}). If this machine is offline, {hint[0].lower() + hint[1:]} on a "
            "machine with internet access."
        ) from None


def _checksum_cache() -> Path:
    """Where verified MD5s are remembered (``RAYSIM_CACHE`` or ~/.cache/raysim)."""
    root = os.environ.get("RAYSIM_CACHE") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raysim"
    return Path(root) / "checksums.json"


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


def _check_md5(path: Path, expected: str) -> None:
    actual = _file_md5(path)
    if actual != expected:
        raise DataError(
            f"MedMNIST file {path} has MD5 {actual}, but the medmnist metadata says "
            f"{expected}: the file is corrupt, truncated or not the official release. Delete it "
            "to download it again, or set dataset.verify_checksum=false for a file you made."
        )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    keys = ("train_images", "train_labels", "test_images", "test_labels")
    try:
        with np.load(path) as npz:
            missing = [key for key in keys if key not in npz.files]
            if missing:
                raise DataError(
                    f"{path} is not in the MedMNIST layout: it lacks {', '.join(missing)} "
                    f"(has {', '.join(npz.files)}). Use an official MedMNIST npz file."
                )
            return {key: npz[key] for key in keys}
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as exc:
        raise DataError(
            f"{path} cannot be read as an npz file ({exc}): it is corrupt or truncated. "
            "Delete it to download it again, or replace it with the official file."
        ) from None


def _check_layout(path: Path, arrays: dict[str, np.ndarray], size: int, channels: int,
                  num_classes: int) -> None:
    """The arrays must be what the subset promises: (N, size, size) grey or (N, size, size, 3)
    RGB uint8 images, one label per image, labels in [0, classes). Checked here so that a file
    made by hand (dataset.verify_checksum=false) fails with a clear message, not inside a run."""
    image_shape = (size, size) if channels == 1 else (size, size, channels)
    layout = "grey (N, H, W)" if channels == 1 else f"RGB (N, H, W, {channels})"
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        problem = None
        if images.shape[1:] != image_shape:
            problem = (f"{split}_images has shape {images.shape}, but this subset at {size} px "
                       f"is {layout} with H = W = {size}, i.e. (N, {', '.join(map(str, image_shape))})")
        elif labels.size != len(images):
            problem = (f"{split}_labels holds {labels.size} labels for {len(images)} "
                       f"{split}_images; there must be one label per image")
        elif labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            problem = (f"{split}_labels holds values from {labels.min()} to {labels.max()}, but "
                       f"this subset has {num_classes} classes (labels 0-{num_classes - 1})")
        if problem:
            raise DataError(
                f"{path} does not fit its MedMNIST subset: {problem}. Use the official file, "
                "or fix the file you made (dataset.size must match its image size)."
            )
