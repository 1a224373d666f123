"""Generated data in place of a config's missing files, for ``raysim estimate --stand-in-data``:
what a round costs depends on how many samples each client holds and on their shape, not on
their values, so a probe can time a config on files of the real set's layout.

- a MedMNIST file: the official split sizes, channels, classes and size
  (:func:`raysim.data.generated.write_stand_in`);
- a segmentation site whose folder is missing: as many generated image-mask pairs as the
  public set it names holds (:data:`raysim.data.public_layouts.SITE_LAYOUTS`), written at the
  config's ``resize`` (the loader resizes every image to it; real images are larger, so only
  their decoding, done once and cached, is cheaper here), once, into raysim's cache
  (``RAYSIM_CACHE``, else ``~/.cache/raysim``: ``stand-in/``), where later estimates find it
  and its decoded arrays;
- a folder of recordings that is missing: the subjects, nights, epochs and epoch length of the
  public set the dataset's name names (:data:`raysim.data.public_layouts.RECORDING_LAYOUTS`).

Files that are at hand are used as they are. A missing site or folder of a set raysim does not
know is refused before anything is probed, with the names it does know.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from raysim.cache import cache_root
from raysim.configuration.experiment import ExperimentConfig
from raysim.configuration.schema import DatasetConfig, SegmentationSiteConfig
from raysim.data.public_layouts import (
    RecordingLayout,
    SiteLayout,
    known_names,
    layout_key,
    recording_layout,
    site_layout,
)
from raysim.errors import DataError


def users_dataset(dataset: DatasetConfig) -> bool:
    """A dataset of the user's: a ``path`` (file or folder) or a name a plug-in registered."""
    from raysim.data.registry import DATASETS

    return dataset.path is not None or dataset.name.lower() in DATASETS


def stand_in_data(config: ExperimentConfig, data_root: str | None, scratch: Path
                  ) -> ExperimentConfig | None:
    """``config`` reading generated files of its dataset's layout where its real files are not
    under its data root (None when they all are, or the dataset is built in or the user's
    own): MedMNIST files and recordings written under ``scratch``, sites into raysim's cache.
    Raises :class:`~raysim.errors.DataError` for a missing site or folder of recordings whose
    public set raysim does not know."""
    dataset = config.dataset
    if dataset.sites is not None:
        sites = _stand_in_sites(dataset, data_root)
        return None if sites is None else config.model_copy(update={
            "dataset": dataset.model_copy(update={"sites": sites})})
    if dataset.path is not None:
        path = _stand_in_recordings(dataset, data_root, scratch / "stand-in")
        return None if path is None else config.model_copy(update={
            "dataset": dataset.model_copy(update={"path": path})})
    return _stand_in_medmnist(config, data_root, scratch / "stand-in")


def _under(path: str, data_root: str | None) -> Path:
    """A config's path as the loaders read it: relative paths under ``data_root`` when given."""
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() or data_root is None else Path(data_root) / resolved


def _unknown(what: str, where: Path) -> DataError:
    return DataError(
        f"--stand-in-data cannot stand in for {what}: there is nothing at {where}, and raysim "
        f"knows no public set of that name, so not how large it is. It stands in for MedMNIST "
        f"files, {known_names()}. Point --data-root at the real files, or name the site or "
        "dataset after the public set it holds.")


def check_stand_ins(configs: Mapping[str, ExperimentConfig], data_root: str | None) -> None:
    """Before anything is probed: every missing site and folder of recordings is of a public
    set raysim can stand in for (else the :class:`~raysim.errors.DataError` of
    :func:`stand_in_data`); nothing is written."""
    for config in configs.values():
        dataset = config.dataset
        if dataset.sites is not None:
            _site_layouts(dataset, data_root)
        elif dataset.path is not None:
            _recordings_layout(dataset, data_root)


def missing_data(dataset: DatasetConfig, data_root: str | None) -> str | None:
    """One paragraph naming the site folders or the ``dataset.path`` that are not at hand, and
    whether ``--stand-in-data`` can stand in for them (None when everything is there, or the
    dataset has neither sites nor a path)."""
    missing: list[tuple[str, Path, bool]] = []  # (what, where, whether a stand-in is known)
    if dataset.sites is not None:
        missing = [(f"site {site.name!r}", folder, site_layout(site.name) is not None)
                   for site in dataset.sites
                   for folder in [_under(site.path, data_root)] if not folder.is_dir()]
    elif dataset.path is not None:
        path = _under(dataset.path, data_root)
        if not path.exists():
            missing = [(f"`dataset.path` of {dataset.name!r}", path,
                        recording_layout(dataset.name) is not None)]
    if not missing:
        return None
    named = "; ".join(f"{what}: nothing at {path}" for what, path, _ in missing)
    unknown = [what for what, _, known in missing if not known]
    remedy = ("To estimate without them, add --stand-in-data: the probes then time generated "
              "files of their public sets' sizes." if not unknown else
              f"--stand-in-data cannot stand in for {', '.join(unknown)} (raysim knows the "
              f"sizes of {known_names()}).")
    return (f"The data is not at hand: {named}. Point --data-root at the folder that holds "
            f"them (relative paths are read under it). {remedy}")


def _site_layouts(dataset: DatasetConfig, data_root: str | None
                  ) -> list[tuple[Path, SiteLayout | None]]:
    """Each site's folder as the loader reads it, and its public set's layout where that
    folder is missing (None where it is at hand)."""
    assert dataset.sites is not None
    found: list[tuple[Path, SiteLayout | None]] = []
    for site in dataset.sites:
        folder = _under(site.path, data_root)
        layout = None if folder.is_dir() else site_layout(site.name)
        if layout is None and not folder.is_dir():
            raise _unknown(f"site {site.name!r}", folder)
        found.append((folder, layout))
    return found


def _stand_in_sites(dataset: DatasetConfig, data_root: str | None
                    ) -> list[SegmentationSiteConfig] | None:
    """Every site with its folder as an absolute path: the real one where it is at hand, else
    a generated one of its public set's size (None when every folder is at hand)."""
    assert dataset.sites is not None
    sites, stood_in = [], False
    for site, (folder, layout) in zip(dataset.sites, _site_layouts(dataset, data_root),
                                      strict=True):
        if layout is not None:
            folder = _generated_site(layout, dataset.resize)
            site = site.model_copy(update={"mask": "threshold", "invert": False,
                                           "unpaired": "error"})
            stood_in = True
        sites.append(site.model_copy(update={"path": str(folder.resolve())}))
    return sites if stood_in else None


def _generated_site(layout: SiteLayout, size: int) -> Path:
    """The generated folder of ``layout``'s images at ``size`` px, written once into raysim's
    cache (the site reader caches its decoded arrays by folder, so a stand-in kept in place
    is decoded once too); written beside it and renamed, so that estimates side by side
    never read half a folder."""
    from raysim.data.generated import write_site

    folder = cache_root() / "stand-in" / f"{layout_key(layout.set_name)}-{layout.images}-{size}px"
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
            write_site(Path(scratch) / "site", images=layout.images, size=size, brightness=90,
                       rng=np.random.default_rng(layout.images), suffix=".jpg")
            with contextlib.suppress(OSError):  # (another estimate wrote it first)
                os.rename(Path(scratch) / "site", folder)
    return folder


def _recordings_layout(dataset: DatasetConfig, data_root: str | None
                       ) -> tuple[Path, RecordingLayout | None]:
    """Where ``dataset.path`` is read, and its public set's layout where nothing is there
    (None where a file or folder of the user's is)."""
    assert dataset.path is not None
    path = _under(dataset.path, data_root)
    if path.exists():
        return path, None
    layout = recording_layout(dataset.name)
    if layout is None:
        raise _unknown(f"dataset {dataset.name!r} (`dataset.path`)", path)
    return path, layout


def _stand_in_recordings(dataset: DatasetConfig, data_root: str | None, root: Path
                         ) -> str | None:
    """A generated folder of recordings of the dataset's public set where ``path`` is
    missing (None where it exists)."""
    from raysim.data.generated import write_recordings

    _, layout = _recordings_layout(dataset, data_root)
    if layout is None:
        return None
    folder = root / f"recordings-{layout_key(dataset.name)}"
    if not folder.is_dir():
        files = layout.subjects * layout.nights
        write_recordings(folder, subjects=layout.subjects, nights=layout.nights,
                         epochs=-(-layout.epochs // files), length=layout.length,
                         header=False)
    return str(folder.resolve())


def _stand_in_medmnist(config: ExperimentConfig, data_root: str | None, root: Path
                       ) -> ExperimentConfig | None:
    from raysim.data.builtin import BUILTIN_DATASETS
    from raysim.data.generated import write_stand_in
    from raysim.data.medmnist_io import default_root, file_name

    dataset = config.dataset
    if dataset.name in BUILTIN_DATASETS or users_dataset(dataset) or dataset.medsegbench:
        return None
    name = file_name(dataset.name, dataset.size)
    if (Path(data_root or dataset.root or default_root()).expanduser() / name).exists():
        return None
    if not (root / name).exists():
        write_stand_in(root, dataset.name, dataset.size)
    return config.model_copy(update={"dataset": dataset.model_copy(update={
        "root": str(root), "download": False, "verify_checksum": False})})
