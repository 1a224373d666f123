"""Where a client model's convolutions keep their tensors: channels-last on CPUs.

PyTorch's CPU convolutions (oneDNN) run faster on channels-last (NHWC) tensors than on the
default contiguous (NCHW) layout; a model whose weights are channels-last makes every
convolution's output channels-last too, so converting the model is enough. Measured on the
2-CPU development machine (one thread, batch 8, forward + backward, 28 px): 10-47 % less time
for the eight MH-pFLID architectures and about 30 % for the messenger at 112 px
(BENCHMARKS.md). The layout changes only the order of floating-point sums, so results differ
from the contiguous layout in the last bits and are as deterministic.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def has_image_convolutions(module: nn.Module) -> bool:
    """Whether the module holds a 2-D convolution (whose layout the setting concerns)."""
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def choose_memory_format(setting: str, device: torch.device) -> torch.memory_format:
    """The layout for a worker's convolutional models: ``auto`` is channels-last on CPUs
    (measured faster there) and contiguous elsewhere (not measured)."""
    if setting == "channels_last" or (setting == "auto" and device.type == "cpu"):
        return torch.channels_last
    return torch.contiguous_format


def place(module: M, device: torch.device,
          memory_format: torch.memory_format = torch.contiguous_format) -> M:
    """Move a module to ``device``; a module with 2-D convolutions also takes
    ``memory_format``."""
    if memory_format != torch.contiguous_format and has_image_convolutions(module):
        return module.to(device=device, memory_format=memory_format)  # type: ignore[call-overload]
    return module.to(device)
