"""ResNet18 in plain torch, with a small-input stem (28-64 px) and the ImageNet stem (>64 px)."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.models.params import ResNet18Params
from raysim.models.registry import register_model, require_planar


def _norm(kind: str, channels: int, dims: int = 2) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm3d(channels)
    return nn.GroupNorm(2, channels)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str,
                 dims: int = 2):
        super().__init__()
        convolution = nn.Conv2d if dims == 2 else nn.Conv3d
        self.conv1 = convolution(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, out_channels, dims)
        self.conv2 = convolution(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, out_channels, dims)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                convolution(in_channels, out_channels, 1, stride, bias=False),
                _norm(norm, out_channels, dims),
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet18 (He et al. 2016): four stages of two basic blocks, 64-512 channels
    (``dims`` = 3: every convolution, norm and pooling in 3D, as MedMNIST v2's ResNet-18 (3D)
    baseline converts the 2D network)."""

    def __init__(self, in_channels: int, num_classes: int, small_stem: bool, norm: str,
                 dims: int = 2):
        super().__init__()
        convolution = nn.Conv2d if dims == 2 else nn.Conv3d
        if small_stem:
            stem = [convolution(in_channels, 64, 3, 1, 1, bias=False), _norm(norm, 64, dims),
                    nn.ReLU(inplace=True)]
        else:
            stem = [convolution(in_channels, 64, 7, 2, 3, bias=False), _norm(norm, 64, dims),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(3, 2, 1) if dims == 2 else nn.MaxPool3d(3, 2, 1)]
        self.stem = nn.Sequential(*stem)
        blocks: list[nn.Module] = []
        channels = 64
        for stage, width in enumerate((64, 128, 256, 512)):
            for index in range(2):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(BasicBlock(channels, width, stride, norm, dims))
                channels = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1) if dims == 2 else nn.AdaptiveAvgPool3d(1)
        self.classifier = nn.Linear(512, num_classes)

    def embed(self, x: Tensor) -> Tensor:
        """Pooled 512-d features before the classifier."""
        return self.pool(self.blocks(self.stem(x))).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.embed(x))


@register_model(ResNet18Params)
def build_resnet18(params: ResNet18Params, info: DataInfo) -> nn.Module:
    require_planar("resnet18", info)
    channels, size = info.input_shape[:2]
    small = size <= 64 if params.stem == "auto" else params.stem == "small"
    return ResNet18(channels, info.num_classes, small, params.norm)
