"""ConvNet of the dataset-condensation literature (Zhao et al.; FedDM; FedVCK)."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.errors import ConfigError
from raysim.models.params import ConvNetParams
from raysim.models.registry import register_model, require_planar


def _norm(kind: str, channels: int, dims: int) -> nn.Module:
    if kind == "instance":  # the DC literature's "instancenorm": GroupNorm with one group per channel
        return nn.GroupNorm(channels, channels, affine=True)
    if kind == "batch":
        return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm3d(channels)
    return nn.Identity()


def _pool(kind: str, dims: int) -> nn.Module:
    if kind == "avg":
        return nn.AvgPool2d(2) if dims == 2 else nn.AvgPool3d(2)
    return nn.MaxPool2d(2) if dims == 2 else nn.MaxPool3d(2)


class ConvNet(nn.Module):
    """``depth`` x [conv3x3(width) - norm - ReLU - pool2], then one linear classifier
    (``dims`` = 3: the same with 3x3x3 convolutions and 2x2x2 pooling, for volumes)."""

    def __init__(self, in_channels: int, size: int, num_classes: int, params: ConvNetParams,
                 dims: int = 2):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        convolution = nn.Conv2d if dims == 2 else nn.Conv3d
        for layer in range(params.depth):
            padding = params.first_padding if layer == 0 else 1
            size += 2 * (padding - 1)
            layers += [
                convolution(channels, params.width, kernel_size=3, padding=padding),
                _norm(params.norm, params.width, dims),
                nn.ReLU(inplace=True),
                _pool(params.pooling, dims),
            ]
            channels = params.width
            size //= 2
        self.features = nn.Sequential(*layers)
        self.embedding_dim = params.width * size ** dims
        self.classifier = nn.Linear(self.embedding_dim, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        """Flattened features before the classifier."""
        return self.features(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


@register_model(ConvNetParams)
def build_convnet(params: ConvNetParams, info: DataInfo) -> nn.Module:
    require_planar("convnet", info)
    channels, size = info.input_shape[:2]
    check_depth(params.depth, size)
    return ConvNet(channels, size, info.num_classes, params)


def check_depth(depth: int, size: int) -> None:
    """``depth`` halvings must leave at least one pixel of a ``size``-pixel input."""
    if size >> depth == 0:
        raise ConfigError(
            f"Invalid config field `model.depth` = {depth}: {size}-pixel inputs halve to "
            f"nothing after {depth} pooling layers. Use depth <= {size.bit_length() - 1}."
        )
