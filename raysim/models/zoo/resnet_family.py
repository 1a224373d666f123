"""ResNet-d with bottleneck blocks (d = 2 + 3 * blocks): ResNet5/8/11/17 of MH-pFLID's
different-resolution task, deeper = more blocks over up to three stages (64-256 channels)."""

from __future__ import annotations

from functools import partial

from torch import Tensor, nn

from raysim.models.split import SplitModel, conv_bn_relu, register_zoo_model

DEPTHS = {5: (1,), 8: (1, 1), 11: (1, 1, 1), 17: (2, 2, 1)}
"""Depth -> bottleneck blocks per stage."""


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (optionally grouped), 1x1 expand, with a projection shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, mid: int,
                 groups: int = 1):
        super().__init__()
        self.branch = nn.Sequential(
            conv_bn_relu(in_channels, mid, 1), conv_bn_relu(mid, mid, 3, stride, groups),
            conv_bn_relu(mid, out_channels, 1, relu=False))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = conv_bn_relu(in_channels, out_channels, 1, stride, relu=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.branch(x) + self.shortcut(x))


def bottleneck_body(in_channels: int, blocks: tuple[int, ...], widths: tuple[int, ...],
                    mid_ratio: float, groups: int = 1) -> tuple[nn.Sequential, int]:
    """Stem (3x3, 32) + bottleneck stages; every stage after the first halves the grid."""
    layers: list[nn.Module] = [conv_bn_relu(in_channels, 32)]
    channels = 32
    for stage, (count, width) in enumerate(zip(blocks, widths, strict=False)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            layers.append(Bottleneck(channels, width, stride, int(width * mid_ratio), groups))
            channels = width
    return nn.Sequential(*layers), channels


def resnet(depth: int, in_channels: int, num_classes: int) -> SplitModel:
    """ResNet-``depth`` (one of 5, 8, 11, 17)."""
    body, channels = bottleneck_body(in_channels, DEPTHS[depth], (64, 128, 256), 0.25)
    return SplitModel(body, channels, num_classes)


for _depth in DEPTHS:
    register_zoo_model(f"resnet{_depth}", partial(resnet, _depth))
