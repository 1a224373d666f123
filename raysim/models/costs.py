"""Model sizes and compute: parameter counts and FLOPs per forward pass (torch's FLOP
counter: one multiply-add = 2 FLOPs), for every client's architecture at its input resolution
and for the models an algorithm shares (e.g. MH-pFLID's messenger)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.models import build_model


def parameter_count(module: nn.Module) -> int:
    """Number of parameters (buffers excluded)."""
    return sum(p.numel() for p in module.parameters())


def forward_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    """FLOPs of one forward pass of one sample in eval mode (with PyTorch's fused Transformer
    encoder kernel off for the count: the counter does not see inside it)."""
    module.eval()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(torch.zeros((1, *input_shape)))
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
    return int(counter.get_total_flops())


def client_input_shape(input_shape: tuple[int, ...], factor: int) -> tuple[int, ...]:
    """A client's image shape after average-pooling by ``factor`` (ceil mode)."""
    if factor <= 1:
        return input_shape
    channels, *spatial = input_shape
    return (channels, *(math.ceil(s / factor) for s in spatial))


def cost_table(info: DataInfo, architectures: Sequence[StrictModel], downsample: Sequence[int],
               shared_models: dict[str, nn.Module]) -> pd.DataFrame:
    """One row per client (its architecture at its input size: ``architectures[c]``,
    ``downsample[c]``) and one per shared model (e.g. MH-pFLID's messenger) and distinct client
    input size: columns client, model, input, params, mflops."""
    rows = []
    sizes = []
    for client, (architecture, factor) in enumerate(zip(architectures, downsample, strict=True)):
        shape = client_input_shape(info.input_shape, factor)
        sizes.append(shape)
        model = build_model(architecture, info)
        rows.append({"client": client, "model": architecture.name,  # type: ignore[attr-defined]
                     "input": "x".join(map(str, shape)), "params": parameter_count(model),
                     "mflops": forward_flops(model, shape) / 1e6})
    for name, module in shared_models.items():
        for shape in dict.fromkeys(sizes):
            rows.append({"client": -1, "model": name, "input": "x".join(map(str, shape)),
                         "params": parameter_count(module),
                         "mflops": forward_flops(module, shape) / 1e6})
    return pd.DataFrame(rows)


__all__ = ["client_input_shape", "cost_table", "forward_flops", "parameter_count"]
