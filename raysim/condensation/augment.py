"""Differentiable siamese augmentation (DSA, Zhao & Bilen 2021) as the FedVCK authors run it
(``src/utils.py`` of Youth-49/FedVCK_2024): colour (brightness, saturation, contrast), crop
(a whole-pixel shift of up to 1/8 of the size, zero fill), cutout (a zeroed square of half the
size centred at a random pixel), flip, scale (1/1.2 to 1.2 per axis) and rotation (+-15 deg),
differentiable in the images. One parameter draw per operation is shared by the whole batch,
and both the real and the synthetic batch of a step are augmented from the same seed, so they
see the same transformation (siamese).

``mode``: ``single`` (the authors' default ``aug_mode='S'``) applies ONE operation per call,
chosen from ``operations`` by the seed; ``all`` (their ``'M'``, DSA's original) applies every
operation in turn.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from raysim.condensation.operations import OPERATIONS, AugmentationMode


def _uniform(generator: torch.Generator, low: float, high: float) -> float:
    return float(torch.rand(1, generator=generator)) * (high - low) + low


def _affine(x: torch.Tensor, matrix: list[list[float]]) -> torch.Tensor:
    theta = torch.tensor(matrix, dtype=x.dtype, device=x.device).expand(len(x), 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=True)
    return F.grid_sample(x, grid, align_corners=True)


def _color(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    x = x + _uniform(generator, -0.5, 0.5)  # brightness
    mean = x.mean(dim=1, keepdim=True)
    x = (x - mean) * _uniform(generator, 0.0, 2.0) + mean  # saturation
    mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - mean) * _uniform(generator, 0.5, 1.5) + mean  # contrast


def shift(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``x`` moved by whole pixels (output[i, j] = x[i + rows, j + cols]), zeros outside."""
    pad = max(abs(rows), abs(cols))
    if pad == 0:
        return x
    height, width = x.shape[-2:]
    padded = F.pad(x, [pad, pad, pad, pad])
    return padded[..., pad + rows:pad + rows + height, pad + cols:pad + cols + width]


def _crop(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    limit_rows, limit_cols = (int(size * 0.125 + 0.5) for size in x.shape[-2:])
    rows = int(torch.randint(-limit_rows, limit_rows + 1, (1,), generator=generator))
    cols = int(torch.randint(-limit_cols, limit_cols + 1, (1,), generator=generator))
    return shift(x, rows, cols)


def _cutout(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    height, width = x.shape[-2:]
    size_rows, size_cols = int(height * 0.5 + 0.5), int(width * 0.5 + 0.5)
    centre_row = int(torch.randint(0, height + (1 - size_rows % 2), (1,), generator=generator))
    centre_col = int(torch.randint(0, width + (1 - size_cols % 2), (1,), generator=generator))
    top, left = max(centre_row - size_rows // 2, 0), max(centre_col - size_cols // 2, 0)
    mask = torch.ones((height, width), dtype=x.dtype, device=x.device)
    mask[top:centre_row - size_rows // 2 + size_rows, left:centre_col - size_cols // 2 + size_cols] = 0
    return x * mask


def _flip(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return x.flip(-1) if float(torch.rand(1, generator=generator)) < 0.5 else x


def _scale(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    sx, sy = _uniform(generator, 1 / 1.2, 1.2), _uniform(generator, 1 / 1.2, 1.2)
    return _affine(x, [[sx, 0.0, 0.0], [0.0, sy, 0.0]])


def _rotate(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    angle = _uniform(generator, -15.0, 15.0) * math.pi / 180
    return _affine(x, [[math.cos(angle), -math.sin(angle), 0.0],
                       [math.sin(angle), math.cos(angle), 0.0]])


_FUNCTIONS = {"color": _color, "crop": _crop, "cutout": _cutout, "flip": _flip,
              "scale": _scale, "rotate": _rotate}


def chosen_operations(seed: int, operations: tuple[str, ...], mode: AugmentationMode
                      ) -> tuple[str, ...]:
    """The operations a call with this seed applies: all of them, or the one drawn first."""
    for op in operations:
        if op not in _FUNCTIONS:
            raise ValueError(f"unknown augmentation {op!r}; allowed: {', '.join(OPERATIONS)}")
    if mode == "all" or not operations:
        return operations
    generator = torch.Generator().manual_seed(seed)
    return (operations[int(torch.randint(0, len(operations), (1,), generator=generator))],)


def augment(x: torch.Tensor, seed: int, operations: tuple[str, ...] = OPERATIONS,
            mode: AugmentationMode = "single") -> torch.Tensor:
    """Augment a batch with parameters drawn from ``seed`` (one draw per operation, shared by
    the whole batch); differentiable in ``x``. The same seed gives the same transformation."""
    generator = torch.Generator().manual_seed(seed)
    if mode == "single":
        torch.randint(0, max(len(operations), 1), (1,), generator=generator)  # the choice
    for op in chosen_operations(seed, operations, mode):
        x = _FUNCTIONS[op](x, generator)
    return x
