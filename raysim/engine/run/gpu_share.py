"""A worker's share of a GPU: Ray's fractional GPUs schedule, they do not cap memory.

``engine.gpus_per_worker: 0.25`` lets Ray place four workers on one GPU, but any of them could
still allocate the whole card and starve the others. :func:`cap_gpu_memory` caps the worker's
PyTorch allocator at its fraction, and :func:`gpu_memory_errors` turns the allocator's
out-of-memory error into a :class:`GpuMemoryError` that says which share was exceeded and how to
fix it, so a run that outgrows its share stops with a clear message instead of slowing or
hanging the other workers on the card. Both are no-ops on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from raysim.errors import RunError


class GpuMemoryError(RunError):
    """A worker needed more GPU memory than its ``engine.gpus_per_worker`` share."""


@dataclass(frozen=True)
class GpuShare:
    """The GPU memory a worker may use: its fraction of the card and the resulting cap."""

    fraction: float
    cap_bytes: int
    total_bytes: int
    name: str

    def describe(self) -> dict[str, object]:
        """Manifest fields of the share."""
        return {"gpu_name": self.name, "gpu_memory_fraction": self.fraction,
                "gpu_memory_cap_gib": round(self.cap_bytes / 2**30, 2),
                "gpu_memory_total_gib": round(self.total_bytes / 2**30, 2)}


def cap_gpu_memory(device: torch.device, fraction: float) -> GpuShare | None:
    """Cap this process's PyTorch allocations on ``device`` at ``fraction`` of the card
    (``fraction`` >= 1: the whole card, uncapped). Returns the share, or None on the CPU."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    share = min(max(fraction, 0.0), 1.0) or 1.0
    if share < 1.0:
        torch.cuda.set_per_process_memory_fraction(share, index)
    return GpuShare(share, int(properties.total_memory * share), int(properties.total_memory),
                    properties.name)


@contextmanager
def gpu_memory_errors(share: GpuShare | None, worker: int, phase: str) -> Iterator[None]:
    """Re-raise PyTorch's out-of-memory error as a :class:`GpuMemoryError` naming the share
    and the ``phase`` (e.g. "in round 3", "while warming up")."""
    try:
        yield
    except torch.OutOfMemoryError as error:
        if share is None:
            raise
        cap, total = share.cap_bytes / 2**30, share.total_bytes / 2**30
        raise GpuMemoryError(
            f"Worker {worker} ran out of its GPU memory share {phase}: "
            f"engine.gpus_per_worker = {share.fraction:g} caps it at {cap:.1f} GiB of the "
            f"{total:.1f} GiB {share.name} (PyTorch: {str(error).splitlines()[0]}). The share "
            "is enforced so that workers packed on one GPU cannot starve each other. Lower "
            "training.batch_size or the clients trained per call, or raise "
            "engine.gpus_per_worker (0.5 packs two workers per GPU, 1 gives a worker the whole "
            "card). Rows of the rounds before are kept; continue with `raysim run CONFIG "
            "--resume` after the change (engine settings may change on resume)."
        ) from None
