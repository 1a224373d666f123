"""Assignment of clients to workers: fixed client groups, balanced by data size."""

from __future__ import annotations

import heapq

import numpy as np


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
