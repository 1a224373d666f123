"""What a run's algorithm and client runtime know about the run, and the data its clients
train on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raysim.configuration.schema import StrictModel, TrainingConfig
from raysim.data.dataset import DataInfo
from raysim.privacy.settings import DpSettings
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
    features: Mapping[str, Any] = field(default_factory=dict)
    """The run's features' resolved settings by config section (``privacy``: client-level
    DP's :class:`~raysim.privacy.settings.DpSettings`; ``system``: the simulated clock's;
    ``server_optimizer``: the server's step; ...), made once before the run by each feature
    (:mod:`raysim.layers.assembly`) and read back by its feature on the driver and on every
    worker; a section without settings is absent."""
    public_rows: tuple[int, int] | None = None
    """The training-set rows [start, stop) that no client holds, the dataset's public set
    (e.g. subjects kept out of every client), where it has one; the public-set methods draw
    theirs from it instead of from the clients' data."""

    @property
    def privacy(self) -> DpSettings | None:
        """Client-level DP's settings (``privacy:``), for the methods that privatise their own
        releases; None: off."""
        settings = self.features.get("privacy")
        assert settings is None or isinstance(settings, DpSettings)
        return settings

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
