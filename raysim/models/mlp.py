"""Multi-layer perceptron (a linear model when ``hidden`` is empty)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.errors import ConfigError
from raysim.models.params import MLPParams
from raysim.models.registry import register_model


class MLP(nn.Module):
    """Flatten, then Linear-ReLU blocks and a linear classifier; ``binary_margin``: two
    classes from one output f, as logits (0, f)."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...],
                 binary_margin: bool = False):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(inplace=True)]
            width = size
        layers.append(nn.Linear(width, 1 if binary_margin else num_classes))
        self.net = nn.Sequential(*layers)
        self.binary_margin = binary_margin

    def forward(self, x: Tensor) -> Tensor:
        out = self.net(x)
        return torch.cat([torch.zeros_like(out), out], dim=1) if self.binary_margin else out


@register_model(MLPParams)
def build_mlp(params: MLPParams, info: DataInfo) -> nn.Module:
    if params.binary_margin and info.num_classes != 2:
        raise ConfigError(
            f"Invalid config field `model.binary_margin` = true: it models two classes by one "
            f"output, and dataset `{info.name}` has {info.num_classes}. Set it to false, or use "
            "a two-class dataset.")
    return MLP(math.prod(info.input_shape), info.num_classes, params.hidden,
               params.binary_margin)
