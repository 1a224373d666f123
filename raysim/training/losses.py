"""The training loss of a run's local training (``training.loss``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from raysim.data.dataset import DataInfo


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


class MultiLabelBCE(nn.Module):
    """Binary cross-entropy on logits, averaged over labels and samples (torch's
    BCEWithLogitsLoss), for 0/1 label rows stored as integers."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))


class SegmentationLoss(nn.Module):
    """A segmentation loss on logits (B, C, H, W) and masks (B, H, W) of class indices (any
    integer dtype): per-pixel cross-entropy (``mask_cross_entropy``), MONAI's Dice loss on the
    softmax (``dice``) or Dice + cross-entropy (``dice_ce``, equal weights, as MONAI's
    ``DiceCELoss``), the background included in the Dice terms as MONAI's defaults have it.
    The masks are one-hot encoded here by comparison (MONAI's ``one_hot`` scatters in place,
    which ``torch.func.vmap`` cannot batch), so the vectorised client path takes these losses;
    the numbers are MONAI's own."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind in ("dice", "dice_ce"):
            from monai.losses import DiceLoss

            self.dice: nn.Module | None = DiceLoss(softmax=True)
        else:
            self.dice = None

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        masks = targets.long()
        cross_entropy = F.cross_entropy(logits, masks)
        if self.dice is None:
            return cross_entropy
        classes = torch.arange(logits.shape[1], device=masks.device).view(1, -1, 1, 1)
        one_hot = (masks[:, None] == classes).to(torch.float32)
        dice = self.dice(logits, one_hot)
        return dice + cross_entropy if self.kind == "dice_ce" else dice


MULTI_LABEL_LOSS = "multi_label_bce"
"""The loss every multi-label run trains with (``training.loss`` cross_entropy on such data)."""
SEGMENTATION_LOSSES = {"cross_entropy": "mask_cross_entropy", "dice": "dice",
                       "dice_ce": "dice_ce"}
"""``training.loss`` -> the segmentation loss it names (on masks)."""


def training_loss(configured: str, info: DataInfo) -> str:
    """The loss a run trains with: ``training.loss``, for a multi-label task its per-label
    binary cross-entropy, for a segmentation task its form on masks."""
    if info.segmentation:
        return SEGMENTATION_LOSSES[configured]
    return MULTI_LABEL_LOSS if info.multi_label else configured


@functools.cache
def loss_function(name: str) -> nn.Module:
    """``cross_entropy``, ``hinge`` (:class:`MultiClassHinge`), ``multi_label_bce``
    (:class:`MultiLabelBCE`) or a segmentation loss (:class:`SegmentationLoss`); one
    stateless module per name, shared."""
    if name == MULTI_LABEL_LOSS:
        return MultiLabelBCE()
    if name in SEGMENTATION_LOSSES.values():
        return SegmentationLoss(name)
    return MultiClassHinge() if name == "hinge" else nn.CrossEntropyLoss()


def sample_losses(logits: torch.Tensor, targets: torch.Tensor, multi_label: bool = False
                  ) -> torch.Tensor:
    """Each sample's cross-entropy (for a multi-label task: its binary cross-entropy summed
    over the labels)."""
    if multi_label:
        return F.binary_cross_entropy_with_logits(
            logits, targets.to(logits.dtype), reduction="none").sum(dim=1)
    if logits.ndim > 2:  # segmentation: each image's mean pixel cross-entropy
        return F.cross_entropy(logits, targets.long(), reduction="none").flatten(1).mean(1)
    return F.cross_entropy(logits, targets, reduction="none")
