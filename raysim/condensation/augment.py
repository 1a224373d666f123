"""Differentiable siamese augmentation (Zhao & Bilen 2021): random colour, crop, cutout, flip,
scale and rotation, differentiable in the images, with the *same* random parameters for the
real and the synthetic batch of a step (both calls get generators in the same state)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

STRATEGY = ("color", "crop", "cutout", "flip", "scale", "rotate")


def _uniform(generator: torch.Generator, count: int, low: float, high: float,
             device: torch.device) -> torch.Tensor:
    return (torch.rand(count, generator=generator) * (high - low) + low).to(device)


def _affine(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    grid = F.affine_grid(theta, list(x.shape), align_corners=True)
    return F.grid_sample(x, grid, align_corners=True)


def augment(x: torch.Tensor, seed: int, strategy: tuple[str, ...] = STRATEGY) -> torch.Tensor:
    """Apply each op of ``strategy`` with parameters drawn from ``seed`` (one draw per op, shared
    by the whole batch as in DSA's siamese mode); differentiable in ``x``."""
    generator = torch.Generator().manual_seed(seed)
    device = x.device
    for op in strategy:
        if op == "color":
            x = x + (_uniform(generator, 1, -0.5, 0.5, device) - 0.0)  # brightness
            mean = x.mean(dim=1, keepdim=True)
            x = (x - mean) * _uniform(generator, 1, 0.0, 2.0, device) + mean  # saturation
            mean = x.mean(dim=(1, 2, 3), keepdim=True)
            x = (x - mean) * _uniform(generator, 1, 0.5, 1.5, device) + mean  # contrast
        elif op == "crop":  # translation by up to 1/8 of the size, zero padding
            shift = _uniform(generator, 2, -0.25, 0.25, device)
            theta = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], device=device)
            theta = theta.clone()
            theta[0, 2], theta[1, 2] = shift[0], shift[1]
            x = _affine(x, theta.expand(len(x), 2, 3))
        elif op == "cutout":  # a zeroed square of half the size at a random position
            size = x.shape[-1]
            half = size // 2
            top, left = (int(v) for v in torch.randint(0, size - half + 1, (2,),
                                                       generator=generator))
            mask = torch.ones_like(x[:1])
            mask[..., top:top + half, left:left + half] = 0
            x = x * mask
        elif op == "flip":
            if float(torch.rand(1, generator=generator)) < 0.5:
                x = x.flip(-1)
        elif op == "scale":
            sx, sy = _uniform(generator, 2, 0.8, 1.2, device)
            theta = torch.zeros(2, 3, device=device)
            theta[0, 0], theta[1, 1] = sx, sy
            x = _affine(x, theta.expand(len(x), 2, 3))
        elif op == "rotate":
            angle = float(_uniform(generator, 1, -15.0, 15.0, torch.device("cpu"))) * math.pi / 180
            theta = torch.tensor([[math.cos(angle), -math.sin(angle), 0.0],
                                  [math.sin(angle), math.cos(angle), 0.0]], device=device)
            x = _affine(x, theta.expand(len(x), 2, 3))
        else:
            raise ValueError(f"unknown augmentation {op!r}; allowed: {', '.join(STRATEGY)}")
    return x
