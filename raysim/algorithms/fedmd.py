"""FedMD (Li & Wang, 2019): model-heterogeneous FL by logit consensus on a public set.

The public set is carved from the clients' training data, as MH-pFLID's comparison does (each
client contributes ``public_per_client`` of its samples, drawn from the stream (seed,
"fedmd-public", client); the samples stay in its private data too). A round:

1. *Digest* (from round 1): each client trains its model for ``digest_epochs`` epochs on the
   public set towards the consensus, with KL(softmax(consensus / T) || softmax(logits / T)) * T^2;
2. *Revisit*: the client trains on its private data (``training``: optimizer, epochs, batch);
3. the client uploads its logits on the public set; the server averages them into the next
   consensus, which it broadcasts.

Models never leave the clients, so clients may run different architectures; each is evaluated
on its own test share (and the global test set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from raysim.algorithms.aggregators import WeightedSum, mean_partial, weighted_mean
from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.data.dataset import to_tensor
from raysim.engine.runtime import make_optimizer
from raysim.engine.weights import Weights, get_weights, set_weights
from raysim.errors import field_error
from raysim.schema import StrictModel
from raysim.seeding import numpy_rng

if TYPE_CHECKING:
    from raysim.engine.runtime import ClientRuntime


class FedMDParams(StrictModel):
    name: Literal["fedmd"] = "fedmd"
    public_per_client: int = Field(50, ge=1)
    """Samples each client contributes to the public set (all of them if it has fewer)."""
    digest_epochs: int = Field(1, ge=0)
    temperature: float = Field(1.0, gt=0)


def public_indices(client_indices: Sequence[np.ndarray], per_client: int, seed: int) -> np.ndarray:
    """Training-set indices of the public set: ``per_client`` seeded samples of each client."""
    picks = [numpy_rng(seed, "fedmd-public", client=c).permutation(indices)[:per_client]
             for c, indices in enumerate(client_indices)]
    return np.concatenate(picks)


@register_algorithm
class FedMD(Algorithm):
    """Digest the public consensus, revisit the private data, upload public logits."""

    params_class = FedMDParams
    personalized = True
    heterogeneous = True

    def __init__(self, params: FedMDParams, context: RunContext):
        super().__init__(params, context)
        if context.num_clients < 2:
            raise field_error("partition.num_clients", context.num_clients,
                              "FedMD needs at least 2 clients to form a consensus")
        self._public: torch.Tensor | None = None

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> Weights | None:
        return None  # no consensus before round 0

    def broadcast(self, state: Weights | None, round_: int) -> dict[str, Any]:
        return {} if state is None else {"consensus": state["logits"]}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        return mean_partial([{"logits": r.upload["logits"]} for _, r in results],
                            [1.0] * len(results), weighted=False)

    def aggregate(self, state: Weights | None, partials: Sequence[WeightedSum],
                  round_: int) -> Weights | None:
        return weighted_mean(partials) if partials else state

    # ----- client -----
    def _public_inputs(self, runtime: ClientRuntime) -> torch.Tensor:
        """The public set as normalised tensors on the worker's device (built once per worker)."""
        if self._public is None:
            indices = public_indices(runtime.client_indices, self.params.public_per_client,
                                     self.context.seed)
            self._public = to_tensor(runtime.train_x[indices], runtime.info).to(runtime.device)
        return self._public

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        public = self._public_inputs(runtime)
        results = []
        for client, state in zip(clients, states, strict=True):
            model = runtime.client_model(client)
            set_weights(model, runtime.client_initial_weights(client) if state is None else state[0])
            public_x = runtime.client_inputs(client, public)
            metrics: dict[str, float] = {}
            optimizer_state = None if state is None else state[1]
            if "consensus" in message and self.params.digest_epochs:
                metrics["digest_loss"], optimizer_state = self._digest(
                    runtime, model, client, round_, public_x, message["consensus"],
                    optimizer_state)
            outcome = runtime.train(model, client, round_, optimizer_state=optimizer_state)
            model.eval()
            with torch.no_grad():
                logits = model(public_x).float().cpu().numpy()
            results.append(ClientResult({"logits": logits},
                                        (get_weights(model), outcome.optimizer_state),
                                        {**outcome.metrics(), **metrics}))
        return results

    def _digest(self, runtime: ClientRuntime, model: torch.nn.Module, client: int, round_: int,
                public_x: torch.Tensor, consensus: np.ndarray, optimizer_state: Any
                ) -> tuple[float, dict[str, Any]]:
        """Train towards the consensus logits on the public set; returns (loss, optimizer)."""
        t = self.params.temperature
        optimizer = make_optimizer(model.parameters(), runtime.training.optimizer)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        target = torch.from_numpy(consensus).to(runtime.device)
        rows = torch.arange(len(public_x), device=runtime.device)
        model.train()

        def loss(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return F.kl_div(F.log_softmax(model(x) / t, dim=1),
                            F.log_softmax(target[index] / t, dim=1), reduction="batchmean",
                            log_target=True) * t * t

        mean_loss, _, _ = runtime.fit(client, round_, optimizer, loss,
                                      epochs=self.params.digest_epochs, stream="fedmd-digest",
                                      data=(public_x, rows))
        return mean_loss, optimizer.state_dict()

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
