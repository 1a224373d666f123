"""Classifiers split into a body (image -> feature map) and a head (feature map -> logits), the
shape model-heterogeneous methods (MH-pFLID, FedMD) work with, and the registration helper of
the heterogeneous model zoo."""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.models.params import ZOO_PARAMS
from raysim.models.registry import register_model, require_planar


class GlobalAveragePool(nn.Module):
    """The mean over every axis after the channels: (B, C, *spatial) -> (B, C), for feature
    maps of images (B, C, H, W) and of signals (B, C, L) alike."""

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 4:  # images: the adaptive pool image models have always used
            return F.adaptive_avg_pool2d(x, 1).flatten(1)
        return x.flatten(2).mean(dim=2)


class SplitModel(nn.Module):
    """``head(body(x))``: the body maps inputs to a (B, C, H, W) feature map (images) or a
    (B, C, L) one (signals), the head pools it and classifies with one linear layer; a
    segmentation network passes its own ``head`` (a 1x1 convolution to per-pixel logits)."""

    def __init__(self, body: nn.Module, feature_channels: int, num_classes: int,
                 head: nn.Module | None = None):
        super().__init__()
        self.body = body
        self.feature_channels = feature_channels
        # (the Identity keeps the linear layer at ``head.2``, where saved weights have it)
        self.head = head if head is not None else nn.Sequential(
            GlobalAveragePool(), nn.Identity(), nn.Linear(feature_channels, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


def conv_bn_relu(in_channels: int, out_channels: int, kernel: int = 3, stride: int = 1,
                 groups: int = 1, relu: bool = True) -> nn.Sequential:
    """Convolution (same padding, no bias) + BatchNorm (+ ReLU)."""
    layers: list[nn.Module] = [
        nn.Conv2d(in_channels, out_channels, kernel, stride, kernel // 2, groups=groups,
                  bias=False),
        nn.BatchNorm2d(out_channels)]
    if relu:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


ZOO: list[str] = []
"""Names of the registered split (body/head) architectures."""


def register_zoo_model(name: str, build: Callable[[int, int], SplitModel]) -> None:
    """Register ``build(in_channels, num_classes)`` as model ``name`` (no hyperparameters; its
    description is in :data:`raysim.models.params.ZOO_MODELS`)."""
    params = ZOO_PARAMS[name]

    def builder(_: StrictModel, info: DataInfo) -> nn.Module:
        require_planar(name, info)
        return build(info.input_shape[0], info.num_classes)

    register_model(params)(builder)
    ZOO.append(name)
