"""Where a worker keeps its clients' persistent states (FedDC's models, FedSM's personalized
models, MH-pFLID's local models and optimizer states, ...): on its device while they fit the
worker's memory cap, else on the host, with a notice, instead of running out of memory.

States are stored as the algorithms return them (device tensors). Once the device-resident
states of a worker would exceed the cap, every state it holds, and every state stored after,
is moved to the host (numpy-backed FlatWeights, CPU tensors); the algorithms already accept
host states (they get them after a checkpoint or a relay), so the numbers do not change.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from raysim.vectors.weights import FlatWeights, host_tree

CAP_ENV = "RAYSIM_CLIENT_STATE_CAP_BYTES"
"""Overrides the cap (bytes) for tests: a tiny value forces the host fallback on any device."""
DEVICE_SHARE = 0.3
"""Share of a worker's GPU memory cap its clients' states may take (beside the resident data's
share, :data:`raysim.training.resident_data.DEVICE_SHARE`)."""


def state_cap_bytes(device: torch.device, gpu_cap_bytes: int | None) -> int | None:
    """The cap for a worker's device-resident client states: a share of its GPU memory cap on
    a GPU; none on the CPU (host memory either way), unless :data:`CAP_ENV` sets one."""
    override = os.environ.get(CAP_ENV)
    if override:
        return int(override)
    if device.type != "cuda":
        return None
    if gpu_cap_bytes is None:
        gpu_cap_bytes = torch.cuda.get_device_properties(device).total_memory
    return int(DEVICE_SHARE * gpu_cap_bytes)


def tensor_bytes(state: Any) -> int:
    """Bytes of the torch tensors inside a state (what :func:`host_tree` moves)."""
    if isinstance(state, FlatWeights):
        vector = state.vector
        return int(vector.numel() * vector.element_size()) if isinstance(
            vector, torch.Tensor) else 0
    if isinstance(state, torch.Tensor):
        return int(state.numel() * state.element_size())
    if isinstance(state, dict):
        return sum(tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(v) for v in state)
    return 0


class StateResidency:
    """Keeps a worker's client states on its device within ``cap_bytes`` (None: no cap)."""

    def __init__(self, cap_bytes: int | None):
        self.cap_bytes = cap_bytes
        self.on_host = False
        """True once the states did not fit: every state is kept on the host from then on."""

    def keep(self, states: dict[int, Any]) -> str | None:
        """Apply the policy to ``states`` (in place) after a round stored new ones; returns a
        notice the round the states move to the host, else None."""
        if self.cap_bytes is None:
            return None
        if not self.on_host:
            held = sum(tensor_bytes(state) for state in states.values())
            if held <= self.cap_bytes:
                return None
            self.on_host = True
            notice = (f"the clients' states on this worker ({held / 2**20:.1f} MiB) exceed its "
                      f"device memory cap for states ({self.cap_bytes / 2**20:.1f} MiB): they "
                      "are kept on the host from now on and copied to the device per client and "
                      "round (slower, same numbers)")
        else:
            notice = None
        for client, state in states.items():
            if tensor_bytes(state):
                states[client] = host_tree(state)
        return notice
