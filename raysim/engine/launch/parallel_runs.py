"""How many runs of an invocation go at once, and how many worker processes its first runs use.

Torch-free: the start-up reads :func:`processes_at_start` before Ray starts, to have a local
Ray start that many worker processes ahead of time instead of one per CPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from raysim.configuration.experiment import ExperimentConfig


def runs_at_once(configs: Iterable[ExperimentConfig], cpus: float, gpus: float = 0.0) -> int:
    """How many runs fit on ``cpus`` and ``gpus`` at once (each run's workers reserve their
    resources; starting more drivers than that would only make idle processes wait); at
    least one."""
    fits = []
    for config in configs:
        engine = config.engine
        fits.append(cpus / (engine.num_workers * engine.cpus_per_worker))
        if engine.gpus_per_worker and gpus:
            fits.append(gpus / (engine.num_workers * engine.gpus_per_worker))
    return max(1, math.floor(min(fits, default=1.0) + 1e-9))


def processes_at_start(configs: Sequence[ExperimentConfig], cpus: int, gpus: float = 0.0
                       ) -> int:
    """The worker processes the invocation's first runs use: the workers and the driver host
    of each run (seed) that fits on ``cpus`` and ``gpus`` at once, in the invocation's order,
    at most one per CPU and at least one. An upper bound: seeds that share worker processes
    (``engine.merge_seeds``) use fewer."""
    runs = [config for config in configs for _ in config.seeds]
    first = runs[:runs_at_once(configs, cpus, gpus)]
    return max(1, min(cpus, sum(config.engine.num_workers + 1 for config in first)))
