"""Whether other processes keep this machine busy: a load average over half its CPUs, when
runs and probes are slower than on a quiet machine (and their timings say less)."""

from __future__ import annotations

import os


def busy_load(cpus: int | None = None) -> float | None:
    """The one-minute load average when it is over half of ``cpus`` (default: this
    machine's), else None (also where the platform has no load average)."""
    cpus = cpus or os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return load if load > cpus / 2 else None


__all__ = ["busy_load"]
