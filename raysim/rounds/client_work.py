"""One worker's share of a run's clients, without Ray: their local work in a round, the
reduce of each client group and the merge of the groups into the subtrees of the fixed
reduction tree, the client states kept between rounds and the states that move to another
worker. The engine's :class:`~raysim.engine.run.worker.ClientWorker` actor runs one of these
(and passes moved states through the object store); :class:`~raysim.rounds.in_process.
InProcessWorkers` runs several in one process.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from raysim.algorithms.contract import RunAlgorithm
from raysim.rounds.process_memory import resident_memory_mb
from raysim.rounds.round_loop import RoundReply
from raysim.training.resident_states import StateResidency
from raysim.training.runtime import ClientRuntime
from raysim.vectors.reduction_tree import subtree_roots
from raysim.vectors.weighted_sum import settle
from raysim.vectors.weights import payload_bytes

Guard = Callable[[str], AbstractContextManager[Any]]
"""Wraps a phase of the work (named by where it is, e.g. "in round 3") to translate errors,
e.g. a GPU running out of its share of memory."""

Audit = Callable[[int, dict[str, Any]], float]
"""The membership attack's AUC on one client's upload (``evaluation.membership_audit``)."""


class ClientWork:
    """The clients one worker holds, for one run."""

    def __init__(self, algorithm: RunAlgorithm, runtime: ClientRuntime, index: int,
                 guard: Guard = lambda where: nullcontext(), audit: Audit | None = None):
        self.algorithm = algorithm
        self.runtime = runtime
        self.index = index
        """This worker's place among the run's workers."""
        self.guard = guard
        self.audit = audit
        self.client_states: dict[int, Any] = {}
        self.residency = StateResidency(None)
        self.group_of: dict[int, int] = {}
        self.group_span = (0, 0)
        """[first, stop) of the contiguous client groups this worker holds."""

    def set_groups(self, clients: np.ndarray, groups: np.ndarray,
                   state_cap_bytes: int | None = None) -> None:
        """The fixed client group of each client held here (a contiguous range of groups),
        and how many bytes of client state the device keeps (None: no cap)."""
        self.group_of = dict(zip(clients.tolist(), groups.tolist(), strict=True))
        self.residency = StateResidency(state_cap_bytes)
        self.group_span = (int(groups.min()), int(groups.max()) + 1) if len(groups) else (0, 0)

    def run_round(self, round_: int, message: dict[str, Any], clients: np.ndarray,
                  incoming: list[dict[int, Any]] | None = None,
                  moves: np.ndarray | None = None, audit: bool = False) -> RoundReply:
        """Run the local work of the sampled ``clients`` (ascending ids) held here in one batch
        (per-client results do not depend on the batch), reduce each client group in client
        order, and merge the groups into the subtrees of the fixed reduction tree held here
        (one partial when the groups form an aligned block).

        ``incoming``: bundles of client states relayed here after the previous round.
        ``moves``: rows (client, destination client, destination worker) for every client state
        held here, applied after the local work; the reply's ``outgoing`` holds the states bound
        for other workers ({worker: {client: state}}).
        ``audit``: score every client's upload with the algorithm's membership attack.
        """
        self.receive(incoming or [])
        ids: list[int] = clients.tolist()
        groups: dict[int, list[int]] = defaultdict(list)
        for client in ids:
            groups[self.group_of[client]].append(client)
        started = time.perf_counter()
        with self.guard(f"in round {round_}"):
            updates = self.algorithm.local_updates(
                self.runtime, ids, round_, message, [self.client_states.get(c) for c in ids])
        seconds = (time.perf_counter() - started) / max(len(ids), 1)
        by_client = dict(zip(ids, updates, strict=True))
        bytes_up: dict[str, int] = defaultdict(int)
        for client, result in by_client.items():
            if result.state is not None:
                self.client_states[client] = result.state
            for kind, payload in result.upload.items():
                if kind not in self.algorithm.evaluation_uploads:
                    bytes_up[kind] += payload_bytes(payload)
        partials = {}
        for group, members in sorted(groups.items()):
            partial = self.algorithm.reduce([(c, by_client[c]) for c in members])
            if partial is not None:
                partials[group] = partial
        results = subtree_roots(partials, *self.group_span, self.algorithm.merge)
        settle(results)  # the sums read the clients' models, which move on below
        columns = _client_columns(ids, updates, seconds)
        if audit:
            assert self.audit is not None, "a run with the membership audit gives its attack"
            columns["mia_auc"] = np.array([self.audit(c, by_client[c].upload) for c in ids])
        outgoing, moved = self._apply_moves([] if moves is None else moves.tolist())
        notice = self.residency.keep(self.client_states)
        return RoundReply(results, columns, dict(bytes_up), outgoing, len(self.client_states),
                          resident_memory_mb(), notice, moved_states=moved)

    def receive(self, bundles: list[dict[int, Any]]) -> int:
        """Adopt client states relayed from other workers; returns how many arrived."""
        arrived = 0
        for bundle in bundles:
            self.client_states.update(bundle)
            arrived += len(bundle)
        return arrived

    def _apply_moves(self, moves: list[list[int]]) -> tuple[dict[int, dict[int, Any]], int]:
        """Move the client states as ``moves`` say; returns those bound for other workers
        and how many states moved."""
        leaving = {client: self.client_states.pop(client) for client, _, _ in moves
                   if client in self.client_states}
        outgoing: dict[int, dict[int, Any]] = defaultdict(dict)
        for client, destination, worker in moves:
            if client not in leaving:
                continue
            if worker == self.index:
                self.client_states[destination] = leaving[client]
            else:
                outgoing[worker][destination] = leaving[client]
        return dict(outgoing), len(leaving)


def _client_columns(ids: list[int], updates: list[Any], seconds: float
                    ) -> dict[str, np.ndarray]:
    """The round's ``clients`` columns of the clients trained here."""
    columns = {"client": np.array(ids, dtype=np.int64)}
    if any(u.train_loss is not None for u in updates):
        columns["train_loss"] = np.array([np.nan if u.train_loss is None else u.train_loss
                                          for u in updates], dtype=float)
    columns["num_samples"] = np.array([u.num_samples for u in updates], dtype=float)
    for key in dict.fromkeys(k for u in updates for k in u.metrics):
        columns[key] = np.array([u.metrics.get(key, np.nan) for u in updates], dtype=float)
    columns["train_seconds"] = np.full(len(ids), seconds)
    return columns
