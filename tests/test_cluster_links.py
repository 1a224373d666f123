"""The node merge's arithmetic: the workers of one node get adjacent groups, their subtrees
merge into the node's with the driver's merges (same bits for any split), blocks never join
workers whose groups are not adjacent, and each round's hand-offs are counted by link."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raysim.engine.run.cluster_links import (
    COLUMNS,
    PartialSize,
    RoundTransfers,
    link,
    node_blocks,
    partial_size,
    transfer_rows,
    worker_order,
    worker_spans,
)
from raysim.vectors.reduction_tree import Subtree, combine, merge_subtrees, subtree_roots
from raysim.vectors.weighted_sum import WeightedSum, merge_partials


def _partials(groups: int, seed: int) -> dict[int, WeightedSum]:
    rng = np.random.default_rng(seed)
    return {g: WeightedSum.of([{"w": rng.standard_normal(64).astype(np.float32)}],
                              [float(rng.integers(1, 9))])
            for g in range(groups) if rng.random() > 0.2}


@pytest.mark.parametrize("seed", range(6))
def test_node_merges_give_the_bits_of_the_driver_merging_every_worker(seed):
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(5, 40))
    partials = _partials(groups, seed)
    cuts = sorted({0, groups, *rng.integers(1, groups, size=int(rng.integers(1, 6))).tolist()})
    workers = list(itertools.pairwise(cuts))
    per_worker = [subtree_roots(partials, lo, hi, merge_partials) for lo, hi in workers]
    reference = combine([s for roots in per_worker for s in roots], merge_partials)
    # adjacent workers grouped into "nodes" at random: each node merges its workers' subtrees
    node_cuts = sorted({0, len(workers), *rng.integers(1, len(workers) + 1, size=2).tolist()})
    merged = []
    for a, b in itertools.pairwise(node_cuts):
        if a == b:
            continue
        span = (workers[a][0], workers[b - 1][1])
        merged += merge_subtrees([s for roots in per_worker[a:b] for s in roots], *span,
                                 merge_partials)
    assert len(merged) <= len([s for roots in per_worker for s in roots])
    result = combine(merged, merge_partials)
    assert result.total_weight == reference.total_weight
    assert np.array_equal(result.vector.numpy(), reference.vector.numpy())


def test_workers_of_a_node_are_ordered_together_after_the_drivers_node():
    nodes = ["b", "a", "c", "b", "a", "c"]
    assert worker_order(nodes, "a") == [1, 4, 0, 3, 2, 5]


def test_blocks_join_only_adjacent_busy_workers_on_one_node_other_than_the_drivers():
    nodes = ["d", "x", "x", "y", "x"]
    spans = worker_spans({0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 4})
    assert spans == {0: (0, 1), 1: (1, 2), 2: (2, 3), 3: (3, 4), 4: (4, 6)}
    blocks = node_blocks(nodes, "d", spans, busy=[0, 1, 2, 3, 4])
    # worker 4 is on node x too, but its groups are not next to 1-2's (a restarted worker)
    assert [(b.node, b.workers, b.span) for b in blocks] == [("x", (1, 2), (1, 3))]
    assert node_blocks(nodes, "d", spans, busy=[1, 3, 4]) == []  # 2 idle: 1 alone
    assert node_blocks(["d", "d"], "d", {0: (0, 1), 1: (1, 2)}, busy=[0, 1]) == []


def test_a_round_is_counted_by_link():
    assert [link(0, 1), link(2, 0), link(1, 2), link(1, 1)] == ["out", "in", "between", "local"]
    rows = transfer_rows(7, RoundTransfers(
        broadcast_bytes=1000, broadcast_in_store=True, receivers=[0, 1, 1, 2],
        partials=[PartialSize(1, 800, 1, 790), PartialSize(2, 1700, 2, 1600)],
        merged=[PartialSize(1, 810, 2, 800), PartialSize(1, 790, 1, 780)],
        relays=[(1, 2, 3, 50), (2, 1, 4, 60), (1, 1, 1, 5)], moved_states=9))
    table = {(r["kind"], r["source_node"], r["destination_node"]):
             (r["bytes"], r["objects"], r["roots"], r["sum_bytes"], r["states"]) for r in rows}
    assert table[("broadcast", 0, 1)] == (1000, 1, 0, 0, 0)  # once per node from the store
    assert table[("broadcast", 0, 0)] == (1000, 1, 0, 0, 0)
    assert table[("partial", 1, 0)] == (800, 1, 1, 790, 0)
    assert table[("partial", 2, 0)] == (1700, 1, 2, 1600, 0)
    assert table[("partial", 1, 1)] == (1600, 2, 3, 1580, 0)
    assert table[("relay", 1, 2)] == (50, 1, 0, 0, 3)
    assert table[("moved", 0, 0)][4] == 9
    assert {r["round"] for r in rows} == {7}
    assert all(tuple(r) == COLUMNS for r in rows)
    inline = transfer_rows(0, RoundTransfers(10, False, [1, 1], [], [], []))
    assert [(r["bytes"], r["objects"]) for r in inline] == [(20, 2)]  # in every task


def test_a_partial_is_measured_apart_into_sums_and_what_grows_with_its_clients():
    total = WeightedSum.of([{"w": np.ones(100, dtype=np.float32)}], [1.0])
    subtrees = [Subtree((0, 4), {"mean": total, "images": [np.ones(50, np.float32)]})]
    size = partial_size(3, subtrees)
    assert (size.node, size.roots) == (3, 1)
    assert 800 <= size.sum_bytes < 1200 < size.bytes  # 100 float64 sums, + 200 listed bytes
