"""ResNet-18 (3D), MedMNIST v2's 3D baseline: the 2D ResNet18 with every layer in 3D."""

from __future__ import annotations

from torch import nn

from raysim.data.dataset import DataInfo
from raysim.models.params import ResNet18_3DParams
from raysim.models.registry import register_model, require_volumes
from raysim.models.resnet import ResNet18


@register_model(ResNet18_3DParams)
def build_resnet18_3d(params: ResNet18_3DParams, info: DataInfo) -> nn.Module:
    require_volumes("resnet18_3d", info)
    channels, size = info.input_shape[:2]
    small = size <= 64 if params.stem == "auto" else params.stem == "small"
    return ResNet18(channels, info.num_classes, small, params.norm, dims=3)
