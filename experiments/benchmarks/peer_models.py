"""raysim's benchmark models in plain PyTorch, for the peers' sides of a benchmark (Flower and
pfl-research run in environments of their own, without raysim): the ConvNet (conv3x3 -
GroupNorm per channel - ReLU - avgpool2, x depth, then a linear classifier), the small CNN of
the pfl-research and Flower benchmarks (two unpadded 3x3 convolutions, max-pool 2, a hidden
dense layer) and the MLP (hidden layers with ReLU). Each matches raysim's model of that name
layer for layer, so every side trains the same network."""

from __future__ import annotations

import itertools

from torch import nn


def build_model(spec: dict) -> nn.Module:
    """The model of a workload spec (``model``, ``input_shape``, ``num_classes``)."""
    model, classes = spec["model"], spec["num_classes"]
    if model["name"] == "convnet":
        channels, size = spec["input_shape"][0], spec["input_shape"][1]
        layers: list[nn.Module] = []
        for _ in range(model["depth"]):
            layers += [nn.Conv2d(channels, model["width"], 3, padding=1),
                       nn.GroupNorm(model["width"], model["width"], affine=True),
                       nn.ReLU(inplace=True), nn.AvgPool2d(2)]
            channels, size = model["width"], size // 2
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(channels * size * size, classes))
    if model["name"] == "cnn":
        channels, size = spec["input_shape"][0], spec["input_shape"][1]
        first, second = model.get("channels", [32, 64])
        side = (size - 4) // 2
        return nn.Sequential(nn.Conv2d(channels, first, 3), nn.ReLU(),
                             nn.Conv2d(first, second, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(second * side * side, model.get("hidden", 128)),
                             nn.ReLU(), nn.Linear(model.get("hidden", 128), classes))
    widths = [spec["input_shape"][0], *model["hidden"]]
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], classes))
