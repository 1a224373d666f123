"""The algorithm contract as a type: every hook and flag the round loop, the workers, the
evaluation and the layers use of a run's algorithm object. A registered
:class:`~raysim.algorithms.base.Algorithm` satisfies it, and so does every layer around one
(:class:`~raysim.layers.wrapped.Wrapped`), which mypy checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from torch import nn

    from raysim.algorithms.base import ClientResult
    from raysim.training.context import RunContext
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import Weights


class RunAlgorithm(Protocol):
    """A run's algorithm object, as the engine uses it (see the hooks' documentation on
    :class:`~raysim.algorithms.base.Algorithm`)."""

    @property
    def context(self) -> RunContext: ...

    @property
    def personalized(self) -> bool: ...

    @property
    def server_holds_inputs(self) -> bool: ...

    @property
    def relayed_uploads(self) -> tuple[str, ...]: ...

    @property
    def evaluation_uploads(self) -> tuple[str, ...]: ...

    @property
    def mean_uploads(self) -> tuple[str, ...]: ...

    @property
    def bookkeeping_broadcasts(self) -> tuple[str, ...]: ...

    def init_server_state(self, initial_weights: Weights) -> Any: ...

    def attach_server_inputs(self, train_x: np.ndarray,
                             client_indices: Sequence[np.ndarray]) -> None: ...

    def broadcast(self, state: Any, round_: int) -> dict[str, Any]: ...

    def aggregate(self, state: Any, partials: Sequence[Any], round_: int) -> Any: ...

    def server_step(self, state: Any, mean: Any) -> Any:
        """``mean``: the round's mean model, or {upload: mean} for several mean uploads."""

    def global_weights(self, state: Any) -> Weights | None: ...

    def evaluation_models(self, state: Any) -> dict[str, Any]: ...

    def predict_many(self, runtime: ClientRuntime, models: dict[str, Any], x: np.ndarray,
                     sources: np.ndarray, batch_size: int
                     ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]: ...

    def shared_models(self) -> dict[str, nn.Module]: ...

    def cost_table(self) -> pd.DataFrame: ...

    def migration(self, round_: int) -> np.ndarray | None: ...

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]: ...

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any: ...

    def dp_releases(self, rounds_done: int) -> int: ...

    def merge(self, left: Any, right: Any) -> Any: ...

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None: ...

    def personal_weights(self, state: Any) -> Weights | None: ...

    def personal_base(self, state: Any) -> Weights | None: ...

    def compose_personal(self, state: Any, base: Weights | None) -> Weights | None: ...
