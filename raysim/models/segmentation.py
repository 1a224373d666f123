"""Segmentation networks from MONAI (``monai.networks.nets``): its U-Net (with residual units,
the Res-UNet) and UNet++, 2D, mapping images (B, C, H, W) to per-pixel class logits
(B, classes, H, W)."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.models.params import UNetParams, UNetPlusPlusParams
from raysim.models.registry import register_model, require_segmentation


def build_unet(params: StrictModel, info: DataInfo) -> nn.Module:
    """MONAI's ``UNet`` of :class:`~raysim.models.params.UNetParams` for ``info``'s images."""
    from monai.networks.nets import UNet

    assert isinstance(params, UNetParams)
    require_segmentation(params.name, info)
    return UNet(spatial_dims=2, in_channels=info.input_shape[0], out_channels=info.num_classes,
                channels=params.channels, strides=(2,) * (len(params.channels) - 1),
                num_res_units=params.residual_units, norm=params.norm, dropout=params.dropout)


class UNetPlusPlus(nn.Module):
    """MONAI's ``BasicUNetPlusPlus`` returning its final output (MONAI returns a list of the
    deep-supervision heads' outputs, the last one without deep supervision)."""

    def __init__(self, params: UNetPlusPlusParams, info: DataInfo):
        super().__init__()
        from monai.networks.nets import BasicUNetPlusPlus

        self.net = BasicUNetPlusPlus(spatial_dims=2, in_channels=info.input_shape[0],
                                     out_channels=info.num_classes, features=params.features,
                                     norm=params.norm)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)[-1]


def build_unetpp(params: StrictModel, info: DataInfo) -> nn.Module:
    """:class:`UNetPlusPlus` of :class:`~raysim.models.params.UNetPlusPlusParams`."""
    assert isinstance(params, UNetPlusPlusParams)
    require_segmentation(params.name, info)
    return UNetPlusPlus(params, info)


register_model(UNetParams)(build_unet)
register_model(UNetPlusPlusParams)(build_unetpp)
