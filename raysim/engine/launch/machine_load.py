"""Whether other processes keep this machine busy: a load average over a share of its CPUs
(half for timing probes, all of them for runs), when work is slower than on a quiet machine."""

from __future__ import annotations

import os


def busy_load(cpus: int | None = None, share: float = 0.5) -> float | None:
    """The one-minute load average when it is over ``share`` of ``cpus`` (default: this
    machine's), else None (also where the platform has no load average)."""
    cpus = cpus or os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return load if load > cpus * share else None


__all__ = ["busy_load"]
