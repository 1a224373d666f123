"""Assignment of clients to workers: fixed client groups in contiguous ranges per worker,
balanced by their training cost (samples x FLOPs per sample when clients differ in architecture
or resolution, else samples)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm


def client_groups(num_clients: int, num_groups: int) -> list[np.ndarray]:
    """Split client ids into ``min(num_groups, num_clients)`` contiguous groups.

    Groups, not workers, are the unit of pre-aggregation: a group's partial is reduced in
    client order on one worker and groups are combined in group order on the driver, so the
    numbers do not depend on how many workers there are.
    """
    return np.array_split(np.arange(num_clients), min(num_groups, num_clients))


def group_of_client(groups: list[np.ndarray]) -> np.ndarray:
    """Each client's group (the index of the group of :func:`client_groups` holding it)."""
    return np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])


BALANCE_TOLERANCE = 1.05
"""Aligned boundaries may leave the busiest worker this much above the finest split's."""


def assign_groups(group_loads: list[float], num_workers: int) -> list[list[int]]:
    """Contiguous ranges of groups per worker, balanced by load, with boundaries on aligned
    blocks where that costs little balance.

    Each worker's groups are one range, so it merges them into few subtrees of the fixed
    reduction tree (:mod:`raysim.vectors.reduction_tree`). Boundaries go where the prefix load
    is closest to an even split, on multiples of the largest power of two whose busiest
    worker stays within :data:`BALANCE_TOLERANCE` of the split on single groups (for 64
    equal groups: one subtree per worker for 2 or 4 workers). Workers beyond the number of
    groups get none.
    """
    count = len(group_loads)
    workers = max(1, min(num_workers, count))
    prefix = np.concatenate([[0.0], np.cumsum(group_loads)])
    finest = _split(prefix, workers, 1)
    best = finest
    align = 2
    while align * workers <= count:
        bounds = _split(prefix, workers, align)
        if _busiest(prefix, bounds) <= BALANCE_TOLERANCE * _busiest(prefix, finest):
            best = bounds
        align *= 2
    ranges = [list(range(best[i], best[i + 1])) for i in range(workers)]
    return ranges + [[] for _ in range(num_workers - workers)]


def _split(prefix: np.ndarray, workers: int, align: int) -> list[int]:
    """Range bounds closest to an even split of the load, on multiples of ``align`` where
    possible (at least one group per worker)."""
    count = len(prefix) - 1
    candidates = np.arange(0, count + 1, align)
    bounds = [0]
    for k in range(1, workers):
        target = prefix[-1] * k / workers
        limit = count - (workers - k)
        allowed = candidates[(candidates > bounds[-1]) & (candidates <= limit)]
        if not len(allowed):
            allowed = np.arange(bounds[-1] + 1, limit + 1)
        bounds.append(int(allowed[np.argmin(np.abs(prefix[allowed] - target))]))
    return [*bounds, count]


def _busiest(prefix: np.ndarray, bounds: list[int]) -> float:
    return float(np.max(np.diff(prefix[bounds])))


def per_sample_costs(algorithm: RunAlgorithm) -> np.ndarray | None:
    """Forward MFLOPs per training sample of every client: its own architecture at its input
    size plus the models every client also trains (e.g. MH-pFLID's messenger), from
    :func:`raysim.models.costs.cost_table`. None when all clients cost the same (one
    architecture, one resolution), so that data size alone balances the workers."""
    context = algorithm.context
    if not context.heterogeneous and not any(f > 1 for f in context.downsample):
        return None
    from raysim.models.costs import client_input_shape

    table = algorithm.cost_table()
    own = table[table["client"] >= 0].set_index("client")["mflops"]
    shared = table[table["client"] < 0].groupby("input")["mflops"].sum()
    costs = []
    for client in range(context.num_clients):
        factor = context.downsample[client] if context.downsample else 1
        shape = "x".join(map(str, client_input_shape(context.info.input_shape, factor)))
        costs.append(float(own[client]) + float(shared.get(shape, 0.0)))
    return np.array(costs)
