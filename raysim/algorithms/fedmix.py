"""FedMix (Yoon, Shin, Hwang and Yang, "FedMix: Approximation of Mixup under Mean Augmented
Federated Learning", ICLR 2021): FedAvg whose clients also learn from the averaged data of
the others.

Mean augmented federated learning: each client averages its local data in groups of M
samples (images and one-hot labels; ``mash_size``, default all of its data into one) and
uploads these mashed samples once; the server keeps every client's and broadcasts the global
mashed set. A client then trains on the first-order approximation of mixup between its own
sample x_i (label y_i) and a mashed sample (x_m, y_m) drawn from the global set:

    loss = (1 - lam) CE(f((1 - lam) x_i), y_i) + lam CE(f((1 - lam) x_i), y_m)
           + lam < d l1 / du_i , x_m >,   l1 = (1 - lam) mean_i CE(f(u_i), y_i),
                                          u_i = (1 - lam) x_i

(the batch mean; the input-gradient term as the Flower baseline computes it), so no client
ever sees another's raw data. ``lam = 0`` is FedAvg. The
server averages the models (FedAvg's round).

What crosses is counted as it is sent: a client's mashed samples go up in the first round it
takes part in (``mashed`` in the communication table), and the global set goes down with the
model every round, as the Flower baseline sends it (``mashed`` down).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import Algorithm, ClientResult, register_algorithm
from raysim.algorithms.params import FedMixParams
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import StrictModel
from raysim.seeding import torch_generator
from raysim.state_codec import persistable
from raysim.training.client_fit import BatchLoss, fit_client
from raysim.vectors.weighted_sum import WeightedSum, merge_partials, weighted_mean
from raysim.vectors.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@persistable
@dataclass
class FedMixState:
    """The server's model and the mashed samples it received, by client."""

    model: Weights
    mashed: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    """{client: {"x": averaged inputs, "y": averaged one-hot labels}}."""


def mash(x: torch.Tensor, y: torch.Tensor, num_classes: int, size: int | None
         ) -> dict[str, np.ndarray]:
    """A client's mashed samples: the means of consecutive groups of ``size`` samples (all of
    them when None; a last group smaller than ``size`` is averaged too) of its inputs and
    one-hot labels."""
    group = len(x) if size is None else size
    one_hot = F.one_hot(y.long().reshape(-1), num_classes).to(torch.float32)
    starts = range(0, len(x), max(group, 1))
    inputs = torch.stack([x[s:s + group].to(torch.float32).mean(0) for s in starts])
    labels = torch.stack([one_hot[s:s + group].mean(0) for s in starts])
    return {"x": inputs.cpu().numpy(), "y": labels.cpu().numpy()}


def fedmix_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                mashed_x: torch.Tensor, mashed_y: torch.Tensor, lam: float) -> torch.Tensor:
    """FedMix's approximate mixup loss of a batch (x, y) paired with mashed samples
    (``mashed_x``, soft labels ``mashed_y``), one per sample: the module docstring's loss."""
    scaled = ((1 - lam) * x).detach().requires_grad_(True)
    logits = model(scaled)
    own = F.cross_entropy(logits, y)
    if lam == 0:
        return own
    mixed = F.cross_entropy(logits, mashed_y)
    # the input gradient of the batch's weighted own loss, as the Flower baseline takes it: a
    # per-sample gradient (the batch size times larger) leaves this linear term unbounded
    # below, and the local loss runs negative (docs/methods.md)
    (gradient,) = torch.autograd.grad((1 - lam) * own, scaled, create_graph=True)
    taylor = (gradient.flatten(1) * mashed_x.flatten(1)).sum(1).mean()
    return (1 - lam) * own + lam * mixed + lam * taylor


@register_algorithm
class FedMix(Algorithm[FedMixParams, FedMixState]):
    """FedAvg with FedMix's approximate mixup against the global mashed data in every
    client's local objective."""

    params_class: ClassVar[type[StrictModel]] = FedMixParams
    supports: ClassVar[Supports] = Supports(
        cross_entropy_only="FedMix's loss is cross-entropy against mixed soft labels",
        server_optimizers=False,
        privacy_refusal=("its mashed uploads are averages of a client's raw data, which client-level DP "
            "here does not clip or noise, so an epsilon would not cover them"),
        asynchronous_refusal="the global mashed set is collected in synchronous rounds",
        multi_label_refusal="its mixed term averages the one-hot labels of single-label samples")
    mean_uploads: ClassVar[tuple[str, ...]] = ()  # (the mashed uploads are no weight update)
    bookkeeping_broadcasts: ClassVar[tuple[str, ...]] = ("mashed_from",)
    per_client_loop: ClassVar[str | None] = (
        "its local objective differentiates each sample's loss with respect to its input")

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> FedMixState:
        return FedMixState(initial_weights)

    def broadcast(self, state: FedMixState, round_: int) -> dict[str, Any]:
        message: dict[str, Any] = {"model": state.model,
                                   "mashed_from": sorted(state.mashed)}
        if state.mashed:
            clients = sorted(state.mashed)
            message["mashed"] = {
                "x": np.concatenate([state.mashed[c]["x"] for c in clients]),
                "y": np.concatenate([state.mashed[c]["y"] for c in clients])}
        return message

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        return {"model": WeightedSum.of([r.upload["model"] for _, r in results],
                                        [r.weight for _, r in results]),
                "mashed": [(client, r.upload["mashed"]) for client, r in results
                           if "mashed" in r.upload]}

    def aggregate(self, state: FedMixState, partials: Sequence[Any],
                  round_: int) -> FedMixState:
        if not partials:
            return state
        merged = functools.reduce(merge_partials, partials)
        mashed = dict(state.mashed)
        mashed.update(dict(merged["mashed"]))
        return FedMixState(weighted_mean([merged["model"]]), mashed)

    def global_weights(self, state: FedMixState) -> Weights:
        return state.model

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        start, sent = message["model"], set(message.get("mashed_from", []))
        pool = message.get("mashed")
        mashed_x = mashed_y = None
        if pool is not None:
            mashed_x = torch.as_tensor(pool["x"]).to(runtime.device)
            mashed_y = torch.as_tensor(pool["y"]).to(runtime.device)
        lam = self.params.lam
        results = []
        for client in clients:
            draws = torch_generator(self.context.seed, "fedmix-pairs", round_, client)

            def objective(model: torch.nn.Module,
                          draws: torch.Generator = draws) -> BatchLoss:
                def batch_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
                    if mashed_x is None or mashed_y is None or lam == 0:  # (none yet: round 0)
                        return F.cross_entropy(model(inputs), targets)
                    picks = torch.randint(len(mashed_x), (len(inputs),), generator=draws)
                    picks = picks.to(mashed_x.device)
                    return fedmix_loss(model, inputs, targets, mashed_x[picks],
                                       mashed_y[picks], lam)

                return batch_loss

            fitted = fit_client(runtime, client, round_, start, objective)
            upload: dict[str, Any] = {"model": fitted.weights}
            if client not in sent:  # a client's mashed samples go up once
                x, y = runtime.client_data(client)
                upload["mashed"] = mash(x, y, self.context.info.num_classes,
                                        self.params.mash_size)
            results.append(ClientResult.trained(upload, None, fitted,
                                                self.client_weight(fitted.num_samples)))
        return results
