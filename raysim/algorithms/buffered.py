"""Asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022) for FedAvg and FedProx:
a round is one server update from the clients in its buffer, each trained from the server
version current when it started (``raysim.system.fedbuff_clock``) and weighted by its
staleness s as (1 + s)^-exponent.

A client c trained from the start version b_c into w_c; its update w_c - b_c applies to the
current model g. With client weights a_c (sample counts, or 1) and staleness weights s_c the
server's target is

    X = g + sum_c a_c s_c (w_c - b_c) / A,   A = sum_c a_c
      = (sum_c a_c s_c w_c - sum_{v != now} W_v b_v + (A - W_now) g) / A

where W_v = sum of a_c s_c over the clients that started from version v. The workers send the
first sum (a float64 weighted sum of the trained models, as FedAvg's) and the W_v; the server
subtracts the start versions' share in float64 (the driver keeps the versions).
The new model is g + server_lr (X - g) (X itself at server_lr 1). Without staleness (every
client from g, s_c = 1) W_now = A and X is FedAvg's weighted mean of the w_c to the bit.

A trained model is never rebased on its worker (w_c + g - b_c for every stale client, in
float64: about 0.3-0.7 s a round per worker for a model of 1 M parameters, more than its
training); the server's subtraction costs one weighted sum of the round's few start versions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.algorithms.aggregators import MergeablePartial, WeightedSum
from raysim.training.weights import Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

WEIGHT = "fedbuff_weight"
"""The ``clients`` column of each buffered client's staleness weight."""
VERSION = "fedbuff_start_version"
"""The ``clients`` column of the server version each buffered client trained from."""


def train_buffered(runtime: ClientRuntime, clients: Sequence[int], round_: int,
                   message: dict[str, Any], proximal: Any
                   ) -> list[tuple[Weights, Any, float, int]]:
    """Train each client from its start version; returns (trained model, outcome, staleness
    weight, start version) per client in order. ``proximal(start)``: the proximal term for
    clients that start from ``start`` (FedProx: each client anchored at its own start
    version). Every client trains in one call."""
    buffered = message["fedbuff"]
    now = buffered["version"]
    index = np.searchsorted(buffered["clients"], clients)
    versions: list[int] = buffered["start_versions"][index].tolist()
    staleness_weights: list[float] = buffered["weights"][index].tolist()
    starts = runtime.versions_on_device(  # each version put on the device once per run
        sorted(set(versions) | {now}), {**buffered["bases"], now: message["model"]},
        buffered["keep"])
    terms = {version: proximal(start) for version, start in starts.items()}
    prox = None if terms[now] is None else (  # FedProx: anchored at the client's start
        [terms[version][0] for version in versions], terms[now][1])
    trained = runtime.train_many(clients, round_, [starts[v] for v in versions],
                                 [None] * len(clients), prox=prox)
    return [(weights, outcome, weight, version) for (weights, outcome), weight, version
            in zip(trained, staleness_weights, versions, strict=True)]


@dataclass(slots=True)
class BufferedPartial(MergeablePartial):
    """A range of groups' partial: the sum of a_c s_c x trained model (``model``), the sum of
    a_c (``client_weight``) and W_v, the sum of a_c s_c by start version v
    (``version_weights``). On the driver the round loop attaches the models of the stale start
    versions (``bases``, from its history) before the update."""

    model: WeightedSum
    client_weight: float
    version_weights: dict[int, float]
    bases: dict[int, Weights] | None = None

    def merge(self, other: BufferedPartial) -> BufferedPartial:
        """Add the right neighbour's partial into this one (in place)."""
        self.model = self.model.merge(other.model)
        self.client_weight += other.client_weight
        shares = self.version_weights
        for version, weight in other.version_weights.items():
            shares[version] = shares[version] + weight if version in shares else weight
        return self

    def settle(self) -> None:
        self.model.settle()


def buffered_partial(models: Sequence[Weights], client_weights: Sequence[float],
                     staleness_weights: Sequence[float], versions: Sequence[int]
                     ) -> BufferedPartial:
    """A group's partial (:class:`BufferedPartial`) from its clients' trained models, weights
    a_c, staleness weights s_c and start versions."""
    weights: list[float] = []
    by_version: dict[int, float] = {}
    for client_weight, staleness, version in zip(client_weights, staleness_weights, versions,
                                                 strict=True):
        weight = client_weight * staleness
        weights.append(weight)
        by_version[version] = by_version[version] + weight if version in by_version else weight
    return BufferedPartial(WeightedSum.of(models, weights), float(sum(client_weights)),
                           by_version)


def buffered_update(current: Weights, partial: BufferedPartial, now: int, server_lr: float
                    ) -> dict[str, np.ndarray]:
    """The new global model of round ``now`` (the current version) from the merged partial and
    the stale start versions' models attached to it (see the module docstring)."""
    total, weight, bases = partial.model, partial.client_weight, partial.bases
    assert bases is not None, "the round loop attaches the stale start versions' models"
    shares = partial.version_weights
    stale = [version for version in sorted(shares) if version != now]
    models = [bases[version] for version in stale]
    factors = [-shares[version] for version in stale]
    rest = weight - shares.get(now, 0.0)
    if rest != 0:
        models, factors = [*models, current], [*factors, rest]
    if models:
        total = total.merge(WeightedSum.of(models, factors))
    total.total_weight = weight
    target = total.mean()
    if server_lr == 1.0:
        return target
    now_values = {name: np.asarray(value) for name, value in dict(current).items()}
    return {name: (now_values[name] + server_lr * (target[name] - now_values[name])).astype(
        target[name].dtype) if np.issubdtype(target[name].dtype, np.floating) else target[name]
        for name in target}
