"""ResNeXt (Xie et al. 2017): bottleneck blocks with a grouped 3x3 convolution (cardinality 8)."""

from __future__ import annotations

from raysim.models.split import SplitModel, register_zoo_model
from raysim.models.zoo.resnet_family import bottleneck_body


def resnext(in_channels: int, num_classes: int) -> SplitModel:
    """Three stages of two blocks, 64-256 channels, cardinality 8, bottleneck width 1/2."""
    body, channels = bottleneck_body(in_channels, (2, 2, 2), (64, 128, 256), 0.5, groups=8)
    return SplitModel(body, channels, num_classes)


register_zoo_model("resnext", resnext)
