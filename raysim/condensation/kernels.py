"""Maximum mean discrepancy between two sets of embeddings under a chosen kernel."""

from __future__ import annotations

from typing import Literal

import torch

Kernel = Literal["linear", "gaussian", "polynomial"]
KERNELS = ("linear", "gaussian", "polynomial")


def _gram(a: torch.Tensor, b: torch.Tensor, kernel: Kernel, bandwidth: torch.Tensor | None
          ) -> torch.Tensor:
    if kernel == "linear":
        return a @ b.T
    if kernel == "polynomial":
        return (a @ b.T / a.shape[1] + 1.0) ** 2
    assert bandwidth is not None, "the gaussian kernel needs a bandwidth"
    return torch.exp(-torch.cdist(a, b).pow(2) / (2 * bandwidth ** 2))


def mmd(real: torch.Tensor, synthetic: torch.Tensor, kernel: Kernel = "linear") -> torch.Tensor:
    """Biased squared MMD: mean K(r, r') + mean K(s, s') - 2 mean K(r, s). The linear kernel is
    ||mean(real) - mean(synthetic)||^2 (FedDM's mean matching); the Gaussian kernel's bandwidth
    is the median pairwise distance of the real embeddings (detached)."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; allowed: {', '.join(KERNELS)}")
    if kernel == "linear":
        return (real.mean(0) - synthetic.mean(0)).pow(2).sum()
    bandwidth = None
    if kernel == "gaussian":
        distances = torch.cdist(real.detach(), real.detach())
        bandwidth = distances[distances > 0].median() if (distances > 0).any() else \
            torch.tensor(1.0, device=real.device)
    return (_gram(real, real, kernel, bandwidth).mean()
            + _gram(synthetic, synthetic, kernel, bandwidth).mean()
            - 2 * _gram(real, synthetic, kernel, bandwidth).mean())
