"""Asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022) around an algorithm that
declares ``mean_uploads``: a round is one server update from the clients in its buffer, each
trained from the server version current when it started (``raysim.system.fedbuff_clock``) and
weighted by its staleness s as (1 + s)^-exponent.

A client c trained from the start version b_c into w_c; its update w_c - b_c applies to the
current model g. With client weights a_c (sample counts, or 1) and staleness weights s_c the
server's target is

    X = g + sum_c a_c s_c (w_c - b_c) / A,   A = sum_c a_c
      = (sum_c a_c s_c w_c - sum_{v != now} W_v b_v + (A - W_now) g) / A

where W_v = sum of a_c s_c over the clients that started from version v. The workers send the
first sum (a float64 weighted sum of the trained models), A and the W_v, merged along the
reduction tree like any partial; the server adds the start versions' share
(:func:`server_correction`; its state keeps the versions a later round starts clients from).

On a worker the layer calls the wrapped algorithm's ``local_updates`` once per start version,
with that version as the broadcast model (so FedProx's anchor is each client's own start), and
weighs each client's upload by its weight a_c (:attr:`~raysim.algorithms.base.ClientResult.
weight`) times its staleness weight s_c.
The new model is the wrapped algorithm's server step towards X (``server_step``): X itself for
plain averaging, or the step of a server optimizer layer inside this one
(:mod:`raysim.layers.server_optimizer`; ``system.server_lr`` is its SGD step,
g + server_lr (X - g)). Without staleness (every client from g, s_c = 1) W_now = A and X is
FedAvg's weighted mean of the w_c to the bit.

A trained model is never rebased on its worker (w_c + g - b_c for every stale client, in
float64: about 0.3-0.7 s a round per worker for a model of 1 M parameters, more than its
training); the server's subtraction costs one weighted sum of the round's few start versions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from raysim.layers.wrapped import Wrapped, root_of
from raysim.state_codec import persistable
from raysim.vectors.weighted_sum import WeightedSum
from raysim.vectors.weights import FlatWeights, Weights, on_device

if TYPE_CHECKING:
    from raysim.algorithms.base import ClientResult
    from raysim.system.plan import SystemPlan
    from raysim.training.runtime import ClientRuntime

MESSAGE = "fedbuff"
"""The broadcast entry with the round's start versions (simulation bookkeeping: a real client
downloads the model current when it starts)."""


@persistable
@dataclass
class BufferedState:
    """The server's model (the wrapped algorithm's state) and the global models of earlier
    versions that later rounds start clients from."""

    model: Any
    versions: dict[int, FlatWeights] = field(default_factory=dict)


class FedBuff(Wrapped):
    """Rounds of buffered, staleness-weighted updates from clients that started from earlier
    server versions. ``plan``: the simulated clock's plan (on the server; None on a worker,
    which reads each round's start versions from the broadcast)."""

    bookkeeping_broadcasts = (MESSAGE,)

    def __init__(self, inner: Any, plan: Callable[[], SystemPlan] | None = None):
        super().__init__(inner)
        (self.kind,) = inner.mean_uploads
        self.plan = plan
        self._weights: dict[int, tuple[float, float, int]] = {}
        """This round's clients on this worker: a_c, a_c s_c and start version (what
        :meth:`reduce` weighs their uploads by; set by :meth:`local_updates` of the same
        round, which may be called once for every group)."""
        self._round = -1

    # ----- server -----
    def _last_use(self) -> dict[int, int]:
        assert self.plan is not None, "the server's FedBuff layer holds the clock's plan"
        return self.plan().last_use

    def init_server_state(self, initial_weights: Weights) -> BufferedState:
        model = self.inner.init_server_state(initial_weights)
        return BufferedState(model, self._kept({}, model, 0))

    def inner_state(self, state: BufferedState) -> Any:
        return state.model

    def broadcast(self, state: BufferedState, round_: int) -> dict[str, Any]:
        assert self.plan is not None
        message = self.inner.broadcast(state.model, round_)
        clients, versions, staleness = self.plan().records.buffered(round_)
        message[MESSAGE] = {"starts": (clients, versions, staleness),
                            "bases": {int(v): state.versions[int(v)]
                                      for v in np.unique(versions) if v != round_}}
        return message

    def aggregate(self, state: BufferedState, partials: Sequence[Any],
                  round_: int) -> BufferedState:
        root = root_of(partials)
        if root is None:  # no client finished this round: the model stays
            return BufferedState(state.model, self._kept(state.versions, state.model,
                                                         round_ + 1))
        totals = BufferTotals(root["client_weight"], root["version_weights"])
        current = self.inner.global_weights(state.model)
        assert current is not None, "FedBuff wraps algorithms with a global model"
        correction = server_correction(current, totals, {
            v: state.versions[v] for v in totals.version_weights if v != round_}, round_)
        target = buffered_update(BufferedPartial(root[self.kind], totals, correction))
        model = self.inner.server_step(state.model, target)
        return BufferedState(model, self._kept(state.versions, model, round_ + 1))

    def _kept(self, versions: dict[int, FlatWeights], model: Any,
              version: int) -> dict[int, FlatWeights]:
        """The versions a round from ``version`` on still starts clients from: the kept ones
        whose last use is not over, and ``model`` (version ``version``) if a later round than
        its own starts clients from it (as one flat host vector)."""
        last_use = self._last_use()
        kept = {v: m for v, m in versions.items() if last_use.get(v, -1) >= version}
        if last_use.get(version, -1) > version:
            weights = self.inner.global_weights(model)
            assert weights is not None, "FedBuff wraps algorithms with a global model"
            kept[version] = on_device(weights, torch.device("cpu"))
        return kept

    # ----- clients -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        planned, start_versions, staleness_weights = message[MESSAGE]["starts"]
        index = np.searchsorted(planned, clients)
        versions, staleness = start_versions[index].tolist(), staleness_weights[index]
        results: dict[int, ClientResult] = {}
        for version in sorted(set(versions)):  # the wrapped algorithm, once per start version
            members = [i for i, v in enumerate(versions) if v == version]
            start = (message[self.kind] if version == round_
                     else message[MESSAGE]["bases"][version])
            trained = self.inner.local_updates(runtime, [clients[i] for i in members], round_,
                                               {**message, self.kind: start},
                                               [states[i] for i in members])
            results.update(zip(members, trained, strict=True))
        if round_ != self._round:
            self._weights, self._round = {}, round_
        self._weights.update({client: (results[i].weight, results[i].weight * staleness[i],
                                       versions[i]) for i, client in enumerate(clients)})
        return [results[i] for i in range(len(clients))]

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> dict[str, Any]:
        """A group's partial: the sum of a_c s_c x trained model, A and the W_v, each added
        in client order."""
        weights = [self._weights[client] for client, _ in results]
        by_version: dict[int, float] = {}
        for _, share, version in weights:
            by_version[version] = by_version.get(version, 0.0) + share
        return {self.kind: WeightedSum.of([r.upload[self.kind] for _, r in results],
                                          [share for _, share, _ in weights]),
                "client_weight": sum(weight for weight, _, _ in weights),
                "version_weights": by_version}


@dataclass(slots=True)
class BufferTotals:
    """A round's A, the sum of the trained clients' weights a_c (``client_weight``), and W_v,
    the sum of a_c s_c by start version v (``version_weights``), as the workers' partials
    (:meth:`FedBuff.reduce`) add them up along the reduction tree."""

    client_weight: float
    version_weights: dict[int, float]


def server_correction(current: Weights, totals: BufferTotals, bases: dict[int, Weights],
                      now: int) -> WeightedSum | None:
    """The start versions' share that the server's update of round ``now`` adds to the
    workers' sum, -sum_{v != now} W_v b_v + (A - W_now) g (see the module docstring), or None
    when there is nothing to add. It needs only the round's totals, the kept start versions
    ``bases`` and the current model ``current``: one weighted sum of the round's few start
    versions, never one per client."""
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
    the start versions' share (:func:`server_correction`)."""

    model: WeightedSum
    totals: BufferTotals
    correction: WeightedSum | None


def buffered_update(partial: BufferedPartial) -> FlatWeights:
    """X, the buffered mean (see the module docstring), from the merged partial and the start
    versions' share attached to it, as one flat vector: the wrapped algorithm's server step
    takes it as its target."""
    total = partial.model
    if partial.correction is not None:  # (the same bits as adding its terms here)
        total = total.merge(partial.correction)
    total.total_weight = partial.totals.client_weight
    return total.mean_flat()
