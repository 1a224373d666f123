"""MobileNetV2 (Sandler et al. 2018): inverted residuals with linear bottlenecks."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.models.split import SplitModel, conv_bn_relu, register_zoo_model

SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 2, 2), (6, 96, 1, 1))
"""(expansion t, channels c, repeats n, first stride s) per stage, as in the paper's table."""


class InvertedResidual(nn.Module):
    """1x1 expand, 3x3 depthwise, 1x1 linear projection; identity shortcut when shapes allow."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = [] if expansion == 1 else [conv_bn_relu(in_channels, hidden, 1)]
        layers += [conv_bn_relu(hidden, hidden, 3, stride, groups=hidden),
                   conv_bn_relu(hidden, out_channels, 1, relu=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x) if self.residual else self.block(x)


def mobilenetv2(in_channels: int, num_classes: int) -> SplitModel:
    """Stem (3x3, 16) + the inverted-residual stages of SETTINGS + 1x1 conv to 256."""
    layers: list[nn.Module] = [conv_bn_relu(in_channels, 16)]
    channels = 16
    for expansion, width, repeats, stride in SETTINGS:
        for index in range(repeats):
            layers.append(InvertedResidual(channels, width, stride if index == 0 else 1, expansion))
            channels = width
    layers.append(conv_bn_relu(channels, 256, 1))
    return SplitModel(nn.Sequential(*layers), 256, num_classes)


register_zoo_model("mobilenetv2", mobilenetv2)
