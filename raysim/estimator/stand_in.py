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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.cache import cache_root
from raysim.configuration.experiment import ExperimentConfig
from raysim.configuration.schema import DatasetConfig, SegmentationSiteConfig
from raysim.data.paths import under_data_root
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
    if dataset.sites is None and dataset.path is None:
        return _stand_in_medmnist(config, data_root, scratch / "stand-in")
    missing = _missing(dataset, data_root)
    _refuse_unknown(missing)
    if not missing:
        return None
    if dataset.sites is not None:
        return config.model_copy(update={"dataset": dataset.model_copy(update={
            "sites": _stand_in_sites(dataset, data_root, missing)})})
    layout = missing[0].layout
    assert isinstance(layout, RecordingLayout)
    return config.model_copy(update={"dataset": dataset.model_copy(update={
        "path": _generated_recordings(layout, scratch / "stand-in")})})


@dataclass(frozen=True)
class Missing:
    """A site's folder or a ``dataset.path`` that is not at hand, and the public set's layout
    a stand-in would take (None: raysim knows no set of that name)."""

    what: str
    where: Path
    layout: SiteLayout | RecordingLayout | None
    site: int | None = None
    """The site's position in ``dataset.sites`` (None for a ``dataset.path``)."""


def _missing(dataset: DatasetConfig, data_root: str | None) -> list[Missing]:
    """What of the dataset's site folders or ``dataset.path`` is not at hand."""
    if dataset.sites is not None:
        return [Missing(f"site {site.name!r}", folder, site_layout(site.name), number)
                for number, site in enumerate(dataset.sites)
                for folder in [under_data_root(site.path, data_root)] if not folder.is_dir()]
    if dataset.path is not None:
        path = under_data_root(dataset.path, data_root)
        if not path.exists():
            return [Missing(f"dataset {dataset.name!r} (`dataset.path`)", path,
                            recording_layout(dataset.name))]
    return []


def _refuse_unknown(missing: list[Missing]) -> None:
    """The :class:`~raysim.errors.DataError` for the first missing item of an unknown set."""
    unknown = next((item for item in missing if item.layout is None), None)
    if unknown is not None:
        raise DataError(
            f"--stand-in-data cannot stand in for {unknown.what}: there is nothing at "
            f"{unknown.where}, and raysim knows no public set of that name, so not how large "
            f"it is. It stands in for MedMNIST files, {known_names()}. Point --data-root at "
            "the real files, or name the site or dataset after the public set it holds.")


def check_stand_ins(configs: Mapping[str, ExperimentConfig], data_root: str | None) -> None:
    """Before anything is probed: every missing site and folder of recordings is of a public
    set raysim can stand in for (else the :class:`~raysim.errors.DataError` of
    :func:`stand_in_data`); nothing is written."""
    for config in configs.values():
        _refuse_unknown(_missing(config.dataset, data_root))


def missing_data(dataset: DatasetConfig, data_root: str | None) -> str | None:
    """One paragraph naming the site folders or the ``dataset.path`` that are not at hand, and
    whether ``--stand-in-data`` can stand in for them (None when everything is there, or the
    dataset has neither sites nor a path)."""
    missing = _missing(dataset, data_root)
    if not missing:
        return None
    named = "; ".join(f"{item.what}: nothing at {item.where}" for item in missing)
    unknown = [item.what for item in missing if item.layout is None]
    remedy = ("To estimate without them, add --stand-in-data: the probes then time generated "
              "files of their public sets' sizes." if not unknown else
              f"--stand-in-data cannot stand in for {', '.join(unknown)} (raysim knows the "
              f"sizes of {known_names()}).")
    return (f"The data is not at hand: {named}. Point --data-root at the folder that holds "
            f"them (relative paths are read under it). {remedy}")


def _stand_in_sites(dataset: DatasetConfig, data_root: str | None, missing: list[Missing]
                    ) -> list[SegmentationSiteConfig]:
    """Every site with its folder as an absolute path: the real one where it is at hand, else
    a generated one of its public set's size."""
    assert dataset.sites is not None
    layouts = {item.site: item.layout for item in missing}
    sites = []
    for number, site in enumerate(dataset.sites):
        layout = layouts.get(number)
        if isinstance(layout, SiteLayout):
            folder = _generated_site(layout, dataset.resize)
            site = site.model_copy(update={"mask": "threshold", "invert": False,
                                           "unpaired": "error"})
        else:
            folder = under_data_root(site.path, data_root)
        sites.append(site.model_copy(update={"path": str(folder.resolve())}))
    return sites


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


def _generated_recordings(layout: RecordingLayout, root: Path) -> str:
    """A generated folder of ``layout``'s recordings under ``root`` (a probe's scratch; written
    once there): its epochs spread evenly over its subjects' nights, rounded up."""
    from raysim.data.generated import write_recordings

    folder = root / f"recordings-{layout_key(layout.set_name)}"
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
