"""How large the public datasets are that raysim reads from folders (segmentation sites,
recordings), by the names configs give them: what ``raysim estimate --stand-in-data`` generates
in their place when their files are not at hand. What a round costs depends on how many images
or epochs a client holds and on their shape, not on their values. (MedMNIST's sizes come from
the medmnist package's own metadata instead.)"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class SiteLayout:
    """A public segmentation set held as one site: its name and how many image-mask pairs."""

    set_name: str
    images: int


@dataclass(frozen=True)
class RecordingLayout:
    """A public set of recordings at 100 Hz: its subjects, the nights (files) of each, every
    file's epochs together and the samples of one epoch."""

    set_name: str
    subjects: int
    nights: int
    epochs: int
    length: int


_KVASIR = SiteLayout("Kvasir-SEG", 1000)
_CLINICDB = SiteLayout("CVC-ClinicDB", 612)
_COLONDB = SiteLayout("CVC-ColonDB", 380)
_ETIS = SiteLayout("ETIS-LaribPolypDB", 196)
SITE_LAYOUTS: dict[str, SiteLayout] = {
    "kvasir": _KVASIR, "kvasirseg": _KVASIR, "cvcclinicdb": _CLINICDB, "clinicdb": _CLINICDB,
    "cvccolondb": _COLONDB, "colondb": _COLONDB, "etis": _ETIS, "etislarib": _ETIS,
    "etislaribpolypdb": _ETIS}
"""The polyp centres of PraNet's benchmark (and MH-pFLID's Table 4), by a site's name with
case, spaces and punctuation ignored; image counts as their releases hold them."""

_SLEEP_EDF_20 = RecordingLayout("Sleep-EDF-20 (EEG Fpz-Cz, 30-s epochs, DeepSleepNet's format)",
                                subjects=20, nights=2, epochs=42_308, length=3_000)
RECORDING_LAYOUTS: dict[str, RecordingLayout] = {
    "sleepedf20": _SLEEP_EDF_20, "sleepedf30s": _SLEEP_EDF_20}
"""Sets of recordings by a dataset's ``name`` (case and punctuation ignored). Sleep-EDF-20's
39 recordings (subject 13 has one night) hold 42,308 scored epochs after DeepSleepNet's
preparation; the stand-in spreads them over two nights of each of the 20 subjects."""


def layout_key(name: str) -> str:
    """``name`` with case, spaces and punctuation dropped: the tables' keys."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def site_layout(name: str) -> SiteLayout | None:
    """The public set a site of this name holds, if raysim knows it."""
    return SITE_LAYOUTS.get(layout_key(name))


def recording_layout(name: str) -> RecordingLayout | None:
    """The public set of recordings a dataset of this name is, if raysim knows it."""
    return RECORDING_LAYOUTS.get(layout_key(name))


def known_names() -> str:
    """The site and dataset names the tables know, for messages."""
    sites = sorted({layout.set_name for layout in SITE_LAYOUTS.values()})
    recordings = sorted({layout.set_name for layout in RECORDING_LAYOUTS.values()})
    return (f"sites holding {', '.join(sites)} (named e.g. kvasir, cvc_clinicdb, cvc_colondb, "
            f"etis_larib) and recordings of {', '.join(recordings)} (dataset named "
            "sleep-edf-20 or sleep-edf-30s)")
