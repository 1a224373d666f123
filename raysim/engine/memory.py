"""Resident memory of the current process (for the per-round memory columns)."""

from __future__ import annotations

import resource
import sys


def resident_memory_mb() -> float:
    """Current resident set size in MiB (Linux: /proc; elsewhere: the peak RSS)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10
