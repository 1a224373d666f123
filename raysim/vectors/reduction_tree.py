"""A fixed binary summation tree over the client groups, split between workers and driver.

Group g's partial is a leaf; node [a, b) (an aligned power-of-two block of groups) is the merge
of its two halves, left first, and a half without any partial is skipped. The tree's shape
depends only on the group ids, never on the workers: a worker that holds the contiguous groups
[lo, hi) merges the maximal aligned blocks inside that range itself (:func:`subtree_roots`)
and sends their roots (one when its range is an aligned block) in its one reply; the driver
merges the roots it receives up to the root (:func:`combine`). Every merge happens at the same
node whatever the number of workers, so 1 and N workers give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Span = tuple[int, int]
"""[first group, stop) of a tree node."""
Merge = Callable[[Any, Any], Any]


@dataclass
class Subtree:
    """The merged partial of the groups of one tree node."""

    span: Span
    partial: Any


def aligned_spans(lo: int, hi: int) -> list[Span]:
    """The maximal aligned power-of-two blocks that tile [lo, hi), left to right."""
    spans = []
    while lo < hi:
        width = lo & -lo if lo else 1 << (hi - lo).bit_length()
        while width > hi - lo:
            width //= 2
        spans.append((lo, lo + width))
        lo += width
    return spans


def reduce_span(partials: Mapping[int, Any], span: Span, merge: Merge) -> Any:
    """The partial of tree node ``span`` from the group partials (None: no group has one)."""
    return _reduce_node(_leaves(partials), span, merge)


def subtree_roots(partials: Mapping[int, Any], lo: int, hi: int, merge: Merge
                  ) -> list[Subtree]:
    """A worker's share of the tree: the roots of the aligned blocks of its groups [lo, hi)
    that have a partial."""
    return _roots(_leaves(partials), lo, hi, merge)


def merge_subtrees(subtrees: Sequence[Subtree], lo: int, hi: int, merge: Merge
                   ) -> list[Subtree]:
    """A node's share of the tree: the roots of the aligned blocks of [lo, hi) from the
    subtree roots of the workers on one node, whose groups lie in [lo, hi). Every aligned
    block of a worker's range lies inside one aligned block of the node's, so the merges are
    those the driver would make, and the driver receives the node's roots instead."""
    return _roots({s.span: s.partial for s in subtrees}, lo, hi, merge)


def _roots(nodes: Mapping[Span, Any], lo: int, hi: int, merge: Merge) -> list[Subtree]:
    """The roots of the aligned blocks of [lo, hi) that have a partial, from known nodes."""
    roots = []
    for span in aligned_spans(lo, hi):
        partial = _reduce_node(nodes, span, merge)
        if partial is not None:
            roots.append(Subtree(span, partial))
    return roots


def combine(subtrees: Sequence[Subtree], merge: Merge) -> Any:
    """The root of the tree from the workers' subtree roots (None when there are none)."""
    if not subtrees:
        return None
    nodes = {s.span: s.partial for s in subtrees}
    size = 1 << max(s.span[1] - 1 for s in subtrees).bit_length()
    return _reduce_node(nodes, (0, max(size, 1)), merge)


def _leaves(partials: Mapping[int, Any]) -> dict[Span, Any]:
    """Group partials as the tree's one-group nodes."""
    return {(group, group + 1): partial for group, partial in partials.items()}


def _reduce_node(nodes: Mapping[Span, Any], span: Span, merge: Merge) -> Any:
    """Node ``span``'s partial from known nodes (group leaves, or the subtree roots the
    workers sent): the node itself, else the merge of its halves (None: nothing inside).

    A module function, not a closure that calls itself: such a closure is a reference cycle
    that keeps the round's partials (object-store buffers and float64 sums) alive until
    Python's cyclic collector runs, so that every round's new objects land on fresh memory
    (page faults on the driver, a growing object store)."""
    if span in nodes:
        return nodes[span]
    lo, hi = span
    if hi - lo == 1:
        return None
    middle = (lo + hi) // 2
    left = _reduce_node(nodes, (lo, middle), merge)
    right = _reduce_node(nodes, (middle, hi), merge)
    if left is None or right is None:
        return right if left is None else left
    return merge(left, right)
