"""The small CNN of federated-learning benchmarks (the Keras CIFAR-10 example that
pfl-research and Flower benchmark with): two 3x3 convolutions, one max-pool, a hidden dense
layer. No normalisation layers, so it trains on the vectorised path."""

from __future__ import annotations

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.models.params import SimpleCNNParams
from raysim.models.registry import register_model, require_planar


class SimpleCNN(nn.Module):
    """conv3x3(c1)-ReLU, conv3x3(c2)-ReLU, max-pool 2, dense(hidden)-ReLU, dense(classes)."""

    def __init__(self, in_channels: int, size: int, num_classes: int, params: SimpleCNNParams):
        super().__init__()
        first, second = params.channels
        side = (size - 4) // 2  # two unpadded 3x3 convolutions, then a 2x2 pool
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, first, 3), nn.ReLU(),
            nn.Conv2d(first, second, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten(),
        )
        self.classifier = nn.Sequential(nn.Linear(second * side * side, params.hidden), nn.ReLU(),
                                        nn.Linear(params.hidden, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))


@register_model(SimpleCNNParams)
def build_simple_cnn(params: SimpleCNNParams, info: DataInfo) -> nn.Module:
    require_planar("cnn", info)
    channels, size = info.input_shape[:2]
    return SimpleCNN(channels, size, info.num_classes, params)
