"""Synthetic (condensed) image sets: sizes per class, initialisation, the uint8 form they are
uploaded in (one byte per pixel, as the FedVCK paper counts them), and server-side training of
a model on them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from raysim.condensation.augment import augment
from raysim.data.dataset import DataInfo, to_tensor
from raysim.models.registry import embedding_parts


def images_per_class(counts: np.ndarray, percent: float | None, floor: int,
                     min_class_samples: int) -> dict[int, int]:
    """class -> number of synthetic images: ``max(floor, ceil(percent% * n_c))`` (``percent``
    None: ``floor``) for every class with at least ``min_class_samples`` local samples."""
    sizes = {}
    for cls, count in enumerate(np.asarray(counts).tolist()):
        if count >= max(min_class_samples, 1):
            extra = 0 if percent is None else math.ceil(percent / 100.0 * count)
            sizes[cls] = max(floor, extra)
    return sizes


def noise_images(sizes: dict[int, int], shape: tuple[int, ...], generator: torch.Generator
                 ) -> dict[int, np.ndarray]:
    """N(0, 1) initial images (in normalised input space) for each class."""
    return {cls: torch.randn((n, *shape), generator=generator).numpy()
            for cls, n in sorted(sizes.items())}


def to_uint8(images: torch.Tensor, info: DataInfo) -> np.ndarray:
    """Normalised (N, C, H, W) images -> the dataset's stored uint8 layout ((N, H, W) for one
    channel, (N, H, W, C) else), rounded and clipped to [0, 255]."""
    mean = torch.tensor(info.mean, device=images.device).view(1, -1, 1, 1)
    std = torch.tensor(info.std, device=images.device).view(1, -1, 1, 1)
    scaled = ((images.detach() * std + mean) * 255.0).round().clamp(0, 255).to(torch.uint8)
    pixels = scaled.permute(0, 2, 3, 1).cpu().numpy()
    return pixels[..., 0] if pixels.shape[-1] == 1 else pixels


@dataclass(frozen=True)
class ServerTraining:
    """How the server trains the global model on synthetic data."""

    epochs: int
    lr: float
    momentum: float
    weight_decay: float
    batch_size: int
    lr_decay: float = 1.0
    """Factor on both learning rates and the extra loss's weight from epoch ``epochs // 2``."""
    augmentation: tuple[str, ...] = ()
    """Operations of which one, drawn per batch, augments each batch (empty: none)."""
    extra_lr: float = 0.01
    """Adam learning rate of the extra loss's own parameters (FedVCK's projector)."""


ExtraLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(embeddings, labels) -> an extra loss term added to the cross-entropy of a batch; the
embeddings are the model's ``embed`` output of the batch, computed once for both terms."""


def train_on_synthetic(model: nn.Module, images: np.ndarray, labels: np.ndarray, info: DataInfo,
                       settings: ServerTraining, generator: torch.Generator,
                       extra_loss: ExtraLoss | None = None,
                       extra_module: nn.Module | None = None) -> float:
    """SGD epochs of cross-entropy (+ ``extra_loss``, whose ``extra_module`` trains with Adam)
    over the stored-format ``images``, each batch augmented by one random operation of
    ``settings.augmentation``; from half the epochs on, the learning rates and the extra loss's
    weight are multiplied by ``settings.lr_decay``. Returns the mean loss of the last epoch."""
    x = to_tensor(images, info)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum,
                                weight_decay=settings.weight_decay)
    optimizers: list[torch.optim.Optimizer] = [optimizer]
    if extra_module is not None:
        extra_module.train()
        optimizers.append(torch.optim.Adam(extra_module.parameters(), lr=settings.extra_lr))
    model.train()
    last, weight = float("nan"), 1.0
    for epoch in range(settings.epochs):
        if epoch == settings.epochs // 2 and epoch > 0:
            weight = settings.lr_decay
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] *= settings.lr_decay
        order = torch.randperm(len(y), generator=generator)
        total, seen = 0.0, 0
        for batch in order.split(settings.batch_size):
            if len(batch) < 2:  # BatchNorm cannot train on one sample
                continue
            inputs, targets = x[batch], y[batch]
            if settings.augmentation:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
                inputs = augment(inputs, seed, settings.augmentation, "single")
            if extra_loss is None:
                loss = F.cross_entropy(model(inputs), targets)
            else:  # one forward pass feeds both terms (the model has ``embed`` + ``classifier``)
                embed, classifier = embedding_parts(model)
                embeddings = embed(inputs)
                loss = (F.cross_entropy(classifier(embeddings), targets)
                        + weight * extra_loss(embeddings, targets))
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in optimizers:
                opt.step()
            total += float(loss.detach()) * len(batch)
            seen += len(batch)
        last = total / max(seen, 1)
    return last
