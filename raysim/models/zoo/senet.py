"""SENet (Hu et al. 2018): residual basic blocks with squeeze-and-excitation channel gates."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.models.split import SplitModel, conv_bn_relu, register_zoo_model


class SEBlock(nn.Module):
    """Two 3x3 convolutions, an SE gate (reduction 8) and a (projection) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.branch = nn.Sequential(conv_bn_relu(in_channels, out_channels, 3, stride),
                                    conv_bn_relu(out_channels, out_channels, relu=False))
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1),
                                  nn.Conv2d(out_channels, out_channels // 8, 1), nn.ReLU(inplace=True),
                                  nn.Conv2d(out_channels // 8, out_channels, 1), nn.Sigmoid())
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = conv_bn_relu(in_channels, out_channels, 1, stride, relu=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        out = self.branch(x)
        return self.relu(out * self.gate(out) + self.shortcut(x))


def senet(in_channels: int, num_classes: int) -> SplitModel:
    """SE-ResNet: stem + three stages of two SE blocks, 32-128 channels."""
    layers: list[nn.Module] = [conv_bn_relu(in_channels, 32)]
    channels = 32
    for stage, width in enumerate((32, 64, 128)):
        for index in range(2):
            layers.append(SEBlock(channels, width, 2 if stage > 0 and index == 0 else 1))
            channels = width
    return SplitModel(nn.Sequential(*layers), channels, num_classes)


register_zoo_model("senet", senet)
