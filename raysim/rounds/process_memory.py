"""Resident memory of the current process (for the per-round memory columns)."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass


def resident_memory_mb() -> float:
    """Current resident set size in MiB (Linux: /proc; elsewhere: the peak RSS)."""
    try:
        with open("/proc/self/statm") as handle:
            pages = int(handle.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Blocks below this come from the heap (glibc's largest allowed threshold on 64 bit)."""
TRIM_THRESHOLD_BYTES = 2**30
"""Free heap memory up to this stays with the process instead of going back to the OS."""


def keep_freed_memory() -> bool:
    """Make glibc's allocator keep freed blocks of up to 32 MiB for reuse in this process.

    A client worker allocates and frees a model's weights and a float64 sum for every client:
    with glibc's defaults such blocks often go back to the OS on free and come again with one
    page fault per 4 KiB on the next use (about 1,000 faults, 2 ms, per client for a 1 M
    parameter model, measured on the development machine). The process keeps its peak heap instead, which a
    round needs anyway. Returns False where there is no glibc ``mallopt`` (nothing changes).
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD_BYTES)
                and mallopt(m_trim_threshold, TRIM_THRESHOLD_BYTES))


@dataclass
class _ProcessMemory:
    """What this process did to its memory so far."""

    frozen: bool = False
    """Whether :func:`freeze_imported_objects` froze this process's objects."""


PROCESS = _ProcessMemory()


def freeze_imported_objects() -> bool:
    """Exempt every object alive now (the imported modules of torch, Ray and raysim: several
    hundred thousand) from Python's cyclic garbage collector, once per process (later calls
    do nothing; returns whether this call froze).

    A full collection walks every tracked object: about 150-200 ms in a driver or a client
    worker after torch is imported, on the development machine, and a run's allocations
    trigger one now and then (a FedBuff driver's planning, a worker every few hundred rounds
    of a 1,000-client MLP workload). ``gc.freeze`` moves the objects alive now out of the collector's
    generations, so a collection walks only what the runs allocated since; frozen objects are
    still freed by reference counting (only a reference cycle among them would be kept).
    """
    import gc

    if PROCESS.frozen:
        return False
    PROCESS.frozen = True
    gc.freeze()
    return True
