"""Sequence models for signals (inputs (B, channels, length)): a TCN, a Transformer encoder and
an RNN, each a :class:`~raysim.models.split.SplitModel` (a body giving a (B, C, L') feature map,
a head that pools it and classifies), so that the model-heterogeneous methods (MH-pFLID, FedMD,
...) take them as they take the image zoo. PyTorch's own layers do the work
(``nn.TransformerEncoderLayer``, ``nn.GRU`` / ``nn.LSTM``, ``nn.Conv1d``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.models.params import RNNParams, SignalTransformerParams, TCNParams
from raysim.models.registry import register_model, require_signals
from raysim.models.split import SplitModel


def strided_stem(channels: int, width: int, stride: int) -> nn.Sequential:
    """A convolution of kernel ``2 * stride`` (1 for stride 1) and stride ``stride`` + ReLU:
    shortens a raw signal ``stride`` times before the sequence layers."""
    kernel = 2 * stride if stride > 1 else 1
    return nn.Sequential(nn.Conv1d(channels, width, kernel, stride, padding=stride // 2),
                         nn.ReLU())


class CausalBlock(nn.Module):
    """TCN's residual block: two dilated causal convolutions with ReLU and dropout, plus the
    input (Bai et al. 2018, Figure 1b; without weight normalisation)."""

    def __init__(self, channels: int, kernel: int, dilation: int, dropout: float):
        super().__init__()
        self.pad = (kernel - 1) * dilation
        self.first = nn.Conv1d(channels, channels, kernel, dilation=dilation)
        self.second = nn.Conv1d(channels, channels, kernel, dilation=dilation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out = self.dropout(F.relu(self.first(F.pad(x, (self.pad, 0)))))
        out = self.dropout(F.relu(self.second(F.pad(out, (self.pad, 0)))))
        return F.relu(out + x)


def build_tcn(params: TCNParams, info: DataInfo) -> SplitModel:
    """The TCN of :class:`~raysim.models.params.TCNParams` for ``info``'s signals."""
    body = nn.Sequential(strided_stem(info.input_shape[0], params.channels, params.stem_stride),
                         *(CausalBlock(params.channels, params.kernel, 2 ** level,
                                       params.dropout) for level in range(params.levels)))
    return SplitModel(body, params.channels, info.num_classes)


class PatchTransformer(nn.Module):
    """Patches of the signal as tokens, learned positions, a Transformer encoder; (B, C, L) ->
    (B, width, tokens)."""

    def __init__(self, params: SignalTransformerParams, channels: int, length: int):
        super().__init__()
        self.patch = params.patch
        self.tokens = -(-length // params.patch)
        self.embed = nn.Linear(channels * params.patch, params.width)
        self.position = nn.Parameter(torch.zeros(self.tokens, params.width))
        layer = nn.TransformerEncoderLayer(params.width, params.heads, params.feedforward,
                                           params.dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, params.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(params.width)

    def forward(self, x: Tensor) -> Tensor:
        batch, channels, length = x.shape
        x = F.pad(x, (0, self.tokens * self.patch - length))
        tokens = x.reshape(batch, channels, self.tokens, self.patch).transpose(1, 2)
        hidden = self.embed(tokens.reshape(batch, self.tokens, channels * self.patch))
        hidden = self.norm(self.encoder(hidden + self.position))
        return hidden.transpose(1, 2)


def build_signal_transformer(params: SignalTransformerParams, info: DataInfo) -> SplitModel:
    """The Transformer of :class:`~raysim.models.params.SignalTransformerParams`."""
    if params.width % params.heads:
        from raysim.errors import field_error

        raise field_error("model.width", params.width,
                          f"it must be a multiple of model.heads ({params.heads})")
    channels, length = info.input_shape
    return SplitModel(PatchTransformer(params, channels, length), params.width,
                      info.num_classes)


class Recurrent(nn.Module):
    """A strided stem and a GRU or LSTM; (B, C, L) -> (B, hidden, L / stride)."""

    def __init__(self, params: RNNParams, channels: int):
        super().__init__()
        self.stem = strided_stem(channels, params.hidden, params.stem_stride)
        cell = nn.GRU if params.cell == "gru" else nn.LSTM
        self.rnn = cell(params.hidden, params.hidden, params.layers, batch_first=True)

    def forward(self, x: Tensor) -> Tensor:
        out, _ = self.rnn(self.stem(x).transpose(1, 2))
        return out.transpose(1, 2)


def build_rnn(params: RNNParams, info: DataInfo) -> SplitModel:
    """The RNN of :class:`~raysim.models.params.RNNParams`."""
    return SplitModel(Recurrent(params, info.input_shape[0]), params.hidden, info.num_classes)


ParamsT = TypeVar("ParamsT", bound=StrictModel)


def _signal_model(build: Callable[[ParamsT, DataInfo], nn.Module]
                  ) -> Callable[[StrictModel, DataInfo], nn.Module]:
    """``build`` behind the check that the dataset holds signals."""

    def checked(params: StrictModel, info: DataInfo) -> nn.Module:
        require_signals(params.name, info)  # type: ignore[attr-defined]
        return build(params, info)  # type: ignore[arg-type]

    return checked


register_model(TCNParams)(_signal_model(build_tcn))
register_model(SignalTransformerParams)(_signal_model(build_signal_transformer))
register_model(RNNParams)(_signal_model(build_rnn))
