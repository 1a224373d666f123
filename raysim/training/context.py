"""What a run's algorithm and client runtime know about the run, and the data its clients
train on."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raysim.data.dataset import DataInfo
from raysim.privacy.settings import DpSettings
from raysim.schema import ServerOptimizerConfig, StrictModel, TrainingConfig
from raysim.vectors.weights import Weights


@dataclass(frozen=True)
class RunContext:
    """What an algorithm knows about the run it belongs to."""

    seed: int
    info: DataInfo
    model: StrictModel
    training: TrainingConfig
    num_clients: int
    clients_per_round: int
    architectures: tuple[StrictModel, ...] = ()
    """Each client's architecture (empty: every client uses ``model``)."""
    downsample: tuple[int, ...] = ()
    """Each client's input downsampling factor (empty: none)."""
    memory_format: str = "auto"
    """``engine.memory_format``, for the models the server trains itself (see
    :func:`raysim.training.memory_format.place`)."""
    privacy: DpSettings | None = None
    """Client-level DP (``privacy:``), resolved before the run; None: off."""
    fedbuff_server_lr: float | None = None
    """Asynchronous buffered aggregation (``system.policy: fedbuff``; its ``system.server_lr``,
    which reaches the model as ``server_optimizer``'s SGD step); None: synchronous rounds."""
    server_optimizer: ServerOptimizerConfig | None = None
    """The server's step on the round's mean (``server_optimizer:``, or FedBuff's
    ``system.server_lr`` as an SGD step); None: the mean is the next model."""

    def architecture(self, client: int) -> StrictModel:
        """The architecture of one client."""
        return self.architectures[client] if self.architectures else self.model

    @property
    def heterogeneous(self) -> bool:
        """True when clients use more than one architecture."""
        return len({a.model_dump_json() for a in self.architectures}) > 1


@dataclass(frozen=True)
class ClientData:
    """The training data a worker's clients train on (zero-copy arrays from the object store)
    and the run's initial model."""

    train_x: np.ndarray
    train_y: np.ndarray
    client_indices: Sequence[np.ndarray]
    """Each client's rows of the training set."""
    initial_weights: Weights
