"""Assignment of clients to workers: fixed client groups, balanced by their training cost
(samples x FLOPs per sample when clients differ in architecture or resolution, else samples)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from raysim.algorithms.base import Algorithm


def client_groups(num_clients: int, num_groups: int) -> list[np.ndarray]:
    """Split client ids into ``min(num_groups, num_clients)`` contiguous groups.

    Groups, not workers, are the unit of pre-aggregation: a group's partial is reduced in
    client order on one worker and groups are combined in group order on the driver, so the
    numbers do not depend on how many workers there are.
    """
    return np.array_split(np.arange(num_clients), min(num_groups, num_clients))


def assign_groups(group_loads: list[float], num_workers: int) -> list[list[int]]:
    """Longest-processing-time-first assignment of groups to workers (ties by index)."""
    order = sorted(range(len(group_loads)), key=lambda g: (-group_loads[g], g))
    heap = [(0.0, worker) for worker in range(num_workers)]
    assignment: list[list[int]] = [[] for _ in range(num_workers)]
    for group in order:
        load, worker = heapq.heappop(heap)
        assignment[worker].append(group)
        heapq.heappush(heap, (load + group_loads[group], worker))
    return [sorted(groups) for groups in assignment]


def per_sample_costs(algorithm: Algorithm) -> np.ndarray | None:
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
