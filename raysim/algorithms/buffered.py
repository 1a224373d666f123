"""Asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022) for FedAvg and FedProx:
a round is one server update from the clients in its buffer, each trained from the server
version current when it started (``raysim.system.fedbuff_clock``) and weighted by its
staleness s as (1 + s)^-exponent.

A stale client's trained model w_c (from base b_c) is uploaded rebased onto the current model
g, w_c + (g - b_c), so that its update w_c - b_c applies to g. With client weights a_c (sample
counts, or 1) and staleness weights s_c the server's target is

    X = (sum_c a_c s_c rebased_c + (sum_c a_c - sum_c a_c s_c) g) / sum_c a_c
      = g + sum_c a_c s_c (w_c - b_c) / sum_c a_c

and the new model g + server_lr (X - g) (X itself at server_lr 1). Without staleness (every
client from g, s_c = 1) X is FedAvg's weighted mean of the w_c to the bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from raysim.algorithms.aggregators import WeightedSum
from raysim.training.weights import FlatWeights, Weights, on_device

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

WEIGHT = "fedbuff_weight"
"""The ``clients`` column of each buffered client's staleness weight."""


def version_shifts(bases: Sequence[Weights], current: Weights, device: torch.device
                   ) -> torch.Tensor:
    """``current`` - ``base`` for each of ``bases`` (the shift of a start version), as the
    rows of one float64 matrix (the current model's float64 vector computed once)."""
    now = torch.as_tensor(on_device(current, device).vector).double()
    return torch.stack([now - torch.as_tensor(on_device(base, device).vector).double()
                        for base in bases])


def rebase_all(trained: Sequence[Weights], shifts: torch.Tensor, rows: Sequence[int],
               device: torch.device) -> list[FlatWeights]:
    """Each model in ``trained`` plus its shift ``shifts[rows[i]]`` (:func:`version_shifts`,
    one row per start version) in float64, cast back: stale clients' updates applied to the
    current model, in one operation on the stacked vectors."""
    models = [on_device(weights, device) for weights in trained]
    stacked = torch.stack([torch.as_tensor(model.vector) for model in models])
    index = torch.as_tensor(list(rows), device=shifts.device)
    rebased = (stacked.double() + shifts.index_select(0, index)).to(stacked.dtype)
    return [FlatWeights(row, model.layout, model.extras)
            for row, model in zip(rebased.unbind(0), models, strict=True)]


def train_buffered(runtime: ClientRuntime, clients: Sequence[int], round_: int,
                   message: dict[str, Any], proximal: Any) -> list[tuple[Weights, Any, float]]:
    """Train each client from its start version and rebase stale ones; returns (upload,
    outcome, staleness weight) per client in order. ``proximal(start)``: the proximal term for
    clients that start from ``start`` (FedProx: each client anchored at its own start
    version). Every client trains in one call."""
    buffered = message["fedbuff"]
    now = buffered["version"]
    index = np.searchsorted(buffered["clients"], clients)
    versions: list[int] = buffered["start_versions"][index].tolist()
    staleness_weights: list[float] = buffered["weights"][index].tolist()
    starts = runtime.versions_on_device(  # each version put on the device once per run
        {v: message["model"] if v == now else buffered["bases"][v]
         for v in sorted(set(versions) | {now})})
    terms = {version: proximal(start) for version, start in starts.items()}
    prox = None if terms[now] is None else (  # FedProx: anchored at the client's start
        [terms[version][0] for version in versions], terms[now][1])
    trained = runtime.train_many(clients, round_, [starts[v] for v in versions],
                                 [None] * len(clients), prox=prox)
    uploads = [weights for weights, _ in trained]
    stale = [i for i, version in enumerate(versions) if version != now]
    if stale:  # their updates onto the current model: w + (current - base), in float64
        stale_versions = sorted({versions[i] for i in stale})
        shifts = version_shifts([starts[v] for v in stale_versions], starts[now],
                                runtime.device)
        row = {version: k for k, version in enumerate(stale_versions)}
        rebased = rebase_all([uploads[i] for i in stale], shifts,
                             [row[versions[i]] for i in stale], runtime.device)
        for position, weights in zip(stale, rebased, strict=True):
            uploads[position] = weights
    return [(uploads[i], trained[i][1], staleness_weights[i]) for i in range(len(clients))]


def buffered_partial(models: Sequence[Weights], client_weights: Sequence[float],
                     staleness_weights: Sequence[float]) -> dict[str, Any]:
    """A group's partial: the sum of a_c s_c x upload, and the sum of a_c."""
    return {"model": WeightedSum.of(models, [a * s for a, s in zip(
        client_weights, staleness_weights, strict=True)]),
        "client_weight": float(sum(client_weights))}


def buffered_update(current: Weights, partials: Sequence[dict[str, Any]], server_lr: float
                    ) -> dict[str, np.ndarray]:
    """The new global model from the merged partial (see the module docstring)."""
    total: WeightedSum = partials[0]["model"]
    weight = partials[0]["client_weight"]
    rest = weight - total.total_weight
    if rest != 0:
        total = total.merge(WeightedSum.of([current], [rest]))
    total.total_weight = weight
    target = total.mean()
    if server_lr == 1.0:
        return target
    now = {name: np.asarray(value) for name, value in dict(current).items()}
    return {name: (now[name] + server_lr * (target[name] - now[name])).astype(
        target[name].dtype) if np.issubdtype(target[name].dtype, np.floating) else target[name]
        for name in target}
