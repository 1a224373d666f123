"""The ConvNet for 3D volumes (MedMNIST 3D): the condensation literature's ConvNet with 3x3x3
convolutions and 2x2x2 pooling."""

from __future__ import annotations

from torch import nn

from raysim.data.dataset import DataInfo
from raysim.models.convnet import ConvNet, check_depth
from raysim.models.params import ConvNet3DParams, ConvNetParams
from raysim.models.registry import register_model, require_volumes


@register_model(ConvNet3DParams)
def build_convnet3d(params: ConvNet3DParams, info: DataInfo) -> nn.Module:
    require_volumes("convnet3d", info)
    channels, size = info.input_shape[:2]
    check_depth(params.depth, size)
    planar = ConvNetParams(width=params.width, depth=params.depth, norm=params.norm,
                           pooling=params.pooling)
    return ConvNet(channels, size, info.num_classes, planar, dims=3)
