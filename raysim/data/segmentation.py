"""Multi-site segmentation data: each site (hospital) a folder of images and masks, read into
one :class:`ArrayDataset` whose labels are masks ((N, H, W) uint8 class indices, class 0 the
background) and whose groups are the sites, so that ``partition.scheme: sites`` makes each site
a client (or several).

A site's folder holds ``images/`` + ``masks/`` (Kvasir-SEG, a user's own), ``Original/`` +
``Ground Truth/`` (CVC-ClinicDB) or ``train/`` and ``test/`` each with ``image/`` + ``mask/``
(the prostate slices: that split is kept). Images and masks pair by file stem. Every image is
resized to ``dataset.resize`` pixels square (bilinear) and its mask with it (nearest), so sites
of different resolutions stack. Masks are binarised at a grey threshold (optionally inverted)
or read as class indices. Where a folder has no split, a fixed draw (the same for every seed)
puts ``test_fraction`` of each site's images in the test split, in whole blocks of
``split_blocks`` consecutive images by name, so that frames of one video stay together.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.cache import cache_root
from raysim.configuration.schema import DatasetConfig, SegmentationSiteConfig
from raysim.data.dataset import ArrayDataset, DataInfo
from raysim.data.paths import under_data_root
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
LAYOUTS = (("images", "masks"), ("Original", "Ground Truth"), ("image", "mask"))
"""(image folder, mask folder) names a site's folder (or each of its split folders) may use."""


@dataclass(frozen=True)
class SiteImages:
    """One site's resized images (N, S, S, 3) uint8, masks (N, S, S) uint8 and which split
    (``train`` / ``test``) each pair belongs to."""

    images: np.ndarray
    masks: np.ndarray
    test: np.ndarray


def site_folder(site: SegmentationSiteConfig, data_root: str | None) -> Path:
    """A site's folder (relative paths under ``--data-root`` when given), which must exist."""
    path = under_data_root(site.path, data_root)
    if not path.is_dir():
        raise ConfigError(
            f"Invalid config field `dataset.sites` (site {site.name!r}): no folder at {path}. "
            "A site's folder holds images/ and masks/, Original/ and 'Ground Truth'/, or "
            "train/ and test/ each with image/ and mask/ (relative paths are read under "
            "--data-root when given).")
    return path


def _layout(folder: Path) -> tuple[Path, Path] | None:
    for images, masks in LAYOUTS:
        if (folder / images).is_dir() and (folder / masks).is_dir():
            return folder / images, folder / masks
    return None


def _natural_key(path: Path) -> tuple:
    """Sort names by their numbers as numbers (frame 2 before frame 10)."""
    return tuple(int(part) if part.isdigit() else part
                 for part in re.split(r"(\d+)", path.stem))


def _pairs(site: SegmentationSiteConfig, images: Path, masks: Path) -> list[tuple[Path, Path]]:
    image_files = {p.stem: p for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    mask_files = {p.stem: p for p in masks.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
    lonely = sorted(set(image_files) ^ set(mask_files))
    if lonely and site.unpaired == "error":
        which = lonely[0]
        kind, other = ("image", "mask") if which in image_files else ("mask", "image")
        raise ConfigError(
            f"Invalid site {site.name!r} in `dataset.sites`: {len(lonely)} file(s) without a "
            f"partner, e.g. the {kind} {(image_files.get(which) or mask_files[which])} has no "
            f"{other} of the same name in {masks if kind == 'image' else images}. Every image "
            "needs a mask of the same file name; add the missing files, or set the site's "
            "`unpaired: skip` to leave such files out.")
    stems = sorted(set(image_files) & set(mask_files), key=lambda s: _natural_key(Path(s)))
    return [(image_files[s], mask_files[s]) for s in stems]


def _read_pair(site: SegmentationSiteConfig, image_path: Path, mask_path: Path, size: int,
               num_classes: int | None) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image

    with Image.open(image_path) as image, Image.open(mask_path) as mask:
        if image.size != mask.size:
            raise ConfigError(
                f"Invalid site {site.name!r} in `dataset.sites`: the image {image_path} is "
                f"{image.size[0]}x{image.size[1]} and its mask {mask_path} "
                f"{mask.size[0]}x{mask.size[1]}; an image and its mask must have the same "
                "size. Fix or remove the pair.")
        rgb = np.asarray(image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR))
        grey = np.asarray(mask.convert("L").resize((size, size), Image.Resampling.NEAREST))
    if site.mask == "threshold":
        foreground = grey > site.threshold
        labels = (~foreground if site.invert else foreground).astype(np.uint8)
    else:
        labels = grey.astype(np.uint8)
        limit = num_classes or 256
        if labels.max() >= limit:
            raise ConfigError(
                f"Invalid site {site.name!r} in `dataset.sites`: the mask {mask_path} holds the "
                f"value {int(labels.max())}, not a class of 0..{limit - 1} "
                "(dataset.num_classes). Masks read as `indices` hold class indices; use "
                "`mask: threshold` for 0/255 masks, or set dataset.num_classes.")
    return rgb, labels


CACHE_FORMAT = 2
"""Bumped when the cached arrays of a site change meaning."""


def read_site(site: SegmentationSiteConfig, config: DatasetConfig, data_root: str | None
              ) -> SiteImages:
    """One site's images, masks and split (see the module docstring), from raysim's cache when
    the same files were read with the same settings before (decoding and resizing large JPEGs
    takes seconds a site)."""
    folder = site_folder(site, data_root)
    cached = _cache_file(site, config, folder)
    with contextlib.suppress(OSError, ValueError, KeyError), \
            np.load(cached, allow_pickle=False) as stored:
        return SiteImages(stored["images"], stored["masks"], stored["test"])
    images = _read_site(site, config, folder)
    with contextlib.suppress(OSError):
        cached.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=cached.parent, suffix=".npz.tmp")
        with os.fdopen(handle, "wb") as out:
            np.savez(out, images=images.images, masks=images.masks, test=images.test)
        os.replace(temporary, cached)
    return images


def _cache_file(site: SegmentationSiteConfig, config: DatasetConfig, folder: Path) -> Path:
    """The cache entry of a site: named by a hash of its settings and of every file's name,
    size and modification time under its folder."""
    files = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                   for p in folder.rglob("*") if p.is_file())
    key = json.dumps([CACHE_FORMAT, site.model_dump(mode="json"), config.resize,
                      config.num_classes, config.test_fraction, str(folder.resolve()), files])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_root() / "segmentation" / f"{site.name}-{digest}.npz"


def _read_site(site: SegmentationSiteConfig, config: DatasetConfig, folder: Path
               ) -> SiteImages:
    splits: list[tuple[str, tuple[Path, Path]]] = []
    layout = _layout(folder)
    if layout is not None:
        splits.append(("all", layout))
    else:
        for split in ("train", "test"):
            inner = _layout(folder / split) if (folder / split).is_dir() else None
            if inner is not None:
                splits.append((split, inner))
    if not splits:
        raise ConfigError(
            f"Invalid site {site.name!r} in `dataset.sites`: {folder} holds none of the "
            "layouts raysim reads: images/ + masks/, Original/ + 'Ground Truth'/, or train/ "
            "and test/ each with image/ + mask/. Arrange the files so, or point `path` at such "
            "a folder.")
    images, masks, test = [], [], []
    for split, (image_folder, mask_folder) in splits:
        pairs = _pairs(site, image_folder, mask_folder)
        for image_path, mask_path in pairs:
            rgb, labels = _read_pair(site, image_path, mask_path, config.resize,
                                     config.num_classes)
            images.append(rgb)
            masks.append(labels)
        test.extend([split == "test"] * len(pairs))
    if not images:
        raise ConfigError(
            f"Invalid site {site.name!r} in `dataset.sites`: {folder} holds no image with a "
            "mask. A site needs at least one pair; remove the site or add its files.")
    test_mask = np.asarray(test, dtype=bool)
    if splits[0][0] == "all":
        test_mask = _block_split(len(images), site.split_blocks, config.test_fraction,
                                 site.name)
    if test_mask.all() or not test_mask.any():
        raise ConfigError(
            f"Invalid site {site.name!r} in `dataset.sites`: its {len(images)} image(s) leave "
            f"{'no training' if test_mask.all() else 'no test'} image. A site needs both; add "
            "images or change dataset.test_fraction.")
    return SiteImages(np.stack(images), np.stack(masks), test_mask)


def _block_split(count: int, block: int, fraction: float, name: str) -> np.ndarray:
    """Which of ``count`` images (in name order) are test images: whole blocks of ``block``
    consecutive images, round(fraction x blocks) of them (at least one), a fixed draw from the
    stream (0, "segmentation-split <site name>")."""
    blocks = np.arange(count) // block
    total = int(blocks.max()) + 1
    chosen = max(1, round(fraction * total))
    order = numpy_rng(0, f"segmentation-split {name}").permutation(total)
    return np.isin(blocks, order[:chosen])


def load_sites(config: DatasetConfig, data_root: str | None) -> ArrayDataset:
    """The sites of ``dataset.sites`` as one segmentation :class:`ArrayDataset`; each sample's
    site in ``train_groups`` / ``test_groups`` (the sites' order), its run of ``split_blocks``
    consecutive images in ``train_blocks`` / ``test_blocks``."""
    assert config.sites is not None
    names = [site.name for site in config.sites]
    if len(set(names)) != len(names):
        raise ConfigError(f"Invalid config field `dataset.sites`: the site names {names} repeat; "
                          "give every site its own name.")
    sites = [read_site(site, config, data_root) for site in config.sites]
    masks = np.concatenate([s.masks for s in sites])
    num_classes = config.num_classes or max(2, int(masks.max()) + 1)

    # each site's runs of split_blocks consecutive images, numbered across the sites
    blocks, offset = [], 0
    for site, images in zip(config.sites, sites, strict=True):
        blocks.append(offset + np.arange(len(images.test), dtype=np.int64) // site.split_blocks)
        offset = int(blocks[-1].max()) + 1

    def stack(test: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return (np.concatenate([s.images[s.test == test] for s in sites]),
                np.concatenate([s.masks[s.test == test] for s in sites]),
                np.concatenate([np.full(int((s.test == test).sum()), k, np.int64)
                                for k, s in enumerate(sites)]),
                np.concatenate([b[s.test == test] for b, s in zip(blocks, sites, strict=True)]))

    train_x, train_y, train_groups, train_blocks = stack(False)
    test_x, test_y, test_groups, test_blocks = stack(True)
    info = DataInfo(name=config.name, kind="image", num_classes=num_classes,
                    input_shape=(3, config.resize, config.resize), mean=(0.5,) * 3,
                    std=(0.5,) * 3, task="segmentation",
                    label_names=("background", "foreground") if num_classes == 2 else ())
    return ArrayDataset(info, train_x, train_y, test_x, test_y, train_groups=train_groups,
                        test_groups=test_groups, train_blocks=train_blocks,
                        test_blocks=test_blocks)
