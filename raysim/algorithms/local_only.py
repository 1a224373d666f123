"""Local-only training: every client trains its own model and never communicates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.engine.weights import Weights, get_weights, set_weights
from raysim.schema import StrictModel

if TYPE_CHECKING:
    from raysim.engine.runtime import ClientRuntime


class LocalOnlyParams(StrictModel):
    name: Literal["local"] = "local"


@register_algorithm
class LocalOnly(Algorithm):
    """Each client continues its own model (and optimizer state) from round to round; each
    model is evaluated on the client's own test share and on the global test set."""

    params_class = LocalOnlyParams
    personalized = True

    def local_work_scale(self) -> int:
        """Multiplier of the configured local steps (1: a client's own budget)."""
        return 1

    def client_update(self, runtime: ClientRuntime, client: int, round_: int,
                      message: dict[str, Any], state: Any) -> ClientResult:
        model = runtime.model
        weights, optimizer_state = state if state is not None else (runtime.initial_weights, None)
        set_weights(model, weights)
        outcome = runtime.train(model, client, round_, optimizer_state=optimizer_state,
                                steps_scale=self.local_work_scale())
        return ClientResult({}, (get_weights(model), outcome.optimizer_state), outcome.metrics())

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
