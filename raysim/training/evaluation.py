"""Prediction and the MedMNIST metrics: accuracy, macro-F1, macro one-vs-rest AUC, loss."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from raysim.data.dataset import DataInfo, to_tensor

METRICS = ("accuracy", "macro_f1", "auc", "loss")


@torch.no_grad()
def predict_proba(model: nn.Module, x: np.ndarray, info: DataInfo, batch_size: int,
                  device: torch.device,
                  transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> np.ndarray:
    """Class probabilities (float64) of ``model`` in eval mode for stored inputs ``x``
    (``transform``: applied to each normalised batch, e.g. a client's downsampling)."""
    model.eval()
    outputs = []
    for start in range(0, len(x), batch_size):
        batch = to_tensor(x[start:start + batch_size], info).to(device)
        if transform is not None:
            batch = transform(batch)
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
    # imported at the first evaluation, not when a worker starts (scikit-learn takes seconds)
    from sklearn.metrics import accuracy_score, f1_score, log_loss, roc_auc_score

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


def share_metrics(probabilities: np.ndarray, labels: np.ndarray, shares: list[np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """Accuracy, macro-F1 (over the classes among a share's labels and predictions, as
    :func:`classification_metrics`) and loss of pooled predictions on each client's test share
    (vectorised; NaN for an empty share)."""
    sizes = np.array([len(s) for s in shares])
    order = np.concatenate(shares) if shares else np.zeros(0, dtype=np.int64)
    predicted, truth = probabilities[order].argmax(axis=1), labels[order]
    correct = (predicted == truth).astype(float)
    picked = probabilities[order, truth]
    losses = -np.log(np.clip(picked, 1e-15, None))
    owner = np.repeat(np.arange(len(shares)), sizes)
    classes = probabilities.shape[1]
    cells = len(shares) * classes
    true_positives = np.bincount(owner * classes + truth, correct, cells)
    actual = np.bincount(owner * classes + truth, minlength=cells)
    claimed = np.bincount(owner * classes + predicted, minlength=cells)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.bincount(owner, correct, len(shares)) / sizes
        loss = np.bincount(owner, losses, len(shares)) / sizes
        denominator = actual + claimed  # 2 tp + fp + fn
        f1 = np.where(denominator > 0, 2 * true_positives / np.maximum(denominator, 1), 0.0)
        present = (denominator > 0).reshape(len(shares), classes)
        macro_f1 = (f1.reshape(len(shares), classes) * present).sum(1) / present.sum(1)
    return {"accuracy": accuracy, "macro_f1": macro_f1, "loss": loss}


def route_counts(routes: np.ndarray, sources: np.ndarray) -> list[dict[str, int]]:
    """How often samples of each source (client share; -1: the unseen client) took each
    route (-1: the global model, k: client k's model)."""
    pairs, counts = np.unique(np.stack([sources, routes]), axis=1, return_counts=True)
    return [{"source_client": int(s), "chosen": int(c), "count": int(n)}
            for (s, c), n in zip(pairs.T, counts, strict=True)]


def test_sources(num_test: int, shares: list[np.ndarray] | tuple[np.ndarray, ...],
                 unseen: np.ndarray | None) -> np.ndarray:
    """The client whose test share holds each test sample (-1: the unseen client, -2: none)."""
    sources = np.full(num_test, -2, dtype=np.int64)
    for client, share in enumerate(shares):
        sources[share] = client
    if unseen is not None:
        sources[unseen] = -1
    return sources
