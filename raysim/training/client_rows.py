"""A worker's clients' training rows: the arrays (zero-copy from the object store), each
client's rows of them, a resident copy on the device where it fits, and each client's inputs
at its own resolution."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from raysim.data.dataset import DataInfo, to_tensor
from raysim.training.context import ClientData
from raysim.training.resident_data import ResidentData


def downsample_images(x: torch.Tensor, factor: int) -> torch.Tensor:
    """Images average-pooled by ``factor`` (``clients.downsample``; 1: unchanged)."""
    return F.avg_pool2d(x, factor, ceil_mode=True) if factor > 1 else x


class ClientRows:
    """The clients' training data on one worker (a part of
    :class:`~raysim.training.runtime.ClientRuntime`)."""

    def __init__(self, data: ClientData, info: DataInfo, device: torch.device,
                 downsample: tuple[int, ...]):
        self.info = info
        self.device = device
        self.train_x = data.train_x
        self.train_y = data.train_y
        self.client_indices = data.client_indices
        self.downsample = downsample
        self.resident: ResidentData | None = None
        """The worker's clients' training rows on the device (:meth:`keep_rows_on_device`),
        else None."""

    def keep_rows_on_device(self, clients: Sequence[int], cap_bytes: int | None = None
                            ) -> dict[str, object]:
        """Put the training rows of ``clients`` (the worker's) on the device for the run,
        within ``cap_bytes`` (else they stay on the host, with a notice); returns where the
        data lives (:meth:`ResidentData.describe`)."""
        self.resident = None  # free the previous copy first
        self.resident = ResidentData(self.train_x, self.train_y, self.client_indices, clients,
                                     self.info, self.device, cap_bytes)
        return self.resident.describe()

    def gather(self, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Training rows ``indices`` as normalised inputs and labels on the device: from the
        resident copy when it holds them, else from the host arrays."""
        if self.resident is not None and self.resident.holds(indices):
            return self.resident.gather(indices)
        x = to_tensor(self.train_x[indices], self.info).to(self.device)
        return x, torch.from_numpy(self.train_y[indices]).to(self.device)

    def client_inputs(self, client: int, x: torch.Tensor) -> torch.Tensor:
        """Images as the client sees them: average-pooled by its ``clients.downsample``."""
        return downsample_images(x, self.downsample[client] if self.downsample else 1)

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A client's whole training set as normalised tensors on the worker's device."""
        held = self.resident.client(client) if self.resident is not None else None
        x, y = held if held is not None else self.gather(self.client_indices[client])
        return self.client_inputs(client, x), y

