"""Where a client model's convolutions keep their tensors: channels-last on CPUs.

PyTorch's CPU convolutions (oneDNN) run faster on channels-last (NHWC) tensors than on the
default contiguous (NCHW) layout; a model whose weights are channels-last makes every
convolution's output channels-last too, so converting the model is enough. Measured on a
2-CPU machine (one thread, batch 8, forward + backward, 28 px): 1.08-1.57x faster for the
eight MH-pFLID architectures (BatchNorm), 1.37x for the messenger at 112 px, 1.25-1.28x for
a ConvNet without normalisation or with BatchNorm. GroupNorm (the ConvNet's "instance" norm,
the GroupNorm ResNets) is the exception: channels-last made a width-128 ConvNet 0.73x as
fast, so ``auto`` leaves models with group or instance normalisation contiguous. The layout
changes only the order of floating-point sums, so results differ from the contiguous layout
in the last bits and are as deterministic.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)

_SLOW_CHANNELS_LAST = (nn.GroupNorm, nn.modules.instancenorm._InstanceNorm)
"""Layers whose CPU kernels are slower on channels-last tensors (measured for GroupNorm)."""


def uses_channels_last(module: nn.Module, device: torch.device, setting: str) -> bool:
    """Whether ``setting`` (``engine.memory_format``) puts the module channels-last: it must
    have a 2-D convolution; ``channels_last`` then always, ``auto`` on CPUs for modules without
    group or instance normalisation, ``contiguous`` never."""
    modules = list(module.modules())
    if setting == "contiguous" or not any(isinstance(m, nn.Conv2d) for m in modules):
        return False
    return setting == "channels_last" or (
        device.type == "cpu" and not any(isinstance(m, _SLOW_CHANNELS_LAST) for m in modules))


def place(module: M, device: torch.device, setting: str = "contiguous") -> M:
    """Move a module to ``device``, channels-last where :func:`uses_channels_last`."""
    if uses_channels_last(module, device, setting):
        return module.to(device=device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    return module.to(device)
