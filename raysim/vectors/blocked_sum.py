"""Deferred weighted sums evaluated block by block (cache blocking for reductions).

A worker's partial is a tree of sums: each client group's weighted sum of its clients' models
(from zero, in client order), and merges of those along the fixed reduction tree. Computed one
whole vector at a time, every group sum and every merge streams full-length float64 vectors
through memory (for a 1 M-parameter model, 8.6 MB each, far beyond the cache). This module keeps
the tree as an expression and evaluates it over one block of coordinates at a time, so the
intermediate sums stay in cache and each client's model is read once.

Every coordinate goes through exactly the same float operations in the same order as the
whole-vector computation (``zero``, then ``sum += weight * float64(model)`` per model; a merge is
``left += right``): sums are elementwise, so the blocking changes which coordinates are computed
together, never a coordinate's value. On a GPU the block is the whole vector (one kernel per
operation, as before).

On a CPU the blocks can also be split between threads (:func:`set_threads`; the driver host
uses the CPUs of its node that no worker reserved): each thread evaluates a contiguous range
of blocks with buffers of its own, so each coordinate still goes through the same operations,
and the bits do not depend on the number of threads.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

CPU_BLOCK_VALUES = 1 << 17
"""Coordinates per block on a CPU: 1 MiB of float64, so a block's partial sums and the float64
copy of one model's block stay in a core's L2 cache. Measured on the development machine (50
models of 1.08 M values in 30 groups, one thread): 40 ms against 70-94 ms for whole vectors;
blocks of 32 K values took 53 ms (torch's per-call cost), of 512 K 43 ms."""

@dataclass(frozen=True)
class Terms:
    """``sum_i weights[i] * models[i]`` from zero, in order. ``pieces[i]``: model i as (flat
    values of any dtype, start, stop) pieces of the sum's vector."""

    pieces: Sequence[Sequence[tuple[torch.Tensor, int, int]]]
    weights: Sequence[float]


@dataclass(frozen=True)
class Dense:
    """A computed vector (a partial read from the object store, or an evaluated sum)."""

    vector: torch.Tensor


@dataclass(frozen=True)
class Merge:
    """``left + right`` (left first)."""

    left: Expression
    right: Expression


Expression = Terms | Dense | Merge


MAX_THREADS = 8
"""The most threads :func:`set_threads` accepts: a sum of a few partials is bound by memory
bandwidth, which a few cores already saturate."""

_threads = [1]
_pool: list[ThreadPoolExecutor | None] = [None]
_pool_lock = threading.Lock()


def set_threads(count: int) -> int:
    """Split CPU evaluations (:func:`evaluate`, :func:`for_each_range`) between ``count``
    threads of this process from now on (clamped to [1, :data:`MAX_THREADS`]); returns the
    count used. Elementwise work only: the bits are the same for every count."""
    _threads[0] = max(1, min(int(count), MAX_THREADS))
    return _threads[0]


def threads() -> int:
    """The number of threads CPU evaluations are split between (:func:`set_threads`)."""
    return _threads[0]


def _executor() -> ThreadPoolExecutor:
    with _pool_lock:
        pool = _pool[0]
        if pool is None:
            pool = _pool[0] = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="raysim-sum")
        return pool


def block_ranges(length: int, device: torch.device) -> list[tuple[int, int]]:
    """[start, stop) of the contiguous runs of whole blocks that the threads evaluate: one per
    thread on a CPU (at most one per block), the whole vector elsewhere."""
    blocks = -(-length // CPU_BLOCK_VALUES)
    parts = min(threads(), blocks)
    if device.type != "cpu" or parts <= 1:
        return [(0, length)]
    bounds = [min(length, CPU_BLOCK_VALUES * (blocks * part // parts))
              for part in range(parts + 1)]
    return list(itertools.pairwise(bounds))


def for_each_range(length: int, device: torch.device,
                   work: Callable[[int, int], None]) -> None:
    """Call ``work(start, stop)`` for every range of :func:`block_ranges`, side by side in
    threads when there are several (``work`` must touch only its own coordinates)."""
    ranges = block_ranges(length, device)
    if len(ranges) == 1:
        work(*ranges[0])
        return
    futures = [_executor().submit(work, lo, hi) for lo, hi in ranges[1:]]
    work(*ranges[0])
    for future in futures:
        future.result()


def evaluate(expression: Expression, length: int, device: torch.device,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """The float64 vector of ``expression`` (``length`` values on ``device``), written into
    ``out`` when given (it may be the vector of the expression's leftmost :class:`Dense`: a
    merge into a computed sum adds in place)."""
    result = torch.empty(length, dtype=torch.float64, device=device) if out is None else out
    block = CPU_BLOCK_VALUES if device.type == "cpu" else max(length, 1)

    def evaluate_range(first: int, stop: int) -> None:
        buffers = _Buffers(min(block, max(stop - first, 1)), device)
        for start in range(first, stop, block):
            end = min(start + block, stop)
            _evaluate_into(expression, start, end, result[start:end], buffers, 0)

    for_each_range(length, device, evaluate_range)
    return result


class _Buffers:
    """One float64 block per depth of right-hand subtrees, and one scratch block for the
    float64 copy of a model's block."""

    def __init__(self, size: int, device: torch.device):
        self.size, self.device = size, device
        self.scratch = torch.empty(size, dtype=torch.float64, device=device)
        self.levels: list[torch.Tensor] = []

    def level(self, depth: int) -> torch.Tensor:
        while len(self.levels) <= depth:
            self.levels.append(torch.empty(self.size, dtype=torch.float64, device=self.device))
        return self.levels[depth]


def _evaluate_into(expression: Expression, start: int, stop: int, out: torch.Tensor,
                   buffers: _Buffers, depth: int) -> None:
    """Write ``expression``'s values at [start, stop) into ``out``. A chain of merges is walked
    down its left spine without recursion (a mean over many partials is such a chain)."""
    rights: list[Expression] = []
    while isinstance(expression, Merge):
        rights.append(expression.right)
        expression = expression.left
    rights.reverse()
    if isinstance(expression, Dense):
        left = expression.vector[start:stop]
        first = rights[0] if rights else None
        if isinstance(first, Dense):  # left + right in one pass, no copy first
            torch.add(left, first.vector[start:stop], out=out)
            rights.pop(0)
        elif left.data_ptr() != out.data_ptr():  # (a merge into this vector: already there)
            out.copy_(left)
    else:
        _add_terms(expression, start, stop, out, buffers.scratch)
    for right in rights:
        if isinstance(right, Dense):  # (a computed partial: added from where it lies)
            out.add_(right.vector[start:stop])
            continue
        right_values = buffers.level(depth)[:stop - start]
        _evaluate_into(right, start, stop, right_values, buffers, depth + 1)
        out.add_(right_values)


def _add_terms(terms: Terms, start: int, stop: int, out: torch.Tensor,
               scratch: torch.Tensor) -> None:
    out.zero_()
    for pieces, weight in zip(terms.pieces, terms.weights, strict=True):
        for values, first, last in pieces:
            lo, hi = max(first, start), min(last, stop)
            if lo < hi:
                copy = scratch[:hi - lo].copy_(values[lo - first:hi - first])
                out[lo - start:hi - start].add_(copy, alpha=weight)
