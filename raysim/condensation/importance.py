"""FedVCK's model-guided knowledge selection: sample real data by how badly the current
global model (self-ensembled with the previous one) predicts it."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def importance_weights(logits_now: torch.Tensor, logits_before: torch.Tensor | None,
                       labels: torch.Tensor, alpha: float, gamma: float, offset: float
                       ) -> torch.Tensor:
    """w_i = sigmoid(gamma * (CE(y_i, alpha z_t + (1 - alpha) z_{t-1}) - b)) per sample
    (``logits_before`` None: the current model alone)."""
    logits = logits_now if logits_before is None else (
        alpha * logits_now + (1 - alpha) * logits_before)
    errors = F.cross_entropy(logits, labels, reduction="none")
    return torch.sigmoid(gamma * (errors - offset))


def class_sampling_probabilities(weights: torch.Tensor, labels: torch.Tensor,
                                 num_classes: int) -> dict[int, np.ndarray]:
    """Within each class present, p = softmax(w) over its samples (as the authors' code does)."""
    probabilities = {}
    for cls in range(num_classes):
        members = (labels == cls).nonzero().flatten()
        if len(members):
            probabilities[cls] = torch.softmax(weights[members].double(), 0).cpu().numpy()
    return probabilities
