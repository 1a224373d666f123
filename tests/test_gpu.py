"""A worker's GPU share: memory capped to engine.gpus_per_worker, a clear error past it.

The CPU tests check the twin (no cap, the error translation); the CUDA tests run where a GPU
is visible and skip elsewhere (CI has none)."""

from __future__ import annotations

import pytest
import torch

from raysim.engine.run.gpu_share import GpuMemoryError, GpuShare, cap_gpu_memory, gpu_memory_errors

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_cpu_worker_has_no_share_and_out_of_memory_passes_through():
    assert cap_gpu_memory(torch.device("cpu"), 0.25) is None
    with pytest.raises(torch.OutOfMemoryError), gpu_memory_errors(None, 0, "in round 3"):
        raise torch.OutOfMemoryError("CUDA out of memory")


def test_out_of_memory_in_a_share_names_the_share_and_the_fix():
    share = GpuShare(0.25, 20 * 2**30, 80 * 2**30, "NVIDIA H100 80GB HBM3")
    with pytest.raises(GpuMemoryError) as caught, gpu_memory_errors(share, 2, "in round 7"):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 30.00 GiB\nmore")
    message = str(caught.value)
    for part in ("Worker 2", "round 7", "engine.gpus_per_worker = 0.25", "20.0 GiB",
                 "80.0 GiB", "Tried to allocate 30.00 GiB", "training.batch_size", "--resume"):
        assert part in message
    assert "\n" not in message
    assert share.describe()["gpu_memory_cap_gib"] == 20.0


@CUDA
def test_allocation_past_the_share_fails_with_the_clear_error():
    device = torch.device("cuda")
    share = cap_gpu_memory(device, 0.05)
    try:
        assert share is not None and share.fraction == 0.05
        small = torch.empty(share.cap_bytes // 4, dtype=torch.uint8, device=device)
        with pytest.raises(GpuMemoryError, match=r"gpus_per_worker = 0\.05"), \
                gpu_memory_errors(share, 0, "in round 0"):
            torch.empty(share.cap_bytes, dtype=torch.uint8, device=device)
        del small
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, torch.cuda.current_device())
        torch.cuda.empty_cache()
