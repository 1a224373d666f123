"""A worker's clients' training data, resident on the worker's device for the whole run.

The rows of every client the worker holds are copied to its device once, as stored (uint8
images, float32 tabular rows), and normalised on the device when a client's data is gathered
(:func:`~raysim.data.dataset.normalise`, the same operations as on the host). Rows that would
not fit the worker's memory cap stay on the host, with a notice, and are normalised there as
before.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from raysim.data.client_indices import ClientIndices
from raysim.data.dataset import DataInfo, normalise

CAP_ENV = "RAYSIM_RESIDENT_DATA_CAP_BYTES"
"""Overrides the cap (bytes) for tests: a tiny value forces the host fallback on any device."""
DEVICE_SHARE = 0.5
"""Share of a worker's GPU memory cap its resident data may take (the rest is for models,
client states and activations)."""
NORMALISED_CACHE_BYTES = 256 * 2**20
"""Clients' normalised inputs are kept (up to this many bytes per worker) after their first
use, so a client's data is gathered and normalised once per run instead of every round: on a
CPU in host memory, on a GPU within what the data's share of the worker's memory cap leaves
(:func:`normalised_cache_bytes`; the rows themselves stay uint8 there)."""


def normalised_cache_bytes(device: torch.device, cap_bytes: int | None, data_bytes: int) -> int:
    """Bytes of normalised inputs a worker keeps: :data:`NORMALISED_CACHE_BYTES`, and on a
    device with a cap for its data no more than the cap leaves beside the resident rows (the
    data never takes more than its share of the device's memory). On a GPU a client's gather
    and normalisation kernels took 5 % of the pfl shape's per-client loop in a profile on an
    H200; what keeping them saves there is not measured."""
    if device.type == "cpu" or cap_bytes is None:
        return NORMALISED_CACHE_BYTES
    return max(0, min(NORMALISED_CACHE_BYTES, cap_bytes - data_bytes))


class ResidentData:
    """Training rows of a set of clients on one device; :meth:`gather` returns a client's (or
    several clients') normalised inputs and labels there."""

    def __init__(self, train_x: np.ndarray, train_y: np.ndarray,
                 client_indices: Sequence[np.ndarray], clients: Sequence[int], info: DataInfo,
                 device: torch.device, cap_bytes: int | None):
        rows = np.unique(np.concatenate([client_indices[c] for c in clients])) if len(
            clients) else np.zeros(0, dtype=np.int64)
        self.info = info
        self.device = device
        self.nbytes = int(train_x[:1].nbytes) * len(rows) + int(train_y[:1].nbytes) * len(rows)
        override = os.environ.get(CAP_ENV)
        cap = int(override) if override else cap_bytes
        self.resident = cap is None or self.nbytes <= cap
        self.notice = None if cap is None or self.resident else (
            f"the training data of this worker's clients ({self.nbytes / 2**20:.1f} MiB) does "
            f"not fit its device memory cap ({cap / 2**20:.1f} MiB for data): it stays on the "
            "host and is copied to the device per client and round (slower, same numbers)")
        self._position = np.full(len(train_y), -1, dtype=np.int64)
        self._position[rows] = np.arange(len(rows))
        self._clients = ClientIndices.of(client_indices)
        self._held = np.zeros(len(self._clients), dtype=bool)
        self._held[np.asarray(clients, dtype=np.int64)] = True
        self._client_rows: torch.Tensor | None = None
        """Every client's row positions on the device, in the partition's flat order (-1 for
        rows not held): a held client's rows are a slice of it (one tensor, not one per
        client)."""
        self._normalised: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._normalised_rows: torch.Tensor | None = None
        """Every held row's normalised inputs, made at the first :meth:`gather` that the
        cache's budget allows (the vectorised path gathers many clients' rows every round)."""
        self._cache_left = normalised_cache_bytes(device, cap, self.nbytes) if self.resident \
            else 0
        if self.resident:
            self.x = torch.from_numpy(np.ascontiguousarray(train_x[rows])).to(device)
            self.y = torch.from_numpy(np.ascontiguousarray(train_y[rows])).to(device)
            self._client_rows = torch.from_numpy(self._position[self._clients.flat]).to(device)

    def holds(self, indices: np.ndarray) -> bool:
        """Whether every row of ``indices`` is on the device."""
        return self.resident and bool((self._position[indices] >= 0).all())

    def gather(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows ``indices`` (training-set positions) as normalised inputs and labels on
        the device (call :meth:`holds` first)."""
        local = torch.from_numpy(self._position[indices]).to(self.device)
        rows = self._all_normalised()
        if rows is not None:  # a gather of normalised rows: the same values, normalised once
            return rows.index_select(0, local), self.y.index_select(0, local)
        return normalise(self.x[local], self.info), self.y[local]

    def _all_normalised(self) -> torch.Tensor | None:
        """Every held row's normalised inputs, made once when the normalised cache's budget
        left holds them (else None: each gather normalises its rows): the vectorised path
        gathers all of a worker's sampled clients every round."""
        if self._normalised_rows is None and not self.info.stored_as_float:
            size = self.x.numel() * torch.finfo(torch.float32).bits // 8
            if size <= self._cache_left:
                self._normalised_rows = normalise(self.x, self.info)
                self._cache_left -= size
        return self._normalised_rows

    def client(self, client: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A held client's whole training set as normalised inputs and labels on the device
        (its row positions there computed once; the normalised tensors kept for the next
        rounds while :func:`normalised_cache_bytes` allow: treat them as read-only), or None
        for a client not held."""
        cached = self._normalised.get(client)
        if cached is not None:
            return cached
        if self._client_rows is None or not self._held[client]:
            return None
        offsets = self._clients.offsets
        local = self._client_rows[offsets[client]:offsets[client + 1]]
        data = normalise(self.x[local], self.info), self.y[local]
        size = data[0].numel() * data[0].element_size()
        if size <= self._cache_left:
            self._normalised[client] = data
            self._cache_left -= size
        return data

    def describe(self) -> dict[str, object]:
        """Where the data lives, for the run's manifest."""
        return {"data_on_device": self.resident, "data_mib": round(self.nbytes / 2**20, 2),
                **({"data_notice": self.notice} if self.notice else {})}


def data_cap_bytes(device: torch.device, gpu_cap_bytes: int | None) -> int | None:
    """The cap for a worker's resident data: a share of its GPU memory cap on a GPU, none on
    the CPU (the rows are in host memory either way)."""
    if device.type != "cuda":
        return None
    if gpu_cap_bytes is None:
        gpu_cap_bytes = torch.cuda.get_device_properties(device).total_memory
    return int(DEVICE_SHARE * gpu_cap_bytes)
