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

from collections import defaultdict
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


def version_shift(base: Weights, current: Weights, device: torch.device) -> torch.Tensor:
    """``current`` - ``base`` as one float64 vector on the device (once per start version)."""
    start, now = on_device(base, device), on_device(current, device)
    return torch.as_tensor(now.vector).double() - torch.as_tensor(start.vector).double()


def rebase(trained: Weights, shift: torch.Tensor, device: torch.device) -> FlatWeights:
    """``trained`` + ``shift`` (:func:`version_shift`) in float64, cast back: a stale
    client's update applied to the current model."""
    model = on_device(trained, device)
    vector = torch.as_tensor(model.vector)
    return FlatWeights((vector.double() + shift).to(vector.dtype), model.layout, model.extras)


def train_buffered(runtime: ClientRuntime, clients: Sequence[int], round_: int,
                   message: dict[str, Any], proximal: Any) -> list[tuple[Weights, Any, float]]:
    """Train each client from its start version and rebase stale ones; returns (upload,
    outcome, staleness weight) per client in order. ``proximal(start)``: the proximal term for
    clients that start from ``start`` (FedProx: one training call per start version; without
    one, every client in one call)."""
    buffered = message["fedbuff"]
    current = message["model"]

    def start_of(client: int) -> Weights:
        version = buffered["start_version"][client]
        return current if version == buffered["version"] else buffered["bases"][version]

    by_version = proximal(current) is not None  # FedProx: each version its own anchor
    groups: dict[int, list[int]] = defaultdict(list)
    for position, client in enumerate(clients):
        groups[buffered["start_version"][client] if by_version else 0].append(position)
    shifts = {version: version_shift(base, current, runtime.device)
              for version, base in buffered["bases"].items()}
    results: list[Any] = [None] * len(clients)
    for positions in groups.values():
        members = [clients[i] for i in positions]
        starts = [start_of(c) for c in members]
        trained = runtime.train_many(members, round_, starts, [None] * len(members),
                                     prox=proximal(starts[0]))
        for position, (weights, outcome) in zip(positions, trained, strict=True):
            client = clients[position]
            version = buffered["start_version"][client]
            if version != buffered["version"]:  # stale: its update onto the current model
                weights = rebase(weights, shifts[version], runtime.device)
            results[position] = (weights, outcome, buffered["weights"][client])
    return results


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
