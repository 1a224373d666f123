"""SqueezeNet (Iandola et al. 2016): fire modules (1x1 squeeze, 1x1 + 3x3 expand)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from raysim.models.split import SplitModel, register_zoo_model


class Fire(nn.Module):
    """Squeeze to ``squeeze`` channels, expand to ``2 * expand`` (1x1 and 3x3 halves)."""

    def __init__(self, in_channels: int, squeeze: int, expand: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(in_channels, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU(inplace=True))
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x: Tensor) -> Tensor:
        squeezed = self.squeeze(x)
        return torch.cat([self.expand1(squeezed), self.expand3(squeezed)], dim=1)


def squeezenet(in_channels: int, num_classes: int) -> SplitModel:
    """Conv 3x3-64, then fire modules with two max-pools, 256 output channels."""
    body = nn.Sequential(
        nn.Conv2d(in_channels, 64, 3, padding=1), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64), Fire(128, 16, 64),
        nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128), Fire(256, 32, 128))
    return SplitModel(body, 256, num_classes)


register_zoo_model("squeezenet", squeezenet)
