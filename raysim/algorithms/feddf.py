"""FedDF (Lin et al., NeurIPS 2020): ensemble distillation for model fusion, with heterogeneous
clients (the paper's Algorithm 3).

Clients that share an architecture and input resolution form a *prototype group*. A round:

1. every sampled client starts from its group's server model (round 0: its architecture's
   initial weights), trains on its private data (``training``: optimizer, epochs, batch) and
   uploads its weights and its logits on the public set;
2. the server averages each group's uploads (FedAvg, sample-weighted, BatchNorm buffers
   included) and takes the ensemble teacher as the plain mean of every client's logits
   (AVGLOGITS, across all groups);
3. the server distils each group's average towards the teacher on the unlabelled public set:
   ``distillation_steps`` Adam steps (``distillation_lr``) on batches of
   ``distillation_batch_size``, loss KL(softmax(teacher / T) || softmax(student / T)) * T^2.

Under ``privacy`` (local mode only) a client uploads only its weights, clipped and noised
against the model it started from (:meth:`FedDF.dp_reference`); the server computes every
upload's logits itself (post-processing of the noised weights) and averages with one vote
each. Each client's personal model never leaves it.

The public set is carved from the clients' training data (:mod:`raysim.algorithms.public_set`)
and used without labels. FedDF has no personal models: what a client is evaluated with, on its own
test share, is its group's distilled model as the round's broadcast brought it (the server's
model after the previous round; a group's first round: its architecture's initial weights).

pFedDF (``name: pfeddf``) is FedDF with a personalization step, the "+FT" reading of
MH-pFLID's baseline (Collins et al., NeurIPS 2022: fine-tune the global model on each client's
own data): each client is evaluated with its group's distilled model after the round's local
training on its own data, which is that fine-tuning. Everything else, uploads included, is
FedDF's; the two differ only in which model a client keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.base import Algorithm, ClientResult, RunContext, register_algorithm
from raysim.algorithms.params import EnsembleDistillationParams, FedDFParams, PFedDFParams
from raysim.algorithms.public_set import public_indices
from raysim.algorithms.supports import Supports
from raysim.data.dataset import to_tensor
from raysim.errors import field_error
from raysim.models import build_model
from raysim.privacy.uploads import privatize_uploads
from raysim.seeding import torch_generator
from raysim.training.client_rows import downsample_images
from raysim.training.memory_format import place
from raysim.vectors.weighted_sum import mean_partial, weighted_mean
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedDF(Algorithm[EnsembleDistillationParams, dict[str, Weights]]):
    """Per-group FedAvg, then server-side distillation of each group towards the ensemble;
    each client is evaluated with its group's distilled model."""

    params_class: ClassVar[type[EnsembleDistillationParams]] = FedDFParams
    supports: ClassVar[Supports] = Supports(
        private_releases=("its clients release their trained models, each clipped and noised against the "
            "model it started from"),
        central_privacy_refusal=("the server distils towards the ensemble of every client's own model "
            "(their logits on the public set), and central noise protects only a sum of models"),
        multi_label_refusal=("its server distils the ensemble's softmax class scores (KL between class "
            "distributions), which has no per-label counterpart here"),
        heterogeneous=True)
    personalized = True
    server_holds_inputs = True

    @property
    def weights_by_samples(self) -> bool:
        """Sample-weighted means (``weighted``), but one vote each under client-level DP:
        the released models' sensitivity is bounded per client."""
        return super().weights_by_samples and self.context.privacy is None

    def __init__(self, params: FedDFParams, context: RunContext):
        super().__init__(params, context)
        if context.num_clients < 2:
            raise field_error("partition.num_clients", context.num_clients,
                              "FedDF needs at least 2 clients to form an ensemble")
        keys = [(context.architecture(c).model_dump_json(),
                 context.downsample[c] if context.downsample else 1)
                for c in range(context.num_clients)]
        order = list(dict.fromkeys(keys))
        self.group_of_client = [order.index(key) for key in keys]
        self._public: torch.Tensor | None = None  # the public inputs, normalised
        self._server_models: dict[str, nn.Module] = {}  # per group, for _server_logits

    def _group_key(self, client: int) -> str:
        return str(self.group_of_client[client])

    def _public_rows(self, client_indices: Sequence[np.ndarray]) -> np.ndarray:
        return public_indices(client_indices, self.params.public_per_client, self.context.seed,
                              self.context.public_rows)

    # ----- server -----
    def attach_server_inputs(self, train_x: np.ndarray,
                             client_indices: Sequence[np.ndarray]) -> None:
        self._public = to_tensor(train_x[self._public_rows(client_indices)], self.context.info)

    def init_server_state(self, initial_weights: Weights) -> dict[str, Weights]:
        return {}  # group -> distilled model; clients start from their initial weights

    def broadcast(self, state: dict[str, Weights], round_: int) -> dict[str, Any]:
        return {"models": state} if state else {}

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> list[dict[str, Any]]:
        return [{"client": client, "samples": result.num_samples, **result.upload}
                for client, result in results]

    def aggregate(self, state: dict[str, Weights], partials: Sequence[list[dict[str, Any]]],
                  round_: int) -> dict[str, Weights]:
        uploads = [u for partial in partials for u in partial]
        if not uploads:
            return state
        logits = [u["logits"] if "logits" in u else self._server_logits(u["client"], u["model"])
                  for u in uploads]
        teacher = torch.from_numpy(np.mean(logits, axis=0))
        weighted = self.weights_by_samples
        models = dict(state)
        for group in sorted({self.group_of_client[u["client"]] for u in uploads}):
            members = [u for u in uploads if self.group_of_client[u["client"]] == group]
            average = weighted_mean([mean_partial([u["model"] for u in members],
                                                  [u["samples"] for u in members],
                                                  weighted)])
            models[str(group)] = self._distill(members[0]["client"], average, teacher, round_,
                                               group)
        return models

    def _server_logits(self, client: int, model: Weights) -> np.ndarray:
        """A client's uploaded model's logits on the public set, computed by the server (under
        ``privacy``: the upload is the client's noised model, so its logits are
        post-processing of a private release)."""
        key = self._group_key(client)
        if key not in self._server_models:
            self._server_models[key] = place(
                build_model(self.context.architecture(client), self.context.info),
                torch.device("cpu"), self.context.memory_format)
        module = self._server_models[key]
        set_weights(module, model)
        return _public_logits(module, self._public_inputs(client))

    def _public_inputs(self, client: int) -> torch.Tensor:
        """The server's public inputs at the resolution of ``client``'s group."""
        if self._public is None:
            raise RuntimeError("FedDF's server has no public set: attach_server_inputs was "
                               "not called")
        return downsample_images(self._public,
                                 self.context.downsample[client] if self.context.downsample else 1)

    def _distill(self, client: int, start: Weights, teacher: torch.Tensor, round_: int,
                 group: int) -> Weights:
        """Distil one group's averaged model towards the ensemble's logits on the public set."""
        p = self.params
        inputs = self._public_inputs(client)
        student = place(build_model(self.context.architecture(client), self.context.info),
                        torch.device("cpu"), self.context.memory_format)
        set_weights(student, start)
        if p.distillation_steps == 0:
            return start
        optimizer = torch.optim.Adam(student.parameters(), lr=p.distillation_lr)
        generator = torch_generator(self.context.seed, "feddf-distill", round_, group)
        t = p.temperature
        student.train()
        for _ in range(p.distillation_steps):
            batch = torch.randint(len(inputs), (min(p.distillation_batch_size, len(inputs)),),
                                  generator=generator)
            loss = F.kl_div(F.log_softmax(student(inputs[batch]) / t, dim=1),
                            F.log_softmax(teacher[batch] / t, dim=1), reduction="batchmean",
                            log_target=True) * t * t
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return get_weights(student)

    # ----- client -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        public = None  # the public inputs on the device, for the logits (none under DP)
        if self.context.privacy is None:
            if self._public is None:
                self._public = to_tensor(
                    runtime.train_x[self._public_rows(runtime.client_indices)], runtime.info)
            public = self._public.to(runtime.device)
        results = []
        for client in clients:
            model = runtime.client_model(client)
            received = self.dp_reference(runtime, message, client)  # the model it starts from
            set_weights(model, received)
            outcome = runtime.train(model, client, round_)
            weights = get_weights(model)
            upload: dict[str, Any] = {"model": weights}
            if public is not None:  # under DP the server computes the logits
                upload["logits"] = _public_logits(model, runtime.client_inputs(client, public))
            kept = self.kept_model(received, weights)
            results.append(ClientResult.trained(upload, kept, outcome))
        privacy = self.context.privacy
        if privacy is not None:  # its own DP: each released model clipped and noised
            privatize_uploads(list(zip(clients, results, strict=True)), ("model",),
                              lambda kind, client: self.dp_reference(runtime, message, client),
                              message, privacy, self.context.seed, round_, runtime.device)
        return results

    def dp_reference(self, runtime: ClientRuntime, message: dict[str, Any],
                     client: int) -> Weights:
        """The model the client started from: its group's distilled model, or in the group's
        first round its architecture's initial weights (both known to the server)."""
        start = message.get("models", {}).get(self._group_key(client))
        return runtime.client_initial_weights(client) if start is None else start

    def kept_model(self, received: Weights, trained: Weights) -> Weights:
        """The model a client keeps and is evaluated with: FedDF's is its group's distilled
        model as received (no personalization)."""
        return received

    def personal_weights(self, state: Any) -> Weights | None:
        return state


@register_algorithm
class PFedDF(FedDF):
    """FedDF with a personalization step: each client keeps, and is evaluated with, its
    group's distilled model fine-tuned by the round's local training on its own data."""

    params_class: ClassVar[type[EnsembleDistillationParams]] = PFedDFParams

    def kept_model(self, received: Weights, trained: Weights) -> Weights:
        """The distilled model after local training on the client's own data."""
        return trained


def _public_logits(model: nn.Module, inputs: torch.Tensor) -> np.ndarray:
    """A model's float32 logits on the public inputs, in eval mode (the model stays so)."""
    model.eval()
    with torch.no_grad():
        return model(inputs).float().cpu().numpy()  # type: ignore[no-any-return]
