"""A small class-conditional GAN for images (FedGAN's generator and discriminator).

- :class:`ConditionalGenerator`: noise z and a one-hot label -> a linear layer to a 4x4 map of
  ``4 * width`` channels, transposed convolutions doubling the side (ReLU) until it covers the
  image, a 3x3 convolution to the image's channels and tanh, resized to the image's size.
  Its output is in [-1, 1] pixel scale ((x / 255) * 2 - 1); :meth:`ConditionalGenerator.
  normalised` maps it to the model's normalised input space.
- :class:`ProjectionDiscriminator`: strided 4x4 convolutions (LeakyReLU 0.2) to features, a
  linear real/fake logit plus the projection of the features on a label embedding (Miyato and
  Koyama 2018).

No normalisation layers, so a generator behaves the same in train and eval mode and an
average of clients' generators is an average of functions of one form.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _doublings(side: int) -> int:
    """Transposed convolutions that take a 4x4 map to at least ``side`` pixels."""
    return max(1, math.ceil(math.log2(max(side, 8) / 4)))


class ConditionalGenerator(nn.Module):
    """G(z, y) -> an image of ``shape`` (C, H, W) in [-1, 1] pixel scale."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, noise_dim: int = 100,
                 width: int = 32):
        super().__init__()
        self.shape, self.num_classes, self.noise_dim = tuple(shape), num_classes, noise_dim
        channels = 4 * width
        self.project = nn.Linear(noise_dim + num_classes, channels * 16)
        layers: list[nn.Module] = []
        for _ in range(_doublings(max(shape[1:]))):
            out = max(width, channels // 2)
            layers += [nn.ConvTranspose2d(channels, out, 4, stride=2, padding=1), nn.ReLU()]
            channels = out
        layers += [nn.Conv2d(channels, shape[0], 3, padding=1), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.channels = 4 * width

    def noise(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` N(0, 1) noise vectors from ``generator`` (CPU), on the module's device."""
        return torch.randn((count, self.noise_dim), generator=generator).to(
            self.project.weight.device)

    def forward(self, noise: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(labels.long().reshape(-1), self.num_classes).to(noise.dtype)
        hidden = F.relu(self.project(torch.cat([noise, one_hot], dim=1)))
        images = self.body(hidden.view(len(noise), self.channels, 4, 4))
        if images.shape[-2:] != self.shape[1:]:
            images = F.interpolate(images, size=self.shape[1:], mode="bilinear",
                                   align_corners=False)
        return images

    def normalised(self, images: torch.Tensor, mean: tuple[float, ...],
                   std: tuple[float, ...]) -> torch.Tensor:
        """Images in [-1, 1] pixel scale as the model reads inputs: ((x + 1) / 2 - mean) / std
        per channel."""
        shift = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
        scale = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
        return ((images + 1) / 2 - shift) / scale


def pixel_scale(images: torch.Tensor, mean: tuple[float, ...],
                std: tuple[float, ...]) -> torch.Tensor:
    """Normalised model inputs back in [-1, 1] pixel scale (the inverse of
    :meth:`ConditionalGenerator.normalised`)."""
    shift = torch.tensor(mean, device=images.device).view(1, -1, 1, 1)
    scale = torch.tensor(std, device=images.device).view(1, -1, 1, 1)
    return (images * scale + shift) * 2 - 1


class ProjectionDiscriminator(nn.Module):
    """D(x, y) -> a real/fake logit per image (x in [-1, 1] pixel scale)."""

    def __init__(self, shape: tuple[int, ...], num_classes: int, width: int = 32):
        super().__init__()
        layers: list[nn.Module] = []
        channels, side = shape[0], max(shape[1:])
        out = width
        while side > 4:
            layers += [nn.Conv2d(channels, out, 4, stride=2, padding=1), nn.LeakyReLU(0.2)]
            channels, side, out = out, (side + 1) // 2, min(out * 2, 4 * width)
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.logit = nn.Linear(channels, 1)
        self.embedding = nn.Embedding(num_classes, channels)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        features = self.body(images)
        projection = (self.embedding(labels.long().reshape(-1)) * features).sum(1)
        return self.logit(features).squeeze(1) + projection  # type: ignore[no-any-return]
