"""ShuffleNetV2 (Ma et al. 2018): channel split, depthwise convolution and channel shuffle."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from raysim.models.split import SplitModel, conv_bn_relu, register_zoo_model


def channel_shuffle(x: Tensor, groups: int) -> Tensor:
    """Interleave the channels of ``groups`` groups."""
    batch, channels, height, width = x.shape
    return (x.view(batch, groups, channels // groups, height, width).transpose(1, 2)
            .reshape(batch, channels, height, width))


class ShuffleUnit(nn.Module):
    """Stride 1: split channels, transform one half. Stride 2: both branches downsample."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.stride = stride
        half = out_channels // 2
        branch_in = in_channels if stride == 2 else in_channels // 2
        self.branch = nn.Sequential(
            conv_bn_relu(branch_in, half, 1),
            conv_bn_relu(half, half, 3, stride, groups=half, relu=False),
            conv_bn_relu(half, half, 1))
        self.shortcut: nn.Module | None = None
        if stride == 2:
            self.shortcut = nn.Sequential(
                conv_bn_relu(in_channels, in_channels, 3, 2, groups=in_channels, relu=False),
                conv_bn_relu(in_channels, half, 1))

    def forward(self, x: Tensor) -> Tensor:
        if self.shortcut is None:
            keep, transform = x.chunk(2, dim=1)
            out = torch.cat([keep, self.branch(transform)], dim=1)
        else:
            out = torch.cat([self.shortcut(x), self.branch(x)], dim=1)
        return channel_shuffle(out, 2)


def shufflenetv2(in_channels: int, num_classes: int) -> SplitModel:
    """Stem (3x3, 24) + stages of 48/96/192 channels (2 units each) + 1x1 conv to 256."""
    layers: list[nn.Module] = [conv_bn_relu(in_channels, 24)]
    channels = 24
    for width in (48, 96, 192):
        layers += [ShuffleUnit(channels, width, 2), ShuffleUnit(width, width, 1)]
        channels = width
    layers.append(conv_bn_relu(channels, 256, 1))
    return SplitModel(nn.Sequential(*layers), 256, num_classes)


register_zoo_model("shufflenetv2", shufflenetv2)
