"""Model weights as ``dict[str, numpy array]``: cheap to put into Ray's object store (zero-copy
reads), independent of the device a worker trains on."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

Weights = dict[str, np.ndarray]


def state_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state tensors (sharing storage with its parameters and buffers), cached on
    the model: building ``state_dict()`` anew costs more than copying a small model."""
    cached = model.__dict__.get("_raysim_state_tensors")
    if cached is None:
        cached = dict(model.state_dict())
        model.__dict__["_raysim_state_tensors"] = cached
    return cached


def get_weights(model: nn.Module) -> Weights:
    """Copy a model's full state (parameters and buffers) to numpy arrays."""
    return {name: tensor.detach().cpu().numpy().copy()
            for name, tensor in state_tensors(model).items()}


# Arrays from Ray's object store are read-only; raysim never writes through tensors made from
# them, so torch's warning about that is silenced once here rather than per call (hot path).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        category=UserWarning)


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing memory with ``array`` (also for read-only object-store arrays)."""
    return torch.from_numpy(np.asarray(array))


def set_weights(model: nn.Module, weights: Mapping[str, np.ndarray]) -> None:
    """Load numpy weights into a model in place (copied onto the model's device)."""
    with torch.no_grad():
        for name, tensor in state_tensors(model).items():
            tensor.copy_(as_tensor(weights[name]))


def payload_bytes(payload: Any) -> int:
    """Bytes a payload would take on the wire: array data, recursively; 8 bytes per scalar."""
    if isinstance(payload, np.ndarray):
        return int(payload.nbytes)
    if isinstance(payload, FlatWeights):
        return int(payload.vector.nbytes)
    if isinstance(payload, torch.Tensor):
        return int(payload.numel() * payload.element_size())
    if isinstance(payload, Mapping):
        values = payload.values()
        if all(isinstance(value, np.ndarray) for value in values):
            return sum(value.nbytes for value in values)
        return sum(payload_bytes(value) for value in values)
    if isinstance(payload, (list, tuple)):
        return sum(payload_bytes(value) for value in payload)
    if payload is None:
        return 0
    return 8


Layout = tuple[tuple[str, tuple[int, ...]], ...]


class FlatWeights(Mapping):
    """A model's float32 state as one flat vector plus its layout, read as a Weights mapping.

    The vectorised trainer keeps many clients as rows of one matrix; handing each client a
    row (a view) instead of a dict of arrays makes stacking and unstacking one operation per
    round rather than one per client and tensor.
    """

    __slots__ = ("layout", "vector")

    def __init__(self, vector: np.ndarray, layout: Layout):
        self.vector = vector
        self.layout = layout

    def __getitem__(self, name: str) -> np.ndarray:
        start, stop, shape = _offsets(self.layout)[name]
        return self.vector[start:stop].reshape(shape)

    def __iter__(self):
        return (name for name, _ in self.layout)

    def __len__(self) -> int:
        return len(self.layout)


@functools.lru_cache(maxsize=64)
def _offsets(layout: Layout) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    offsets, position = {}, 0
    for name, shape in layout:
        size = math.prod(shape)
        offsets[name] = (position, position + size, shape)
        position += size
    return offsets


def flat_vector(weights: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray:
    """The flat float32 vector of ``weights`` in ``layout`` order (no copy for FlatWeights)."""
    if isinstance(weights, FlatWeights) and weights.layout == layout:
        return weights.vector
    return np.concatenate([np.asarray(weights[name], dtype=np.float32).ravel()
                           for name, _ in layout])
