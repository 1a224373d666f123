"""The base of every layer: an algorithm object that holds another and passes every hook it
does not change on to it, with the wrapped algorithm's own server state inside its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from raysim.vectors.weighted_sum import merge_partials

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm
    from raysim.vectors.weights import Weights


class Wrapped:
    """Passes every attribute and hook it does not define to ``inner`` (class attributes such
    as ``personalized`` or ``relayed_uploads`` included). A layer whose server state holds the
    inner state defines :meth:`inner_state`; the server-side hooks that read a state
    (evaluation, the global weights) receive the inner one."""

    def __init__(self, inner: Algorithm[Any, Any] | Wrapped):
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def inner_state(self, state: Any) -> Any:
        """The wrapped algorithm's server state inside this layer's (default: the same)."""
        return state

    def global_weights(self, state: Any) -> Weights | None:
        return self.inner.global_weights(self.inner_state(state))

    def evaluation_models(self, state: Any) -> dict[str, Any]:
        return self.inner.evaluation_models(self.inner_state(state))

    def merge(self, left: Any, right: Any) -> Any:
        return merge_partials(left, right)


def root_of(partials: Sequence[Any]) -> Any:
    """The round's one partial, the reduction tree's root (the round loop hands ``aggregate``
    that root, or nothing when no client sent anything); None when there is none."""
    assert len(partials) <= 1, "the round loop hands aggregate the reduction tree's root"
    return partials[0] if partials else None
