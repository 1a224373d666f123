"""Where a run's objects cross between Ray nodes: the workers' order on the nodes, the blocks
of workers whose partials merge on their node, and the round's ledger of hand-offs.

On a cluster, every worker's partial (a float64 model-sized sum) would cross to the driver's
node. The workers of one node instead hold adjacent ranges of client groups
(:func:`worker_order`), so their subtrees of the fixed reduction tree merge on that node
(:class:`NodeBlock`, ``ClientWorker.merge_partials``) and the driver's node receives one partial
per node. The merges are those the driver would make (:mod:`raysim.vectors.reduction_tree`):
the bits do not depend on how many nodes or workers there are.

:func:`transfer_rows` counts what each round moves between nodes from the sizes of the objects
at each hand-off (the broadcast, the partials, the relayed client states); the driver writes
them to the ``transfers`` table.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]

LINKS = ("in", "out", "between", "local")
"""``in``: into the driver's node; ``out``: out of it; ``between``: from one worker node to
another; ``local``: within one node (no network)."""


def serialized_bytes(value: Any) -> int:
    """Bytes of ``value`` in the object store: its pickle (protocol 5) with the array buffers
    out of band, as Ray stores them (numpy data is not copied to measure it)."""
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return len(inband) + sum(buffer.raw().nbytes for buffer in buffers)


def worker_order(worker_nodes: Sequence[str], driver_node: str) -> list[int]:
    """Worker indices in the order their ranges of groups are assigned: the driver's node's
    workers first, then each other node's workers together (nodes in order of their first
    worker), so the workers of one node hold adjacent ranges."""
    nodes = node_numbers(worker_nodes, driver_node)
    return sorted(range(len(worker_nodes)), key=lambda w: (nodes[worker_nodes[w]], w))


def node_numbers(worker_nodes: Sequence[str], driver_node: str) -> dict[str, int]:
    """A number per node: 0 the driver's node, then the workers' nodes in order of first
    worker."""
    numbers = {driver_node: 0}
    for node in worker_nodes:
        numbers.setdefault(node, len(numbers))
    return numbers


@dataclass(frozen=True)
class NodeBlock:
    """Workers on one node other than the driver's, with adjacent ranges of groups, whose
    partials merge on that node (at the ``leader``) before crossing to the driver's node."""

    node: str
    workers: tuple[int, ...]
    span: Span

    @property
    def leader(self) -> int:
        return self.workers[0]


def node_blocks(worker_nodes: Sequence[str], driver_node: str,
                worker_spans: Mapping[int, Span], busy: Sequence[int]) -> list[NodeBlock]:
    """The blocks of this round's ``busy`` workers: maximal runs of workers (in group order) on
    one node other than the driver's, each worker's groups adjacent to the next's, of two or
    more workers (one worker's partial has nothing to merge with). Adjacency is checked, not
    assumed, so a restarted worker that landed elsewhere only makes its block smaller."""
    ranked = sorted((worker_spans[w], w) for w in busy if w in worker_spans)
    blocks: list[NodeBlock] = []
    run: list[tuple[Span, int]] = []

    def close() -> None:
        if len(run) > 1:
            blocks.append(NodeBlock(worker_nodes[run[0][1]], tuple(w for _, w in run),
                                    (run[0][0][0], run[-1][0][1])))
        run.clear()

    for span, worker in ranked:
        node = worker_nodes[worker]
        if run and (worker_nodes[run[-1][1]] != node or run[-1][0][1] != span[0]):
            close()
        if node != driver_node:
            run.append((span, worker))
    close()
    return blocks


def worker_spans(owner_of_group: Mapping[int, int]) -> dict[int, Span]:
    """[first group, stop) of each worker's contiguous range of groups."""
    spans: dict[int, Span] = {}
    for group, worker in owner_of_group.items():
        lo, hi = spans.get(worker, (group, group + 1))
        spans[worker] = (min(lo, group), max(hi, group + 1))
    return spans


def link(source: int, destination: int) -> str:
    """The link between two numbered nodes (0: the driver's)."""
    if source == destination:
        return "local"
    if destination == 0:
        return "in"
    return "out" if source == 0 else "between"


@dataclass(frozen=True)
class PartialSize:
    """A partial handed off: its node, bytes, the tree roots it holds and the bytes of its
    sums (a weighted sum's size does not grow with the clients it covers; the rest, e.g.
    concatenated lists, does)."""

    node: int
    bytes: int
    roots: int
    sum_bytes: int


def partial_size(node: int, subtrees: Sequence[Any]) -> PartialSize:
    """The :class:`PartialSize` of a list of subtree roots."""
    return PartialSize(node, serialized_bytes(list(subtrees)), len(subtrees),
                       sum(_sum_bytes(getattr(s, "partial", s)) for s in subtrees))


def _sum_bytes(partial: Any) -> int:
    from raysim.vectors.weighted_sum import WeightedSum

    if isinstance(partial, WeightedSum):
        return serialized_bytes(partial)
    if isinstance(partial, Mapping):
        return sum(_sum_bytes(value) for value in partial.values())
    if isinstance(partial, (int, float)):
        return 8
    return 0  # lists and other contents grow with the clients they cover


@dataclass
class RoundTransfers:
    """What one round handed off between processes, by node number (0: the driver's)."""

    broadcast_bytes: int
    broadcast_in_store: bool
    """One object-store object read by every worker (else inline in each task)."""
    receivers: list[int]
    """The node of every worker that took part."""
    partials: list[PartialSize]
    """Every partial the driver received."""
    merged: list[PartialSize]
    """Every worker partial handed to its node's merge."""
    relays: list[tuple[int, int, int, int]]
    """(source node, destination node, states, bytes) of every bundle of relayed client
    states."""
    moved_states: int = 0
    """Client states moved after the round (to a client on any worker)."""


COLUMNS = ("round", "kind", "source_node", "destination_node", "link", "bytes", "objects",
           "roots", "sum_bytes", "states")
"""The ``transfers`` table's columns: ``roots`` and ``sum_bytes`` for partials (tree roots,
and the bytes of weighted sums, which do not grow with the clients covered), ``states`` for
relays (client states; on a ``moved`` row, every state moved, relayed or not)."""


def transfer_rows(round_: int, transfers: RoundTransfers) -> list[dict[str, Any]]:
    """The round's ``transfers`` rows: one per (kind, source node, destination node) with the
    bytes and objects handed off. An object-store broadcast crosses to each node once (Ray
    pulls an object into a node's store once for all its readers); an inline one travels in
    every task."""
    totals: dict[tuple[str, int, int], list[int]] = {}

    def add(kind: str, source: int, destination: int, size: int, roots: int = 0,
            sums: int = 0, states: int = 0) -> None:
        entry = totals.setdefault((kind, source, destination), [0, 0, 0, 0, 0])
        for index, value in enumerate((size, 1, roots, sums, states)):
            entry[index] += value

    readers = sorted(set(transfers.receivers)) if transfers.broadcast_in_store \
        else transfers.receivers
    for node in readers:
        add("broadcast", 0, node, transfers.broadcast_bytes)
    for part in transfers.merged:
        add("partial", part.node, part.node, part.bytes, part.roots, part.sum_bytes)
    for part in transfers.partials:
        add("partial", part.node, 0, part.bytes, part.roots, part.sum_bytes)
    for source, destination, states, size in transfers.relays:
        add("relay", source, destination, size, states=states)
    rows = [{"round": round_, "kind": kind, "source_node": source,
             "destination_node": destination, "link": link(source, destination),
             "bytes": size, "objects": objects, "roots": roots, "sum_bytes": sums,
             "states": states}
            for (kind, source, destination), (size, objects, roots, sums, states)
            in totals.items()]
    if transfers.moved_states:
        rows.append({"round": round_, "kind": "moved", "source_node": 0, "destination_node": 0,
                     "link": "local", "bytes": 0, "objects": 0, "roots": 0, "sum_bytes": 0,
                     "states": transfers.moved_states})
    return rows
