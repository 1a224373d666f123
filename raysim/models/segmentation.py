"""Segmentation networks mapping images (B, C, H, W) to per-pixel class logits
(B, classes, H, W), each a :class:`~raysim.models.split.SplitModel`: a body that ends in a
full-resolution feature map (ReLU) and a 1x1-convolution head, so that model-heterogeneous
methods (MH-pFLID) and layer-split methods see an encoder-decoder body and a head.

The U-Net (with residual units, the Res-UNet) and UNet++ are MONAI's
(``monai.networks.nets.UNet``, ``BasicUNetPlusPlus``), their last layer giving the head's input
channels; MONAI has no FCN, so :class:`FCN` (FCN-8s, Long et al. 2015) is written here.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.models.params import FCNParams, LCFedUNetParams, UNetParams, UNetPlusPlusParams
from raysim.models.registry import register_model, require_segmentation
from raysim.models.split import SplitModel


def segmentation_split(body: nn.Module, features: int, classes: int) -> SplitModel:
    """``body`` (ending in ``features`` channels at the input's resolution) + ReLU, and a 1x1
    convolution to ``classes`` logits per pixel."""
    return SplitModel(nn.Sequential(body, nn.ReLU()), features, classes,
                      head=nn.Conv2d(features, classes, 1))


def build_unet(params: StrictModel, info: DataInfo) -> nn.Module:
    """MONAI's ``UNet`` of :class:`~raysim.models.params.UNetParams` for ``info``'s images."""
    from monai.networks.nets import UNet

    assert isinstance(params, UNetParams)
    require_segmentation(params.name, info)
    features = params.head_features or params.channels[0]
    body = UNet(spatial_dims=2, in_channels=info.input_shape[0], out_channels=features,
                channels=params.channels, strides=(2,) * (len(params.channels) - 1),
                num_res_units=params.residual_units, norm=params.norm, dropout=params.dropout)
    return segmentation_split(body, features, info.num_classes)


class UNetPlusPlus(nn.Module):
    """MONAI's ``BasicUNetPlusPlus`` returning its final output (MONAI returns a list of the
    deep-supervision heads' outputs, the last one without deep supervision)."""

    def __init__(self, params: UNetPlusPlusParams, info: DataInfo, out_channels: int):
        super().__init__()
        from monai.networks.nets import BasicUNetPlusPlus

        self.net = BasicUNetPlusPlus(spatial_dims=2, in_channels=info.input_shape[0],
                                     out_channels=out_channels, features=params.features,
                                     norm=params.norm)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[-1]


def build_unetpp(params: StrictModel, info: DataInfo) -> nn.Module:
    """:class:`UNetPlusPlus` of :class:`~raysim.models.params.UNetPlusPlusParams`."""
    assert isinstance(params, UNetPlusPlusParams)
    require_segmentation(params.name, info)
    features = params.head_features or params.features[0]
    return segmentation_split(UNetPlusPlus(params, info, features), features, info.num_classes)


def _stage(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
        nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
        nn.BatchNorm2d(out_channels), nn.ReLU(inplace=True),
        nn.MaxPool2d(2, ceil_mode=True))


class FCN(nn.Module):
    """FCN-8s's body: five VGG-style stages (strides 2..32); the stride-8, -16 and -32 maps
    are each projected to ``head_features`` channels by a 1x1 convolution, upsampled
    (bilinear) to the stride-8 map's size and summed (the paper's skip fusion, here of
    features rather than class scores, so the head stays one 1x1 convolution), then upsampled
    to the input's size."""

    def __init__(self, in_channels: int, channels: tuple[int, ...], head_features: int):
        super().__init__()
        widths = (in_channels, *channels)
        self.stages = nn.ModuleList(_stage(a, b) for a, b in itertools.pairwise(widths))
        self.skips = nn.ModuleList(nn.Conv2d(c, head_features, 1) for c in channels[2:])

    def forward(self, x: Tensor) -> Tensor:
        maps = []
        out = x
        for stage in self.stages:
            out = stage(out)
            maps.append(out)
        fine = maps[2]
        size = (fine.shape[2], fine.shape[3])
        fused = torch.stack([F.interpolate(project(m), size=size, mode="bilinear",
                                           align_corners=False)
                             for project, m in zip(self.skips, maps[2:], strict=True)]).sum(0)
        return F.interpolate(fused, size=(x.shape[2], x.shape[3]), mode="bilinear",
                             align_corners=False)


def build_fcn(params: StrictModel, info: DataInfo) -> nn.Module:
    """:class:`FCN` of :class:`~raysim.models.params.FCNParams`."""
    assert isinstance(params, FCNParams)
    require_segmentation(params.name, info)
    body = FCN(info.input_shape[0], params.channels, params.head_features)
    return segmentation_split(body, params.head_features, info.num_classes)


def build_lcfed_unet(params: StrictModel, info: DataInfo) -> nn.Module:
    """LC-Fed's network (:class:`~raysim.models.local_calibration.LocalCalibrationNet`) on
    the U-Net of :class:`~raysim.models.params.LCFedUNetParams`."""
    from raysim.models.local_calibration import LocalCalibrationNet, scaled_kernel

    assert isinstance(params, LCFedUNetParams)
    split = build_unet(params.unet(), info)
    assert isinstance(split, SplitModel)
    size = int(info.input_shape[-1])
    kernel, sigma = scaled_kernel(size)
    if params.calibration_kernel is not None:
        kernel, sigma = params.calibration_kernel | 1, params.calibration_kernel * 6.0 / 31
    return LocalCalibrationNet(split, info.num_classes, params.sites, kernel, sigma)


register_model(UNetParams, segmentation=True)(build_unet)
register_model(LCFedUNetParams, segmentation=True)(build_lcfed_unet)
register_model(UNetPlusPlusParams, segmentation=True)(build_unetpp)
register_model(FCNParams, segmentation=True)(build_fcn)
