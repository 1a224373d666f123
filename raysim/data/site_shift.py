"""Site shift: a fixed, seeded appearance transform per client (feature skew).

Each client stands for a hospital with its own scanner: its training images and its test share
get the same transform, drawn once from the stream (seed, "site-shift", client): contrast,
brightness, gamma, Gaussian blur, additive noise and, for RGB images, per-channel colour gains.
Volumes (MedMNIST 3D) get the same effects in 3D (an isotropic 3D blur). Combined with any
partition scheme (e.g. Dirichlet label skew).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from raysim.configuration.schema import SiteShiftConfig
from raysim.data.dataset import ArrayDataset
from raysim.data.partition import Partition
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng


@dataclass(frozen=True)
class SiteAppearance:
    """One site's transform parameters."""

    contrast: float
    brightness: float
    gamma: float
    blur_sigma: float
    noise_std: float
    channel_gains: tuple[float, ...]

    def apply(self, images: np.ndarray, rng: np.random.Generator, volumetric: bool = False
              ) -> np.ndarray:
        """Transform uint8 images (N, H, W) or (N, H, W, C), or volumes (N, D, H, W) with
        ``volumetric``; returns uint8."""
        rgb = images.ndim == 4 and not volumetric
        x = images.astype(np.float32) / 255.0
        mean = x.mean(axis=tuple(range(1, x.ndim)), keepdims=True)
        x = np.clip((x - mean) * self.contrast + mean + self.brightness, 0.0, 1.0)
        x = x ** self.gamma
        if self.blur_sigma > 0:
            from scipy.ndimage import gaussian_filter  # (0.3 s of import: only for a blur)

            spatial = (self.blur_sigma,) * (3 if volumetric else 2)
            sigma = (0, *spatial) + ((0,) if rgb else ())
            x = gaussian_filter(x, sigma=sigma, mode="nearest")
        if self.noise_std > 0:
            x = x + rng.normal(0.0, self.noise_std, size=x.shape).astype(np.float32)
        if rgb:
            x = x * np.asarray(self.channel_gains, dtype=np.float32)
        return np.round(np.clip(x, 0.0, 1.0) * 255.0).astype(np.uint8)


def site_appearance(config: SiteShiftConfig, seed: int, client: int, channels: int,
                    image_size: int) -> SiteAppearance:
    """The transform of one site, drawn from the stream (seed, "site-shift", client)."""
    rng = numpy_rng(seed, "site-shift", client=client)
    s = config.strength
    contrast = 1.0 + s * config.contrast * rng.uniform(-1, 1)
    brightness = s * config.brightness * rng.uniform(-1, 1)
    log_gamma = s * np.log1p(config.gamma) * rng.uniform(-1, 1)
    blur = s * config.blur * (image_size / 28.0) * rng.uniform(0, 1)
    noise = s * config.noise * rng.uniform(0, 1)
    gains = tuple(1.0 + s * config.color * rng.uniform(-1, 1, size=channels)) if channels == 3 else ()
    return SiteAppearance(float(contrast), float(brightness), float(np.exp(log_gamma)),
                          float(blur), float(noise), tuple(float(g) for g in gains))


def apply_site_shift(dataset: ArrayDataset, partition: Partition, config: SiteShiftConfig,
                     seed: int) -> ArrayDataset:
    """A copy of the dataset in which every client's training samples, validation share (the
    official split's rows appended to the training arrays) and test share carry that client's
    site appearance (test samples in no share keep their original look)."""
    if dataset.info.kind != "image":
        raise ConfigError(
            f"Invalid config field `partition.site_shift`: dataset {dataset.info.name!r} is "
            "tabular, and site shift transforms images. Remove partition.site_shift or use an "
            "image dataset (a MedMNIST subset or digits)."
        )
    channels, height = dataset.info.input_shape[0], dataset.info.input_shape[1]
    train_x, test_x = dataset.train_x.copy(), dataset.test_x.copy()
    for client in range(partition.num_clients):
        site = site_appearance(config, seed, client, channels, height)
        shares = [(train_x, partition.train[client], "train"),
                  (test_x, partition.test[client], "test")]
        if partition.validation is not None:
            shares.append((train_x, partition.validation[client], "validation"))
        for array, indices, split in shares:
            if len(indices):
                noise_rng = numpy_rng(seed, f"site-noise-{split}", client=client)
                array[indices] = site.apply(array[indices], noise_rng, dataset.info.volumetric)
    return replace(dataset, train_x=train_x, test_x=test_x)
