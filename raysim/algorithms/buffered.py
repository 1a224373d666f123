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
first sum (a float64 weighted sum of the trained models, reduced as FedAvg's); the driver
computes A and the W_v with its plan of the rounds (:class:`BufferWeighting`, in the order
the reduction tree would add them) and the start versions' share in float64 while the
workers train (:func:`server_correction`; the driver keeps the versions), and adds it to the
workers' sum when their replies arrive.
The new model is g + server_lr (X - g) (X itself at server_lr 1). Without staleness (every
client from g, s_c = 1) W_now = A and X is FedAvg's weighted mean of the w_c to the bit.

A trained model is never rebased on its worker (w_c + g - b_c for every stale client, in
float64: about 0.3-0.7 s a round per worker for a model of 1 M parameters, more than its
training); the server's subtraction costs one weighted sum of the round's few start versions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.vectors.weighted_sum import WeightedSum
from raysim.vectors.weights import FlatWeights, Weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


def train_buffered(runtime: ClientRuntime, clients: Sequence[int], round_: int,
                   message: dict[str, Any], proximal: Any,
                   client_weights: Callable[[np.ndarray], np.ndarray]
                   ) -> tuple[list[tuple[Weights, Any]], RoundBuffer]:
    """Train each client from its start version (from the worker's part of the plan,
    ``runtime.buffer_schedule``, a :class:`~raysim.training.buffer_schedule.BufferSchedule`);
    returns (trained model, outcome) per client in order, and each client's a_c s_c (what the
    round's group partials weigh it by; ``client_weights``: the a_c of sample counts,
    :meth:`~raysim.algorithms.base.Algorithm.buffer_client_weights`). The message carries
    the round's model (version ``round_``) and, under ``fedbuff``, the ``bases``: start
    versions this worker does not keep.
    ``proximal(start)``: the proximal term for clients that start from ``start`` (FedProx:
    each client anchored at its own start version). Every client trains in one call."""
    schedule = runtime.buffer_schedule
    assert schedule is not None, "the driver sends FedBuff's schedule before the rounds"
    versions, staleness_weights = schedule.starts(round_, clients)
    starts = runtime.versions_on_device(  # each version put on the device once per run
        sorted(set(versions) | {round_}), {**message["fedbuff"]["bases"],
                                           round_: message["model"]},
        schedule.kept_after[round_])
    terms = {version: proximal(start) for version, start in starts.items()}
    prox = None if terms[round_] is None else (  # FedProx: anchored at the client's start
        [terms[version][0] for version in versions], terms[round_][1])
    trained = runtime.train_many(clients, round_, [starts[v] for v in versions],
                                 [None] * len(clients), prox=prox)
    sizes = np.array([outcome.num_samples for _, outcome in trained])
    weights = client_weights(sizes) * staleness_weights  # a_c s_c, once a round
    return trained, RoundBuffer(dict(zip(clients, weights.tolist(), strict=True)))


@dataclass(frozen=True, slots=True)
class RoundBuffer:
    """A worker's clients of one FedBuff round: each one's weight a_c s_c (its client weight
    times its staleness weight from the worker's
    :class:`~raysim.training.buffer_schedule.BufferSchedule`)."""

    weights: dict[int, float]

    def partial(self, clients: Sequence[int], models: Sequence[Weights]) -> WeightedSum:
        """A group's partial: the sum of a_c s_c x trained model, in client order."""
        weights = self.weights
        return WeightedSum.of(models, [weights[client] for client in clients])


@dataclass(slots=True)
class BufferTotals:
    """A round's A, the sum of the trained clients' weights a_c (``client_weight``), and W_v,
    the sum of a_c s_c by start version v (``version_weights``); the driver computes them
    (:class:`BufferWeighting`)."""

    client_weight: float
    version_weights: dict[int, float]


@dataclass(frozen=True)
class BufferWeighting:
    """What the driver computes each FedBuff round's totals from, with the clock's plan (in the
    planning thread, before the rounds): every client's weight a_c
    (:meth:`~raysim.algorithms.base.Algorithm.buffer_client_weights`) and client group (of
    the engine's fixed reduction tree, :mod:`raysim.vectors.reduction_tree`)."""

    client_weights: np.ndarray
    group_of_client: np.ndarray

    def totals(self, clients: np.ndarray, versions: np.ndarray, staleness: np.ndarray
               ) -> BufferTotals | None:
        """The round's totals from its trained clients (ascending) with their start versions
        and staleness weights (None: no client trained).

        Each sum adds the same numbers in the same order as the workers' group partials
        merged along the reduction tree would: per group in client order (``bincount`` adds
        its inputs in order), then pairwise up the tree's levels, left first (a group or
        version without clients adds an exact 0.0 where the tree would skip it)."""
        if not len(clients):
            return None
        groups = self.group_of_client[clients]
        client_weights = self.client_weights[clients]
        distinct, column = np.unique(versions, return_inverse=True)
        leaves = 1 << int(groups.max()).bit_length()  # the tree's width (a power of two)
        totals = np.bincount(groups, client_weights, minlength=leaves)
        shares = np.bincount(groups * len(distinct) + column, client_weights * staleness,
                             minlength=leaves * len(distinct)).reshape(leaves, len(distinct))
        while len(totals) > 1:
            totals, shares = totals[0::2] + totals[1::2], shares[0::2] + shares[1::2]
        return BufferTotals(float(totals[0]), dict(zip(distinct.tolist(), shares[0].tolist(),
                                                       strict=True)))


def server_correction(current: Weights, totals: BufferTotals, bases: dict[int, Weights],
                      now: int) -> WeightedSum | None:
    """The start versions' share that the server's update of round ``now`` adds to the
    workers' sum, -sum_{v != now} W_v b_v + (A - W_now) g (see the module docstring), computed
    now (None: nothing to add). It needs only the plan's totals, the kept start versions
    ``bases`` and the current model ``current``, so the driver computes it while the workers
    train, off the path between their replies and the next round's dispatch."""
    weight, shares = totals.client_weight, totals.version_weights
    stale = [version for version in sorted(shares) if version != now]
    models = [bases[version] for version in stale]
    factors = [-shares[version] for version in stale]
    rest = weight - shares.get(now, 0.0)
    if rest != 0:
        models, factors = [*models, current], [*factors, rest]
    return WeightedSum.of(models, factors).settle() if models else None


@dataclass(slots=True)
class BufferedPartial:
    """A round's reduced uploads as the server's update takes them: the sum of
    a_c s_c x trained model over the tree (``model``), the round's :class:`BufferTotals` and
    the start versions' share (:func:`server_correction`, computed while the workers
    trained)."""

    model: WeightedSum
    totals: BufferTotals
    correction: WeightedSum | None


def buffered_update(current: Weights, partial: BufferedPartial, server_lr: float
                    ) -> FlatWeights:
    """The new global model from the merged partial and the start versions' share attached to
    it (see the module docstring), as a host FlatWeights: the round loop keeps it as a start
    version and sums it again in one piece."""
    total = partial.model
    if partial.correction is not None:  # (the same bits as adding its terms here)
        total = total.merge(partial.correction)
    total.total_weight = partial.totals.client_weight
    target = total.mean_flat()
    if server_lr == 1.0:
        return target
    assert isinstance(target.vector, np.ndarray)
    now_vector = np.concatenate([np.asarray(current[name], dtype=np.float32).reshape(-1)
                                 for name, _ in target.layout]) if target.layout else \
        np.zeros(0, dtype=np.float32)
    # per value as g + lr (X - g) in float32 (the stored dtype); other entries as averaged
    return FlatWeights(now_vector + server_lr * (target.vector - now_vector), target.layout,
                       target.extras)
