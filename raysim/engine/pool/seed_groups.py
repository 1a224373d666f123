"""Which runs of an invocation share worker processes: seeds of one config that would otherwise
wait for each other (``engine.merge_seeds``; see :mod:`raysim.engine.pool.worker_host`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysim.configuration.experiment import ExperimentConfig
from raysim.engine.pool.worker_host import MAX_RUNS_PER_HOST

RunKey = tuple[str, int]
"""(experiment label, seed)."""


@dataclass(frozen=True)
class SeedGroup:
    """Runs of one config (its seeds) on one set of shared worker processes."""

    label: str
    seeds: tuple[int, ...]

    def slot(self, seed: int) -> int:
        """The run's slot on the shared workers."""
        return self.seeds.index(seed)

    @property
    def keys(self) -> list[RunKey]:
        return [(self.label, seed) for seed in self.seeds]


def plan_seed_groups(queue: list[RunKey], experiments: dict[str, ExperimentConfig],
                     concurrent_runs: int) -> dict[RunKey, SeedGroup]:
    """The seed group of each queued run that shares workers (runs not in the answer have
    workers of their own). The queued seeds of a config that do not all fit at once are split, in
    order, into as many seed groups as runs fit at once (``concurrent_runs``), each of at most
    ``MAX_RUNS_PER_HOST``: seeds that would have waited for a free CPU run beside the others
    instead, on the same worker processes (where they train on the vectorised path, their
    clients of equal size share one call)."""
    seed_groups: dict[RunKey, SeedGroup] = {}
    for label, config in experiments.items():
        seeds = [seed for key_label, seed in queue if key_label == label]
        if config.engine.merge_seeds == "never" or len(seeds) <= concurrent_runs:
            continue
        count = max(concurrent_runs, math.ceil(len(seeds) / MAX_RUNS_PER_HOST))
        size, extra = divmod(len(seeds), count)
        start = 0
        for index in range(count):
            stop = start + size + (index < extra)
            seed_group = SeedGroup(label, tuple(seeds[start:stop]))
            seed_groups.update(dict.fromkeys(seed_group.keys, seed_group))
            start = stop
    return seed_groups
