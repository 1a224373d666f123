"""A run's worker actors behind the round loop's :class:`~raysim.rounds.round_loop.Workers`
interface: each call becomes actor tasks, large broadcasts go into the object store once, the
partials of workers on one node other than the driver's merge on that node
(:mod:`raysim.engine.run.cluster_links`), and each round's hand-offs between nodes are
counted."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from raysim.engine.run import driver_turns as turns
from raysim.engine.run.cluster_links import (
    NodeBlock,
    PartialSize,
    RoundTransfers,
    Span,
    node_blocks,
    node_numbers,
    partial_size,
    serialized_bytes,
    transfer_rows,
)
from raysim.rounds.round_loop import RoundCallback, RoundLoop, RoundOutcome, RoundReply
from raysim.vectors.weights import payload_bytes

_INLINE_BYTES = 100 * 1024  # Ray inlines arguments below this size


@dataclass(frozen=True)
class Placement:
    """Where a run's workers and its driver are, and each worker's range of groups."""

    worker_nodes: Sequence[str]
    driver_node: str
    worker_spans: Mapping[int, Span]
    count: bool = False
    """Count the hand-offs on one node too (``engine.count_transfers``)."""


@dataclass
class _Round:
    """A started round: its replies, the node merges and what its broadcast weighed."""

    round: int
    replies: dict[int, Any]
    blocks: list[tuple[NodeBlock, Any]]
    broadcast_bytes: int
    broadcast_in_store: bool


class TransferRecords(RoundCallback):
    """Writes each recorded round's hand-offs (:class:`RayWorkers` counts them when its
    workers and driver span several nodes, or when asked) to the ``transfers`` table."""

    def __init__(self, workers: RayWorkers):
        self.workers = workers

    def tables(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, dict[str, Any]]:
        counted = self.workers.transfers
        rows = counted.pop(outcome.round, [])
        for earlier in [r for r in counted if r < outcome.round]:  # replayed rounds
            del counted[earlier]
        if not rows:
            return {}
        return {"transfers": {key: np.array([row[key] for row in rows]) for key in rows[0]}}


@dataclass
class RayWorkers:
    """The round loop's calls on a list of :class:`~raysim.engine.run.worker.ClientWorker`
    actors. ``transfers``: each round's ``transfers`` rows once collected (with a placement)."""

    actors: list[Any]
    placement: Placement | None = None
    transfers: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    def run_round(self, round_: int, message: dict[str, Any], work: dict[int, np.ndarray],
                  incoming: dict[int, list[Any]], moves: dict[int, np.ndarray],
                  audit: bool = False) -> _Round:
        """One ``run_round`` task per worker in ``work``, and a merge on each node with
        several of them; returns the futures."""
        # large broadcasts go into the object store once; small ones travel inline
        message_ref = ray.put(message) if payload_bytes(message) > _INLINE_BYTES else message
        counting = self.counting
        size = serialized_bytes(message) if counting else 0
        blocks = self._blocks(list(work))
        apart = {w for block in blocks for w in block.workers}
        replies, partials = {}, {}
        for w, clients in work.items():
            args = (round_, message_ref, clients, incoming.get(w, []), moves.get(w), audit,
                    counting)
            if w in apart:
                replies[w], partials[w] = self.actors[w].run_round_apart.remote(*args)
            else:
                replies[w] = self.actors[w].run_round.remote(*args)
        merges = [(block, self.actors[block.leader].merge_partials.remote(
            block.span, *[partials[w] for w in block.workers])) for block in blocks]
        return _Round(round_, replies, merges, size, message_ref is not message)

    def collect(self, handle: _Round) -> list[RoundReply]:
        """The replies in worker order; a node merge's roots go with its leader's reply."""
        replies = dict(zip(handle.replies, turns.get(list(handle.replies.values())),
                           strict=True))
        merged = turns.get([ref for _, ref in handle.blocks])
        merged_sizes: list[tuple[str, PartialSize]] = []
        for (block, _), (roots, sizes) in zip(handle.blocks, merged, strict=True):
            replies[block.leader] = dataclasses.replace(replies[block.leader], groups=roots)
            merged_sizes += [(block.node, size) for size in sizes]
        if self.counting:
            self._count(handle, replies, merged_sizes)
        return list(replies.values())

    def deliver(self, incoming: dict[int, list[Any]]) -> None:
        turns.get([self.actors[w].receive_states.remote(refs) for w, refs in incoming.items()])

    def snapshot_states(self) -> dict[int, Any]:
        client_states: dict[int, Any] = {}
        for states in turns.get([actor.snapshot_states.remote() for actor in self.actors]):
            client_states.update(states)
        return client_states

    @property
    def spans_nodes(self) -> bool:
        """Whether the driver and the workers are on more than one node."""
        placement = self.placement
        return placement is not None and len({*placement.worker_nodes,
                                              placement.driver_node}) > 1

    @property
    def counting(self) -> bool:
        """Whether the rounds' hand-offs are counted: on several nodes, or when asked
        (``engine.count_transfers``)."""
        return self.placement is not None and (self.placement.count or self.spans_nodes)

    def _blocks(self, busy: list[int]) -> list[NodeBlock]:
        if not self.spans_nodes:
            return []
        assert self.placement is not None
        return node_blocks(self.placement.worker_nodes, self.placement.driver_node,
                           self.placement.worker_spans, busy)

    def _count(self, handle: _Round, replies: dict[int, RoundReply],
               merged_sizes: list[tuple[str, PartialSize]]) -> None:
        """The round's hand-offs, by node number (0: the driver's)."""
        assert self.placement is not None
        nodes = self.placement.worker_nodes
        number = node_numbers(nodes, self.placement.driver_node)
        partials = [partial_size(number[nodes[w]], reply.groups)
                    for w, reply in replies.items() if reply.groups]
        relays = [(number[nodes[w]], number[nodes[destination]], states, size)
                  for w, reply in replies.items()
                  for destination, (states, size) in reply.outgoing_sizes.items()]
        merged = [dataclasses.replace(size, node=number[node]) for node, size in merged_sizes]
        self.transfers[handle.round] = transfer_rows(handle.round, RoundTransfers(
            handle.broadcast_bytes, handle.broadcast_in_store,
            [number[nodes[w]] for w in handle.replies], partials, merged, relays,
            sum(reply.moved_states for reply in replies.values())))
