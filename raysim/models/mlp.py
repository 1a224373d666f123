"""Multi-layer perceptron (a linear model when ``hidden`` is empty)."""

from __future__ import annotations

import math

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.models.params import MLPParams
from raysim.models.registry import register_model


class MLP(nn.Module):
    """Flatten, then Linear-ReLU blocks and a linear classifier."""

    def __init__(self, in_features: int, num_classes: int, hidden: tuple[int, ...]):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU(inplace=True)]
            width = size
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


@register_model(MLPParams)
def build_mlp(params: MLPParams, info: DataInfo) -> nn.Module:
    return MLP(math.prod(info.input_shape), info.num_classes, params.hidden)
