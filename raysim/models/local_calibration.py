"""LC-Fed's network (Wang, Jin and Wang, "Personalizing federated medical image segmentation
via local calibration", ECCV 2022): a U-Net whose deepest encoder features pass a personalised
channel selection conditioned on the client's site, and a head calibration that refines the
prediction where the other sites' heads disagree with the client's own.

- **Channel selection** (:class:`SiteChannelSelection`): a one-hot site vector, embedded by two
  1x1 convolutions, is joined to the average- and max-pooled bottleneck features; a shared
  bottleneck MLP turns each into a channel gate, and the features become ``x * gate + x``.
  Training pushes the gates of the client's own site away from those the other sites'
  embeddings give on the same features (the contrastive site embedding term).
- **Head calibration** (:class:`HeadCalibration`): on the decoder's last feature map, every
  site's 1x1 segmentation head (kept in the ``peer_weight`` / ``peer_bias`` buffers, refreshed
  from the server each round) predicts class probabilities; their root-mean-square departure
  from the client's own head, normalised per image, thinned to local maxima above 0.2 and
  blurred by a Gaussian, is the disagreement map. Features weighted by it and by the client's
  own prediction (``f * m + f`` for each class and map) go through a 3x3 convolution to the
  calibrated logits. It is used once ``calibrating`` is 1 (LC-Fed's second stage).

The site, the peer heads and the stage are buffers, so a client's personal model (its state)
carries them and evaluates as any other model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raysim.models.split import SplitModel


class SiteChannelSelection(nn.Module):
    """LC-Fed's personalised channel selection of ``channels`` features for ``sites`` sites."""

    site: Tensor
    """The client's site, one-hot (a buffer: part of the client's state)."""

    def __init__(self, channels: int, sites: int):
        super().__init__()
        self.register_buffer("site", torch.zeros(sites))
        self.embed = nn.Sequential(nn.Conv2d(sites, channels, 1, bias=False), nn.ReLU(),
                                   nn.Conv2d(channels, channels, 1, bias=False))
        hidden = max(channels // 16, 1)
        self.gate = nn.Sequential(nn.Conv2d(2 * channels, hidden, 1, bias=False), nn.ReLU(),
                                  nn.Conv2d(hidden, channels, 1, bias=False))
        self.last_input: Tensor | None = None
        self.last_gate: Tensor | None = None

    def channel_gate(self, x: Tensor, site: Tensor) -> Tensor:
        """(B, C, 1, 1) gates of features ``x`` for a site's one-hot vector ``site``."""
        embedded = self.embed(site.view(1, -1, 1, 1)).expand(len(x), -1, -1, -1)
        pooled = (F.adaptive_avg_pool2d(x, 1), F.adaptive_max_pool2d(x, 1))
        return torch.sigmoid(sum(self.gate(torch.cat([p, embedded], 1)) for p in pooled))

    def forward(self, x: Tensor) -> Tensor:
        gate = self.channel_gate(x, self.site)
        if self.training:  # for the contrastive term of this step
            self.last_input, self.last_gate = x, gate
        return x * gate + x


def gaussian_kernel(size: int, sigma: float) -> Tensor:
    """A (1, 1, size, size) Gaussian with its peak at 1 (LC-Fed's soft attention)."""
    coordinates = torch.arange(size, dtype=torch.float32) - (size - 1) / 2
    squared = coordinates[None, :] ** 2 + coordinates[:, None] ** 2
    kernel = torch.exp(-squared / (2 * sigma ** 2))
    return (kernel / kernel.max()).view(1, 1, size, size)


class HeadCalibration(nn.Module):
    """LC-Fed's head calibration over ``features`` channels for ``classes`` classes and
    ``sites`` sites' heads; ``kernel``: the width of the local-maximum window and of the
    Gaussian blur (31 px at the paper's 384 px), ``sigma`` the blur's (6 px there)."""

    site: Tensor
    peer_weight: Tensor
    """(sites, classes, features): every site's 1x1 head at the round's start."""
    peer_bias: Tensor
    blur: Tensor

    def __init__(self, features: int, classes: int, sites: int, kernel: int, sigma: float):
        super().__init__()
        self.register_buffer("site", torch.zeros(sites))
        self.register_buffer("peer_weight", torch.zeros(sites, classes, features))
        self.register_buffer("peer_bias", torch.zeros(sites, classes))
        self.register_buffer("blur", gaussian_kernel(kernel, sigma))
        self.kernel = kernel
        self.calibrate = nn.Conv2d(2 * classes * features, classes, 3, padding=1)

    @torch.no_grad()
    def disagreement(self, features: Tensor) -> Tensor:
        """(B, classes, H, W): where the sites' heads depart from the client's own (local
        maxima of the normalised RMS departure above 0.2)."""
        logits = torch.einsum("skf,bfhw->sbkhw", self.peer_weight, features) \
            + self.peer_bias[:, None, :, None, None]
        probabilities = logits.softmax(dim=2)
        own = int(self.site.argmax())
        sites = len(probabilities)
        spread = ((probabilities - probabilities[own]) ** 2).sum(0) / max(sites - 1, 1)
        spread = spread.sqrt()
        # (a floor on the maximum: heads that agree up to rounding leave no region)
        spread = spread / spread.amax(dim=(2, 3), keepdim=True).clamp_min(1e-4)
        peaks = spread == F.max_pool2d(spread, self.kernel, 1, self.kernel // 2)
        return (peaks & (spread > 0.2)).to(features.dtype)

    def soften(self, maps: Tensor) -> Tensor:
        """Each map blurred by the Gaussian (per channel)."""
        channels = maps.shape[1]
        return F.conv2d(maps, self.blur.expand(channels, 1, -1, -1), padding=self.kernel // 2,
                        groups=channels)

    def forward(self, features: Tensor, logits: Tensor) -> Tensor:
        uncertain = self.soften(self.disagreement(features))
        predicted = self.soften(logits.detach().softmax(dim=1))
        weighted = [features * m[:, None] + features
                    for c in range(logits.shape[1])
                    for m in (uncertain[:, c], predicted[:, c])]
        return self.calibrate(torch.cat(weighted, dim=1))


class LocalCalibrationNet(SplitModel):
    """A segmentation :class:`SplitModel` (a MONAI U-Net's body and 1x1 head) with LC-Fed's
    channel selection at the U-Net's bottleneck and its head calibration after the head."""

    calibrating: Tensor
    """1 in LC-Fed's second stage: the output is the calibrated prediction."""

    def __init__(self, split: SplitModel, classes: int, sites: int, kernel: int,
                 sigma: float):
        super().__init__(split.body, split.feature_channels, classes, head=split.head)
        bottleneck = _bottleneck(split.body)
        bottom = bottleneck.submodule
        assert isinstance(bottom, nn.Module)
        bottleneck.submodule = nn.Sequential(bottom,
                                             SiteChannelSelection(_out_channels(bottom), sites))
        self.calibration = HeadCalibration(split.feature_channels, classes, sites, kernel,
                                           sigma)
        self.register_buffer("calibrating", torch.zeros(()))

    @property
    def selection(self) -> SiteChannelSelection:
        """The channel selection inside the body (at the U-Net's bottleneck)."""
        return next(m for m in self.body.modules() if isinstance(m, SiteChannelSelection))

    def forward(self, x: Tensor) -> Tensor:
        features = self.body(x)
        logits = self.head(features)
        if float(self.calibrating) == 0:
            return logits
        return self.calibration(features, logits)


def _bottleneck(body: nn.Module) -> nn.Module:
    """The innermost skip connection of a MONAI U-Net (its submodule: the bottom layer)."""
    from monai.networks.layers.simplelayers import SkipConnection

    found = [m for m in body.modules() if isinstance(m, SkipConnection)]
    if not found:
        raise ValueError("LC-Fed's channel selection needs a MONAI U-Net body")
    return found[-1]


def _out_channels(layer: nn.Module) -> int:
    """The output channels of a U-Net's bottom layer (a MONAI Convolution or residual unit)."""
    convolutions = [m for m in layer.modules() if isinstance(m, nn.Conv2d)]
    if convolutions:
        return int(convolutions[-1].out_channels)
    raise ValueError("the U-Net's bottom layer has no convolution")


def scaled_kernel(size: int, paper_size: int = 384, paper_kernel: int = 31) -> tuple[int, float]:
    """The calibration's window and blur at input size ``size``: the paper's 31 px window and
    6 px sigma at 384 px, scaled (the window odd, at least 3)."""
    window = max(3, round(paper_kernel * size / paper_size) | 1)
    return window, 6.0 * size / paper_size if size != paper_size else 6.0

