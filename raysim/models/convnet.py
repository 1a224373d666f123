"""ConvNet of the dataset-condensation literature (Zhao et al.; FedDM; FedVCK)."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.errors import ConfigError
from raysim.models.params import ConvNetParams
from raysim.models.registry import register_model, require_images


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "instance":  # the DC literature's "instancenorm": GroupNorm with one group per channel
        return nn.GroupNorm(channels, channels, affine=True)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.Identity()


class ConvNet(nn.Module):
    """``depth`` x [conv3x3(width) - norm - ReLU - pool2], then one linear classifier."""

    def __init__(self, in_channels: int, size: int, num_classes: int, params: ConvNetParams):
        super().__init__()
        layers: list[nn.Module] = []
        channels = in_channels
        for layer in range(params.depth):
            padding = params.first_padding if layer == 0 else 1
            size += 2 * (padding - 1)
            layers += [
                nn.Conv2d(channels, params.width, kernel_size=3, padding=padding),
                _norm(params.norm, params.width),
                nn.ReLU(inplace=True),
                nn.AvgPool2d(2) if params.pooling == "avg" else nn.MaxPool2d(2),
            ]
            channels = params.width
            size //= 2
        self.features = nn.Sequential(*layers)
        self.embedding_dim = params.width * size * size
        self.classifier = nn.Linear(self.embedding_dim, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        """Flattened features before the classifier."""
        return self.features(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


@register_model(ConvNetParams)
def build_convnet(params: ConvNetParams, info: DataInfo) -> nn.Module:
    require_images("convnet", info)
    channels, size, _ = info.input_shape
    if size >> params.depth == 0:
        raise ConfigError(
            f"Invalid config field `model.depth` = {params.depth}: {size}x{size} inputs halve to "
            f"nothing after {params.depth} pooling layers. Use depth <= {size.bit_length() - 1}."
        )
    return ConvNet(channels, size, info.num_classes, params)
