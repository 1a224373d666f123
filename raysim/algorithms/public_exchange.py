"""The public-set exchange that FedMD, DS-pFL and KT-pFL share: clients with models of any
architecture train on their private data, upload their models' outputs on a public set and
train towards targets the server makes from them; models never leave the clients.

The public set is carved from the clients' training data, as MH-pFLID's comparison does
(:mod:`raysim.algorithms.public_set`). Before the first round each client runs the
transfer-learning step: ``pretrain_epochs`` epochs of cross-entropy on the labelled public
set (0 skips it). A round, on a client: *digest* (from the first round that has targets:
``digest_epochs`` epochs towards its target, :meth:`PublicSetExchange.digest_loss`), *revisit*
(its private data, ``training``), then its outputs on the public set
(:meth:`PublicSetExchange.public_outputs`) as its upload. What the server makes of the uploads
and which target each client gets is each method's own.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, RunContext
from raysim.algorithms.params import PublicSetParams
from raysim.algorithms.public_set import public_indices
from raysim.algorithms.supports import Supports
from raysim.data.dataset import to_tensor
from raysim.errors import field_error
from raysim.training.runtime import make_optimizer
from raysim.vectors.weighted_sum import WeightedSum, mean_partial, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

ParamsT = TypeVar("ParamsT", bound=PublicSetParams)
StateT = TypeVar("StateT")


class PublicSetExchange(Algorithm[ParamsT, StateT]):
    """Digest the server's target, revisit the private data, upload public outputs."""

    supports: ClassVar[Supports] = Supports(
        privacy_refusal=("its clients upload outputs on a public set, not weight updates, and no "
            "accountable mechanism for them is implemented"),
        multi_label_refusal=("its clients distil toward class scores on the public set, which have no "
            "per-label counterpart here"),
        heterogeneous=True)
    personalized = True

    def __init__(self, params: ParamsT, context: RunContext):
        super().__init__(params, context)
        if context.num_clients < 2:
            raise field_error("partition.num_clients", context.num_clients,
                              f"{type(self).__name__} needs at least 2 clients to exchange "
                              "knowledge")
        self._public: torch.Tensor | None = None
        self._public_rows = np.zeros(0, dtype=np.int64)

    # ----- client -----
    def _public_inputs(self, runtime: ClientRuntime) -> torch.Tensor:
        """The public set as normalised tensors on the worker's device (built once per worker)."""
        if self._public is None:
            self._public_rows = public_indices(runtime.client_indices,
                                               self.params.public_per_client, self.context.seed,
                                               self.context.public_rows)
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
            target = self.target_of(message, client)
            if target is not None and self.params.digest_epochs:
                metrics["digest_loss"], optimizer_state = self._digest(
                    runtime, model, client, round_, public_x, target, optimizer_state)
            outcome = runtime.train(model, client, round_, optimizer_state=optimizer_state)
            model.eval()
            with torch.no_grad():
                shared = self.public_outputs(model(public_x).float()).cpu().numpy()
            results.append(ClientResult.trained({"logits": shared},
                                                (get_weights(model), outcome.optimizer_state),
                                                outcome, **metrics))
        return results

    # ----- what a variant of the public-set exchange changes -----
    def target_of(self, message: dict[str, Any], client: int) -> np.ndarray | None:
        """What ``client`` digests towards this round (default: the consensus, one for all;
        None before the first)."""
        return message.get("consensus")

    def public_outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """What a client uploads of its model's outputs on the public set (default: the
        logits)."""
        return logits

    @abstractmethod
    def digest_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The digest's loss of a batch of public logits against their targets."""

    def _digest(self, runtime: ClientRuntime, model: torch.nn.Module, client: int, round_: int,
                public_x: torch.Tensor, consensus: np.ndarray, optimizer_state: Any
                ) -> tuple[float, dict[str, Any]]:
        """Train towards the client's target on the public set (:meth:`digest_loss`);
        returns (loss, optimizer)."""
        optimizer = make_optimizer(model.parameters(), runtime.training.optimizer)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        target = torch.from_numpy(consensus).to(runtime.device)
        rows = torch.arange(len(public_x), device=runtime.device)
        model.train()

        def loss(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
            return self.digest_loss(model(x), target[index])

        mean_loss, _, _ = runtime.fit(client, round_, optimizer, loss,
                                      epochs=self.params.digest_epochs, stream="fedmd-digest",
                                      data=(public_x, rows))
        return mean_loss, optimizer.state_dict()

    def personal_weights(self, state: Any) -> Weights | None:
        return None if state is None else state[0]


class MeanConsensus(PublicSetExchange[ParamsT, "Weights | None"]):
    """The server of FedMD and DS-pFL: one consensus for every client, made from the mean of
    the clients' public outputs (one vote each) by :meth:`consensus`."""

    def init_server_state(self, initial_weights: Weights) -> Weights | None:
        return None  # no consensus before round 0

    def broadcast(self, state: Weights | None, round_: int) -> dict[str, Any]:
        return {} if state is None else {"consensus": state["logits"]}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> WeightedSum:
        return mean_partial([{"logits": r.upload["logits"]} for _, r in results],
                            [1.0] * len(results), weighted=False)

    def aggregate(self, state: Weights | None, partials: Sequence[WeightedSum],
                  round_: int) -> Weights | None:
        if not partials:
            return state
        return {"logits": self.consensus(weighted_mean(partials)["logits"])}

    def consensus(self, mean: np.ndarray) -> np.ndarray:
        """The consensus from the mean of the uploads (default: the mean itself)."""
        return mean
