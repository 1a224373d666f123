"""The base of every layer: an algorithm object that holds another and passes every hook of
the contract (:class:`~raysim.algorithms.contract.RunAlgorithm`) it does not change on to it,
with the wrapped algorithm's own server state inside its own. Every hook is written out, so
mypy checks a layer against the contract."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raysim.vectors.weighted_sum import merge_partials

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    from torch import nn

    from raysim.algorithms.base import ClientResult
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.training.context import RunContext
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import Weights


class Wrapped:
    """Passes every hook it does not override to ``inner``. A layer whose server state holds
    the inner state defines :meth:`inner_state`; the server-side hooks that read a state
    (evaluation, the global weights, the server step) receive the inner one. A layer that
    keeps a per-client state of its own around the inner one (e.g. compression's error
    feedback) defines :meth:`inner_client_state` and unwraps and wraps the states in its
    ``local_updates``; the hooks that read a client state receive the inner one."""

    def __init__(self, inner: RunAlgorithm):
        self.inner = inner

    def inner_state(self, state: Any) -> Any:
        """The wrapped algorithm's server state inside this layer's (default: the same)."""
        return state

    def inner_client_state(self, state: Any) -> Any:
        """The wrapped algorithm's client state inside this layer's (default: the same)."""
        return state

    # ----- what the wrapped algorithm is -----
    @property
    def context(self) -> RunContext:
        return self.inner.context

    @property
    def personalized(self) -> bool:
        return self.inner.personalized

    @property
    def server_holds_inputs(self) -> bool:
        return self.inner.server_holds_inputs

    @property
    def relayed_uploads(self) -> tuple[str, ...]:
        return self.inner.relayed_uploads

    @property
    def evaluation_uploads(self) -> tuple[str, ...]:
        return self.inner.evaluation_uploads

    @property
    def mean_uploads(self) -> tuple[str, ...]:
        return self.inner.mean_uploads

    @property
    def bookkeeping_broadcasts(self) -> tuple[str, ...]:
        return self.inner.bookkeeping_broadcasts

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> Any:
        return self.inner.init_server_state(initial_weights)

    def attach_server_inputs(self, train_x: np.ndarray,
                             client_indices: Sequence[np.ndarray]) -> None:
        self.inner.attach_server_inputs(train_x, client_indices)

    def broadcast(self, state: Any, round_: int) -> dict[str, Any]:
        return self.inner.broadcast(state, round_)

    def aggregate(self, state: Any, partials: Sequence[Any], round_: int) -> Any:
        return self.inner.aggregate(state, partials, round_)

    def server_step(self, state: Any, mean: Any) -> Any:
        return self.inner.server_step(state, mean)

    def global_weights(self, state: Any) -> Weights | None:
        return self.inner.global_weights(self.inner_state(state))

    def evaluation_models(self, state: Any) -> dict[str, Any]:
        return self.inner.evaluation_models(self.inner_state(state))

    def predict_many(self, runtime: ClientRuntime, models: dict[str, Any], x: np.ndarray,
                     sources: np.ndarray, batch_size: int
                     ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        return self.inner.predict_many(runtime, models, x, sources, batch_size)

    def shared_models(self) -> dict[str, nn.Module]:
        return self.inner.shared_models()

    def cost_table(self) -> pd.DataFrame:
        return self.inner.cost_table()

    def migration(self, round_: int) -> np.ndarray | None:
        return self.inner.migration(round_)

    def dp_releases(self, rounds_done: int) -> int:
        return self.inner.dp_releases(rounds_done)

    def personal_weights(self, state: Any) -> Weights | None:
        return self.inner.personal_weights(self.inner_client_state(state))

    def personal_base(self, state: Any) -> Weights | None:
        return self.inner.personal_base(self.inner_state(state))

    def compose_personal(self, state: Any, base: Weights | None) -> Weights | None:
        return self.inner.compose_personal(self.inner_client_state(state), base)

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        return self.inner.local_updates(runtime, clients, round_, message, states)

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return self.inner.reduce(results)

    def merge(self, left: Any, right: Any) -> Any:
        return merge_partials(left, right)

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        return self.inner.membership_scores(runtime, client, upload, x, y)


def root_of(partials: Sequence[Any]) -> Any:
    """The round's one partial, the reduction tree's root (the round loop hands ``aggregate``
    that root, or nothing when no client sent anything); None when there is none."""
    assert len(partials) <= 1, "the round loop hands aggregate the reduction tree's root"
    return partials[0] if partials else None
