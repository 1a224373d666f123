"""Prediction and the MedMNIST metrics: accuracy, macro-F1, macro one-vs-rest AUC, loss."""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score
from torch import nn

from raysim.data.dataset import DataInfo, to_tensor

METRICS = ("accuracy", "macro_f1", "auc", "loss")


@torch.no_grad()
def predict_proba(model: nn.Module, x: np.ndarray, info: DataInfo, batch_size: int,
                  device: torch.device) -> np.ndarray:
    """Class probabilities (float64) of ``model`` in eval mode for stored inputs ``x``."""
    model.eval()
    outputs = []
    for start in range(0, len(x), batch_size):
        batch = to_tensor(x[start:start + batch_size], info).to(device)
        outputs.append(torch.softmax(model(batch).double(), dim=1).cpu().numpy())
    if not outputs:
        return np.zeros((0, info.num_classes))
    return np.concatenate(outputs)


def classification_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1, macro one-vs-rest AUC and cross-entropy of predictions.

    AUC averages the per-class one-vs-rest AUCs over the classes that have both positives and
    negatives in ``labels`` (NaN when none has), as MedMNIST's evaluator does for its test set.
    """
    if len(labels) == 0:
        return dict.fromkeys(METRICS, math.nan)
    num_classes = probs.shape[1]
    predicted = probs.argmax(axis=1)
    aucs = [
        roc_auc_score(labels == cls, probs[:, cls])
        for cls in range(num_classes)
        if 0 < (labels == cls).sum() < len(labels)
    ]
    if num_classes == 2 and aucs:
        aucs = aucs[1:]  # binary: the AUC of the positive class (both entries are equal)
    return {
        "accuracy": float(accuracy_score(labels, predicted)),
        "macro_f1": float(f1_score(labels, predicted, average="macro",
                                   labels=np.unique(np.concatenate([labels, predicted])),
                                   zero_division=0)),
        "auc": float(np.mean(aucs)) if aucs else math.nan,
        "loss": float(log_loss(labels, probs, labels=list(range(num_classes)))),
    }
