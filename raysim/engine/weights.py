"""Model weights as ``dict[str, numpy array]``: cheap to put into Ray's object store (zero-copy
reads), independent of the device a worker trains on."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def get_weights(model: nn.Module) -> Weights:
    """Copy a model's full state (parameters and buffers) to numpy arrays."""
    return {name: tensor.detach().cpu().numpy().copy() for name, tensor in model.state_dict().items()}


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with ``array``, also for the read-only arrays that Ray's
    object store hands out (raysim never writes through these tensors)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(array))


def set_weights(model: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Load numpy weights into a model in place (copied onto the model's device)."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            tensor.copy_(as_tensor(weights[name]))


def payload_bytes(payload: Any) -> int:
    """Bytes a payload would take on the wire: array data, recursively; 8 bytes per scalar."""
    if isinstance(payload, np.ndarray):
        return int(payload.nbytes)
    if isinstance(payload, torch.Tensor):
        return int(payload.numel() * payload.element_size())
    if isinstance(payload, Mapping):
        return sum(payload_bytes(value) for value in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(value) for value in payload)
    if payload is None:
        return 0
    return 8
