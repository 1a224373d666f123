"""MH-pFLID's messenger (the paper's Appendix E, Table 9) and its information receiver and
transmitter (Section 3.3).

Messenger body: conv 3x3-64, max-pool 3x3, conv 5x5-64, max-pool 3x3, conv 7x7-512, every layer
stride 2, ReLU after each convolution. Head: linear-256, BatchNorm1d, ReLU, linear-classes, on
the (pooled) 512-d output of the body, the receiver or the transmitter.

Receiver and transmitter exchange information between a local body's feature map I_loc
(C_loc channels) and the messenger body's feature map I_mes (D_mes channels):
``I'_loc = W_d(I_loc)`` brings local features to D_mes; the receiver attends with queries from
the messenger (Q = W_q I_mes, K = W_k I'_loc, V = W_v I'_loc), the transmitter with queries from
the local model (Q = W_q I'_loc, K = W_k I_mes, V = W_v I_mes); the output is
softmax(Q K^T / sqrt(d)) V, pooled over tokens to a D_mes vector for the messenger head.

Attention is computed per sample over *feature tokens*, never across the batch:

- ``spatial`` tokens (default): every position of each map is a token of D_mes features (W_d:
  C_loc -> D_mes per position; d = D_mes as in the paper's Eq. 8). The messenger needs a map with
  spatial extent for this: the Appendix-E body divides the input by 32, so a 28 px image gives a
  1x1 map (28 -> 14 -> 7 -> 4 -> 2 -> 1) and the transmitter would have a single key (its softmax
  is 1 and its output ignores the local features). ``Messenger(input_size=112)`` therefore
  resizes its input (bilinear) to 112 px, which gives a 4x4 map (16 tokens) whatever the
  client's resolution; the paper's 384 px BreaKHis images give 12x12 without resizing.
- ``channel`` tokens: both maps are average-pooled to a ``grid`` x ``grid`` map; W_d is linear
  over channels (C_loc -> D_mes); each of the D_mes channels is a token whose vector is its
  grid x grid map (d = grid^2). Kept for comparison only: attention is invariant to permuting
  its keys, so the transmitter's output does not change when the messenger's channels are
  permuted, and over a 1x1 messenger map every token is a constant; measured, its output then
  varies in 1-2 directions when the messenger input changes (see ``token_probes``).

``mode: add`` replaces attention by feature addition, the paper's ablation:
``pool(I_mes) + W_d(pool(I_loc))``.

For segmentation (:class:`SegmentationMessenger`, Table 10) the body is four stride-1
convolutions (3x3-64, 5x5-64, 7x7-64, 7x7-512), each followed by a 3x3 max-pool of stride 2 (the
input divided by 16), and the head four 2x2 transposed convolutions of stride 2 back to the
input's size (64, 64, 64, classes), giving per-pixel logits. Its receiver and transmitter are
``dense``: the local map is average-pooled to the messenger map's grid, every position is a
token, and the output is the (B, D_mes, h, w) map the head decodes.

For signals (``dims=1``) every layer is its 1D counterpart (Conv1d, MaxPool1d, the same kernels
and strides, the paper's Table 5 listing a messenger for Sleep-EDF without its layers); the
tokens are the positions of the (B, C, L) maps.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

TokenKind = Literal["channel", "spatial"]


class Messenger(nn.Module):
    """The lightweight model every client carries and the server averages (body + head)."""

    def __init__(self, in_channels: int, num_classes: int,
                 widths: tuple[int, int, int] = (64, 64, 512), hidden: int = 256,
                 input_size: int | None = None, dims: int = 2):
        super().__init__()
        self.input_size, self.dims = input_size, dims
        first, second, out = widths
        conv, max_pool = (nn.Conv1d, nn.MaxPool1d) if dims == 1 else (nn.Conv2d, nn.MaxPool2d)
        self.body = nn.Sequential(
            conv(in_channels, first, 3, 2, 1), nn.ReLU(inplace=True),
            max_pool(3, 2, 1),
            conv(first, second, 5, 2, 2), nn.ReLU(inplace=True),
            max_pool(3, 2, 1),
            conv(second, out, 7, 2, 3), nn.ReLU(inplace=True))
        self.head = nn.Sequential(nn.Linear(out, hidden), nn.BatchNorm1d(hidden),
                                  nn.ReLU(inplace=True), nn.Linear(hidden, num_classes))
        self.feature_channels = out

    def feature_map(self, x: Tensor) -> Tensor:
        """The body's (B, D_mes, h, w) map of ``x`` ((B, D_mes, l) for signals), resized to
        ``input_size`` first if set."""
        size = (self.input_size,) * self.dims if self.input_size is not None else None
        if size is not None and tuple(x.shape[2:]) != size:
            x = F.interpolate(x, size=size, mode="linear" if self.dims == 1 else "bilinear",
                              align_corners=False)
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(pool(self.feature_map(x)))


def pool(feature_map: Tensor) -> Tensor:
    """Global average pooling (B, C, H, W) -> (B, C), or (B, C, L) -> (B, C) for signals."""
    return feature_map.mean(dim=tuple(range(2, feature_map.ndim)))


class SegmentationMessenger(nn.Module):
    """The messenger of a segmentation task (Table 10): a body dividing the input by 16 and a
    head of transposed convolutions back to per-pixel logits at the input's size."""

    def __init__(self, in_channels: int, num_classes: int,
                 widths: tuple[int, int, int, int] = (64, 64, 64, 512), decoder: int = 64):
        super().__init__()
        layers: list[nn.Module] = []
        steps = itertools.pairwise((in_channels, *widths))
        for kernel, (before, after) in zip((3, 5, 7, 7), steps, strict=True):
            layers += [nn.Conv2d(before, after, kernel, 1, kernel // 2), nn.ReLU(inplace=True),
                       nn.MaxPool2d(3, 2, 1)]
        self.body = nn.Sequential(*layers)
        up: list[nn.Module] = []
        for before, after in zip((widths[-1], decoder, decoder), (decoder,) * 3, strict=True):
            up += [nn.ConvTranspose2d(before, after, 2, 2), nn.ReLU(inplace=True)]
        self.head = nn.Sequential(*up, nn.ConvTranspose2d(decoder, num_classes, 2, 2))
        self.feature_channels = widths[-1]

    def feature_map(self, x: Tensor) -> Tensor:
        """The body's (B, D_mes, H/16, W/16) map of ``x``."""
        return self.body(x)

    def forward(self, x: Tensor) -> Tensor:
        return fit_to(self.head(self.feature_map(x)), x)


def grid_of(feature_map: Tensor) -> tuple[int, int]:
    """The (h, w) of a (B, C, h, w) map."""
    return int(feature_map.shape[2]), int(feature_map.shape[3])


def fit_to(logits: Tensor, like: Tensor) -> Tensor:
    """Per-pixel ``logits`` resized (bilinear) to ``like``'s spatial size where they differ
    (inputs not divisible by 16)."""
    if logits.shape[2:] == like.shape[-2:]:
        return logits
    return F.interpolate(logits, size=like.shape[-2:], mode="bilinear", align_corners=False)


class InformationExchange(nn.Module):
    """The receiver (``query_from="messenger"``) or transmitter (``query_from="local"``);
    ``dense``: it returns a map at the messenger's grid (segmentation), not a pooled vector."""

    def __init__(self, local_channels: int, messenger_channels: int, *,
                 query_from: Literal["messenger", "local"], mode: Literal["attention", "add"],
                 tokens: TokenKind = "spatial", grid: int = 4, normalize: bool = True,
                 dense: bool = False):
        super().__init__()
        self.query_from, self.mode, self.tokens, self.grid = query_from, mode, tokens, grid
        self.dense = dense
        self.project_local = nn.Linear(local_channels, messenger_channels)  # W_d
        if mode == "attention":
            width = grid * grid if tokens == "channel" else messenger_channels
            norm = nn.LayerNorm if normalize else nn.Identity
            self.norm_queries, self.norm_sources = norm(width), norm(width)
            self.query = nn.Linear(width, width)
            self.key = nn.Linear(width, width)
            self.value = nn.Linear(width, width)
            self.scale = 1.0 / math.sqrt(width)

    def forward(self, local_map: Tensor, messenger_map: Tensor) -> Tensor:
        """(B, C_loc, H, W) and (B, D_mes, h, w) -> (B, D_mes), or (B, D_mes, h, w) when
        ``dense``."""
        if self.dense:
            return self._dense(F.adaptive_avg_pool2d(local_map, grid_of(messenger_map)),
                               messenger_map)
        if self.mode == "add":
            return pool(messenger_map) + self.project_local(pool(local_map))
        local_tokens, messenger_tokens = self._tokens(local_map, messenger_map)
        if self.query_from == "messenger":
            queries, sources = messenger_tokens, local_tokens
        else:
            queries, sources = local_tokens, messenger_tokens
        out = self._attend(queries, sources)  # (B, Nq, width)
        return out.mean(dim=2) if self.tokens == "channel" else out.mean(dim=1)

    def _attend(self, queries: Tensor, sources: Tensor) -> Tensor:
        """softmax(Q K^T / sqrt(d)) V of the normalised tokens: (B, Nq, width)."""
        queries, sources = self.norm_queries(queries), self.norm_sources(sources)
        q, k, v = self.query(queries), self.key(sources), self.value(sources)
        weights = torch.softmax(q @ k.transpose(1, 2) * self.scale, dim=-1)  # (B, Nq, Nk)
        return weights @ v

    def _dense(self, local_map: Tensor, messenger_map: Tensor) -> Tensor:
        """Both maps on the messenger's grid: every position a token; the output a map."""
        batch, channels, height, width = messenger_map.shape
        local = self.project_local(local_map.flatten(2).transpose(1, 2))  # (B, hw, D_mes)
        messenger = messenger_map.flatten(2).transpose(1, 2)
        if self.mode == "add":
            out = messenger + local
        else:
            out = self._attend(*((messenger, local) if self.query_from == "messenger"
                                 else (local, messenger)))
        return out.transpose(1, 2).reshape(batch, channels, height, width)

    def _tokens(self, local_map: Tensor, messenger_map: Tensor) -> tuple[Tensor, Tensor]:
        if self.tokens == "channel":  # (B, channels, grid^2)
            local, messenger = (
                (F.adaptive_avg_pool2d(m, self.grid) if m.ndim == 4
                 else F.adaptive_avg_pool1d(m, self.grid * self.grid)).flatten(2)
                for m in (local_map, messenger_map))
            local = self.project_local(local.transpose(1, 2)).transpose(1, 2)
            return local, messenger
        local = self.project_local(local_map.flatten(2).transpose(1, 2))  # (B, HW, D_mes)
        return local, messenger_map.flatten(2).transpose(1, 2)
