"""FedMD (Li & Wang, 2019): model-heterogeneous FL by logit consensus on a public set.

The public set is carved from the clients' training data, as MH-pFLID's comparison does
(:mod:`raysim.algorithms.public_set`). Before the first round each client runs FedMD's
transfer-learning step: ``pretrain_epochs`` epochs of cross-entropy on the labelled public set
(the paper trains "to convergence" on a large public dataset; 0 skips it), then its private
data (round 0's revisit). A round:

1. *Digest* (from round 1): each client trains its model for ``digest_epochs`` epochs on the
   public set towards the consensus logits: ``digest_loss: l1`` regresses the logits with the
   mean absolute error, as the authors' code does; ``mse`` squared error; ``kl`` distils
   KL(softmax(consensus / T) || softmax(logits / T)) * T^2 (raysim's earlier default);
2. *Revisit*: the client trains on its private data (``training``: optimizer, epochs, batch);
3. the client uploads its logits on the public set; the server averages them into the next
   consensus, which it broadcasts.

Models never leave the clients, so clients may run different architectures; each is evaluated
on its own test share (and the global test set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import FedMDParams
from raysim.algorithms.public_set import public_indices
from raysim.data.dataset import to_tensor
from raysim.errors import field_error
from raysim.training.runtime import make_optimizer
from raysim.vectors.weighted_sum import WeightedSum, mean_partial, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedMD(Algorithm[FedMDParams, Weights | None]):
    """Digest the public consensus, revisit the private data, upload public logits."""

    params_class = FedMDParams
    privacy_refusal: ClassVar[str] = (
        "its clients upload logits on a public set, not weight updates, and no accountable "
        "mechanism for them is implemented")
    multi_label_refusal = (
        "its clients distil toward the consensus of softmax class scores on the public set, "
        "which has no per-label counterpart here")
    personalized = True
    heterogeneous = True

    def __init__(self, params: FedMDParams, context: RunContext):
        super().__init__(params, context)
        if context.num_clients < 2:
            raise field_error("partition.num_clients", context.num_clients,
                              "FedMD needs at least 2 clients to form a consensus")
        self._public: torch.Tensor | None = None
        self._public_rows = np.zeros(0, dtype=np.int64)

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
            self._public_rows = public_indices(runtime.client_indices,
                                               self.params.public_per_client, self.context.seed)
            self._public = to_tensor(runtime.train_x[self._public_rows],
                                     runtime.info).to(runtime.device)
        return self._public

    def _pretrain(self, runtime: ClientRuntime, model: torch.nn.Module, client: int,
                  public_x: torch.Tensor, public_y: torch.Tensor) -> tuple[float, dict[str, Any]]:
        """FedMD's transfer-learning step: cross-entropy on the labelled public set."""
        optimizer = make_optimizer(model.parameters(), runtime.training.optimizer)
        model.train()
        mean_loss, _, _ = runtime.fit(
            client, 0, optimizer, lambda x, y: F.cross_entropy(model(x), y),
            epochs=self.params.pretrain_epochs, stream="fedmd-pretrain", data=(public_x, public_y))
        return mean_loss, optimizer.state_dict()

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
            if state is None and self.params.pretrain_epochs:
                metrics["pretrain_loss"], optimizer_state = self._pretrain(
                    runtime, model, client, public_x,
                    torch.from_numpy(runtime.train_y[self._public_rows]).to(runtime.device))
            if "consensus" in message and self.params.digest_epochs:
                metrics["digest_loss"], optimizer_state = self._digest(
                    runtime, model, client, round_, public_x, message["consensus"],
                    optimizer_state)
            outcome = runtime.train(model, client, round_, optimizer_state=optimizer_state)
            model.eval()
            with torch.no_grad():
                logits = model(public_x).float().cpu().numpy()
            results.append(ClientResult.trained({"logits": logits},
                                                (get_weights(model), outcome.optimizer_state),
                                                outcome, **metrics))
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
            logits = model(x)
            if self.params.digest_loss == "l1":
                return F.l1_loss(logits, target[index])
            if self.params.digest_loss == "mse":
                return F.mse_loss(logits, target[index])
            return F.kl_div(F.log_softmax(logits / t, dim=1),
                            F.log_softmax(target[index] / t, dim=1), reduction="batchmean",
                            log_target=True) * t * t

        mean_loss, _, _ = runtime.fit(client, round_, optimizer, loss,
                                      epochs=self.params.digest_epochs, stream="fedmd-digest",
                                      data=(public_x, rows))
        return mean_loss, optimizer.state_dict()

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]
