"""The distribution-matching loop shared by FedDM and FedVCK: learnable synthetic images per
class, optimised so that their embeddings match those of real batches drawn per class.

Real data stays in the worker's (uint8) arrays; every iteration converts only that
iteration's real batches and moves them to the device, so a client's whole dataset never sits
on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from raysim.condensation.augment import OPERATIONS, AugmentationMode, augment
from raysim.data.dataset import DataInfo, to_tensor


@dataclass(frozen=True)
class MatchingSettings:
    """Iterations, image optimiser and real batch size of one condensation."""

    iterations: int
    image_lr: float
    momentum: float
    real_per_class: int
    clip: float = 10.0
    augmentation: tuple[str, ...] = OPERATIONS
    augmentation_mode: AugmentationMode = "single"


@dataclass
class RealData:
    """A client's real samples by class (indices into the stored arrays) and how to draw them."""

    x: np.ndarray
    by_class: dict[int, np.ndarray]
    """class -> indices into ``x``."""
    probabilities: dict[int, np.ndarray] | None = None
    """class -> sampling probabilities over ``by_class[c]`` (None: uniform)."""

    def batch(self, cls: int, size: int, rng: np.random.Generator) -> np.ndarray:
        """Indices of one real batch of class ``cls``: importance sampling with replacement,
        uniform without replacement (all of the class if it has fewer)."""
        members = self.by_class[cls]
        if self.probabilities is not None:
            return rng.choice(members, size=size, replace=True, p=self.probabilities[cls])
        return members if len(members) <= size else rng.choice(members, size, replace=False)


MatchLoss = Callable[[torch.Tensor, torch.Tensor, list[int], list[int]], torch.Tensor]
"""(real batch, synthetic batch, real class sizes, synthetic class sizes) -> loss; both
batches hold the classes in the same order."""


def condense(synthetic: dict[int, torch.Tensor], real: RealData, info: DataInfo,
             settings: MatchingSettings, loss_fn: MatchLoss, rng: np.random.Generator,
             seeds: np.ndarray, transform: Callable[[torch.Tensor], torch.Tensor] | None = None
             ) -> float:
    """Optimise the synthetic images (class -> (n_c, C, H, W) leaf tensors, updated in place)
    for ``settings.iterations`` steps; ``seeds[i]``: the augmentation seed of iteration i,
    shared by the real and the synthetic batch. Returns the mean loss of the last 10% of
    iterations."""
    classes = sorted(synthetic)
    device = synthetic[classes[0]].device
    images = [synthetic[c] for c in classes]
    optimizer = torch.optim.SGD(images, lr=settings.image_lr, momentum=settings.momentum)
    losses = []
    for iteration in range(settings.iterations):
        picks = [real.batch(c, settings.real_per_class, rng) for c in classes]
        real_batch = to_tensor(real.x[np.concatenate(picks)], info).to(device)
        if transform is not None:
            real_batch = transform(real_batch)
        syn_batch = torch.cat(images)
        seed = int(seeds[iteration])
        if settings.augmentation:
            real_batch = augment(real_batch, seed, settings.augmentation,
                                 settings.augmentation_mode)
            syn_batch = augment(syn_batch, seed, settings.augmentation, settings.augmentation_mode)
        loss = loss_fn(real_batch, syn_batch, [len(p) for p in picks], [len(s) for s in images])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(images, settings.clip)
        optimizer.step()
        losses.append(float(loss.detach()))
    tail = losses[-max(1, len(losses) // 10):]
    return float(np.mean(tail)) if tail else float("nan")


def split_by_class(tensor: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Split a batch concatenated class by class back into per-class parts."""
    return list(torch.split(tensor, sizes))
