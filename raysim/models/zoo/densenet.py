"""DenseNet-BC (Huang et al. 2017): dense blocks of bottleneck layers and compressing
transitions."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from raysim.models.split import SplitModel, register_zoo_model


class DenseLayer(nn.Module):
    """BN-ReLU-1x1 (4 x growth) then BN-ReLU-3x3 (growth); output concatenated to the input."""

    def __init__(self, in_channels: int, growth: int):
        super().__init__()
        self.layer = nn.Sequential(
            nn.BatchNorm2d(in_channels), nn.ReLU(inplace=True),
            nn.Conv2d(in_channels, 4 * growth, 1, bias=False),
            nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
            nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([x, self.layer(x)], dim=1)


def densenet(in_channels: int, num_classes: int, growth: int = 12,
             layers_per_block: int = 6) -> SplitModel:
    """Three dense blocks (growth 12, 6 layers each) with 0.5-compression transitions."""
    channels = 2 * growth
    modules: list[nn.Module] = [nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)]
    for block in range(3):
        for _ in range(layers_per_block):
            modules.append(DenseLayer(channels, growth))
            channels += growth
        if block < 2:
            reduced = channels // 2
            modules += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True),
                        nn.Conv2d(channels, reduced, 1, bias=False), nn.AvgPool2d(2)]
            channels = reduced
    modules += [nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
    return SplitModel(nn.Sequential(*modules), channels, num_classes)


register_zoo_model("densenet", densenet)
