"""A folder of recordings as a signal dataset: one ``.npz`` file per recording in DeepSleepNet's
``prepare_physionet`` format (as AttnSleep and most sleep-staging code read it), at any epoch
length.

Each file holds ``x``, the epochs of one recording, (epochs, length) or (epochs, length,
channels) float, and ``y``, one class index per epoch; ``fs`` (sampling rate) and ``ch_label``
(channel names) are read when present. Files are opened with numpy's default
``allow_pickle=False`` and only those four keys are read: Sleep-EDF's files also carry
pickled EDF headers, which are never unpickled.

Whole subjects form the splits: a subject's recordings (e.g. both Sleep-EDF nights) go to the
test split, the public set or the training split, never to two of them. Which subjects go where
is a fixed draw (the same for every seed: the dataset is loaded once per experiment).
Inputs are stored (N, channels, length) float32, standardised per channel with the mean and
standard deviation of the training split only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.configuration.schema import DatasetConfig
from raysim.data.dataset import ArrayDataset, DataInfo
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng

SLEEP_STAGES = ("W", "N1", "N2", "N3", "REM")
"""Sleep-EDF's five classes as DeepSleepNet numbers them (0-4), named when a dataset has five."""


@dataclass(frozen=True)
class Recording:
    """One file's epochs: inputs (epochs, channels, length) float32 and class indices."""

    file: str
    subject: str
    x: np.ndarray
    y: np.ndarray
    sampling_rate: float | None
    channels: tuple[str, ...]


def is_recording_folder(folder: Path) -> bool:
    """True for a folder holding ``.npz`` files and no image-folder splits."""
    return any(folder.glob("*.npz")) and not (folder / "train").is_dir()


def subject_of(file_name: str, pattern: str) -> str:
    """The subject a file belongs to: the first group of ``pattern`` matched at the start of
    its name, or the name without its suffix when the pattern does not match."""
    match = re.match(pattern, file_name)
    if match is None or not match.groups():
        return Path(file_name).stem
    return str(match.group(1))


def read_recording(path: Path, pattern: str) -> Recording:
    """One recording's arrays, checked (one paragraph for a file raysim cannot use)."""
    where = f"Invalid recording {str(path)!r} in `dataset.path`"
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{where}: it is not a readable .npz file ({error}). A recording "
                          "file is an .npz holding `x` (epochs, length[, channels]) and `y` "
                          "(one class index per epoch); remove or replace it.") from None
    with archive:
        missing = [key for key in ("x", "y") if key not in archive.files]
        if missing:
            raise ConfigError(
                f"{where}: it has no {' and no '.join(f'`{key}`' for key in missing)} (it holds "
                f"{', '.join(archive.files) or 'nothing'}). A recording file holds `x`, the "
                "epochs (epochs, length) or (epochs, length, channels), and `y`, one class index "
                "per epoch, as DeepSleepNet's prepare_physionet writes them.")
        x, y = archive["x"], archive["y"]
        rate = float(archive["fs"]) if "fs" in archive.files else None
        names = (tuple(str(n) for n in np.atleast_1d(archive["ch_label"]))
                 if "ch_label" in archive.files else ())
    if x.ndim == 2:
        x = x[:, :, None]
    if x.ndim != 3 or not np.issubdtype(x.dtype, np.number) or len(x) == 0:
        raise ConfigError(
            f"{where}: `x` has shape {x.shape} ({x.dtype}); it must be a non-empty numeric array "
            "(epochs, length) or (epochs, length, channels).")
    y = np.asarray(y).reshape(-1)
    if len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(
            f"{where}: `y` holds {len(y)} {y.dtype} values for {len(x)} epochs; it must hold one "
            "integer class index per epoch of `x`.")
    if not np.isfinite(x).all():
        raise ConfigError(f"{where}: `x` holds NaN or infinite values; clean the recording "
                          "or leave the file out.")
    return Recording(path.name, subject_of(path.name, pattern),
                     np.ascontiguousarray(x.transpose(0, 2, 1), dtype=np.float32),
                     y.astype(np.int64), rate, names)


def load_recordings(folder: Path, config: DatasetConfig) -> ArrayDataset:
    """The recordings of ``folder`` as an :class:`ArrayDataset` of kind ``signal`` with each
    sample's subject in ``train_groups`` / ``test_groups`` (see the module docstring)."""
    files = sorted(folder.glob("*.npz"))
    recordings = [read_recording(path, config.subject_pattern) for path in files]
    _check_alike(folder, recordings)
    subjects = sorted({r.subject for r in recordings})
    test, public = _subject_split(folder, subjects, config)
    labels = np.concatenate([r.y for r in recordings])
    num_classes = config.num_classes or int(labels.max()) + 1
    for recording in recordings:
        outside = recording.y[(recording.y < 0) | (recording.y >= num_classes)]
        if len(outside):
            raise ConfigError(
                f"Invalid recording {str(folder / recording.file)!r} in `dataset.path`: `y` holds "
                f"the label {int(outside[0])}, outside the {num_classes} classes 0..{num_classes - 1}"
                f"{' (dataset.num_classes)' if config.num_classes else ''}. Renumber the labels, "
                "drop those epochs, or set dataset.num_classes to the number of classes.")
    ids = {subject: number for number, subject in enumerate(subjects)}

    def split(members: set[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        chosen = [r for r in recordings if r.subject in members]
        if not chosen:
            first = recordings[0]
            return (np.zeros((0, *first.x.shape[1:]), np.float32), np.zeros(0, np.int64),
                    np.zeros(0, np.int64))
        return (np.concatenate([r.x for r in chosen]), np.concatenate([r.y for r in chosen]),
                np.concatenate([np.full(len(r.y), ids[r.subject], np.int64) for r in chosen]))

    train_x, train_y, train_groups = split(set(subjects) - test - public)
    test_x, test_y, test_groups = split(test)
    public_x, public_y, _ = split(public)
    mean = train_x.mean(axis=(0, 2), keepdims=True, dtype=np.float64)
    std = train_x.std(axis=(0, 2), keepdims=True, dtype=np.float64)
    std[std == 0] = 1.0

    def standardise(x: np.ndarray) -> np.ndarray:
        return ((x - mean) / std).astype(np.float32)

    first = recordings[0]
    info = DataInfo(
        name=config.name, kind="signal", num_classes=num_classes,
        input_shape=tuple(first.x.shape[1:]), task="binary-class" if num_classes == 2
        else "multi-class", label_names=SLEEP_STAGES if num_classes == 5 else (),
        sampling_rate=first.sampling_rate)
    return ArrayDataset(info, standardise(train_x), train_y, standardise(test_x), test_y,
                        public_x=standardise(public_x) if public else None,
                        public_y=public_y if public else None,
                        train_groups=train_groups, test_groups=test_groups)


def _check_alike(folder: Path, recordings: list[Recording]) -> None:
    """Every recording has the same epoch shape, sampling rate and (where both name them)
    channels."""
    first = recordings[0]
    for other in recordings[1:]:
        if (other.x.shape[1:], other.sampling_rate) != (first.x.shape[1:], first.sampling_rate) \
                or (other.channels and first.channels and other.channels != first.channels):
            raise ConfigError(
                f"Invalid config field `dataset.path` = {str(folder)!r}: the recordings differ: "
                f"{first.file} has epochs of {first.x.shape[2]} samples x {first.x.shape[1]} "
                f"channel(s) {list(first.channels)} at {first.sampling_rate} Hz, {other.file} of "
                f"{other.x.shape[2]} x {other.x.shape[1]} {list(other.channels)} at "
                f"{other.sampling_rate} Hz. A dataset's recordings share one epoch length, "
                "channel count, channel names and sampling rate; keep them in separate folders "
                "or resample them first.")


def _subject_split(folder: Path, subjects: list[str], config: DatasetConfig
                   ) -> tuple[set[str], set[str]]:
    """The test and the public subjects: a fixed draw from the stream (0, "subject-split")."""
    test_count = config.test_subjects or max(1, round(len(subjects) / 5))
    public_count = config.public_subjects
    if test_count + public_count >= len(subjects):
        raise ConfigError(
            f"Invalid config fields `dataset.test_subjects` = {test_count} and "
            f"`dataset.public_subjects` = {public_count}: the recordings in {str(folder)!r} come "
            f"from {len(subjects)} subject(s) (read by `dataset.subject_pattern` = "
            f"{config.subject_pattern!r}), and at least one must be left to train on. Lower "
            "them, or add recordings.")
    order = [subjects[i] for i in numpy_rng(0, "subject-split").permutation(len(subjects))]
    return set(order[:test_count]), set(order[test_count:test_count + public_count])
