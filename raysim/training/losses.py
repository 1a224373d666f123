"""The training loss of a run's local training (``training.loss``)."""

from __future__ import annotations

import torch
from torch import nn

LOSSES = ("cross_entropy", "hinge")


class MultiClassHinge(nn.Module):
    """torch's MultiMarginLoss (p=1, margin 1, mean over the batch), written with ops that
    torch.func's vmap batches (MultiMarginLoss has no batching rule): for logits z and label
    y, sum over j != y of max(0, 1 - z_y + z_j), over the number of classes. On a binary-margin
    model's logits (0, f(x)) it is max(0, 1 - y f(x)) / 2 with y in {-1, +1}: the linear SVM's
    loss."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        own = logits.gather(1, targets[:, None])
        margins = (1 - own + logits).clamp(min=0)  # the j = y entry is exactly 1
        return ((margins.sum(1) - 1) / logits.shape[1]).mean()


def loss_function(name: str) -> nn.Module:
    """``cross_entropy`` or ``hinge`` (:class:`MultiClassHinge`)."""
    return MultiClassHinge() if name == "hinge" else nn.CrossEntropyLoss()
