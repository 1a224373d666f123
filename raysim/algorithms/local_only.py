"""Local-only training: every client trains its own model and never communicates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import CentralizedParams, LocalOnlyParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class LocalOnly(Algorithm[LocalOnlyParams | CentralizedParams, Weights]):
    """Each client continues its own model (and optimizer state) from round to round; each
    model is evaluated on the client's own test share and on the global test set. Clients may
    run different architectures (``clients.architectures``)."""

    params_class: ClassVar[type[StrictModel]] = LocalOnlyParams
    supports: ClassVar[Supports] = Supports(
        privacy_refusal="nothing leaves a client: its models are private by construction",
        heterogeneous=True, segmentation_refusal=None)
    personalized = True

    def local_work_scale(self) -> int:
        """Multiplier of the configured local steps (1: a client's own budget)."""
        return 1

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        starts = [runtime.client_initial_weights(c) if s is None else s[0]
                  for c, s in zip(clients, states, strict=True)]
        optimizer_states = [None if s is None else s[1] for s in states]
        trained = runtime.train_many(clients, round_, starts, optimizer_states,
                                     steps_scale=self.local_work_scale())
        return [ClientResult.trained({}, (weights, outcome.optimizer_state), outcome)
                for weights, outcome in trained]

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
