"""VGG (Simonyan & Zisserman 2014): plain 3x3 convolution stacks with max-pooling (VGG-11
layout, narrowed for small inputs)."""

from __future__ import annotations

from torch import nn

from raysim.models.split import SplitModel, conv_bn_relu, register_zoo_model

LAYOUT = (32, "M", 64, "M", 128, 128, "M", 256, 256, 256, 256)
"""Eight convolutions (VGG-11's conv count) and three max-pools."""


def vgg(in_channels: int, num_classes: int) -> SplitModel:
    """VGG-11 with BatchNorm, 32-256 channels."""
    layers: list[nn.Module] = []
    channels = in_channels
    for item in LAYOUT:
        if item == "M":
            layers.append(nn.MaxPool2d(2, ceil_mode=True))
        else:
            layers.append(conv_bn_relu(channels, int(item)))
            channels = int(item)
    return SplitModel(nn.Sequential(*layers), channels, num_classes)


register_zoo_model("vgg", vgg)
