"""Prediction and the MedMNIST metrics: accuracy and AUC as the ``medmnist`` package's evaluator
computes them for every task type (its own ``getACC``/``getAUC``), macro-F1 and loss."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from raysim.data.dataset import DataInfo, to_tensor
from raysim.data.medmnist_io import medmnist_evaluator

METRICS = ("accuracy", "macro_f1", "auc", "loss")
SEGMENTATION_METRICS = ("dice", "iou", "hd95", "accuracy")
"""A segmentation task's metrics: mean over images of the foreground classes' Dice, IoU and
95th-percentile Hausdorff distance (pixels), and pixel accuracy."""


def metric_names(info: DataInfo) -> tuple[str, ...]:
    """The metric columns of a task (:data:`METRICS`, or :data:`SEGMENTATION_METRICS`)."""
    return SEGMENTATION_METRICS if info.segmentation else METRICS


@torch.no_grad()
def predict_proba(model: nn.Module, x: np.ndarray, info: DataInfo, batch_size: int,
                  device: torch.device,
                  transform: Callable[[torch.Tensor], torch.Tensor] | None = None) -> np.ndarray:
    """Class probabilities (float64) of ``model`` in eval mode for stored inputs ``x``; for a
    multi-label task, each label's sigmoid probability; for a segmentation task the predicted
    masks instead ((N, H, W) uint8 class indices: probabilities per pixel would be too large to
    gather). ``transform``: applied to each normalised batch, e.g. a client's downsampling."""
    model.eval()
    outputs = []
    for start in range(0, len(x), batch_size):
        batch = to_tensor(x[start:start + batch_size], info).to(device)
        if transform is not None:
            batch = transform(batch)
        logits = model(batch).double()
        if info.segmentation:
            outputs.append(logits.argmax(dim=1).to(torch.uint8).cpu().numpy())
            continue
        scores = torch.sigmoid(logits) if info.multi_label else torch.softmax(logits, dim=1)
        outputs.append(scores.cpu().numpy())
    if not outputs:
        return (np.zeros((0, *info.input_shape[1:]), np.uint8) if info.segmentation
                else np.zeros((0, info.num_classes)))
    return np.concatenate(outputs)


def prediction_metrics(labels: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """The metrics of a task's predictions: :func:`segmentation_metrics` for masks (labels
    (N, H, W)), else :func:`classification_metrics`."""
    if labels.ndim == 3:
        return segmentation_metrics(labels, predictions)
    return classification_metrics(labels, predictions)


_SCORE_CHUNK = 256
"""Images scored at a time (bounds the one-hot tensors' memory at large sizes)."""
_last_scored: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
"""The last (masks, predictions, scores): a round's pooled metrics and its per-client shares
score the same predictions, and HD95 takes seconds per few hundred images."""


def segmentation_scores(masks: np.ndarray, predicted: np.ndarray) -> dict[str, np.ndarray]:
    """Each image's Dice, IoU and HD95 (MONAI's ``compute_dice``, ``compute_iou`` and
    ``compute_hausdorff_distance`` at the 95th percentile, in pixels), averaged over the
    foreground classes present in its truth or its prediction, and its pixel accuracy. An image
    with no foreground in either scores Dice and IoU 1; HD95 is NaN where the truth or the
    prediction of every present class is empty. Scores of the same two arrays as the last call
    are returned without being computed again."""
    if _last_scored and _last_scored[0][0] is masks and _last_scored[0][1] is predicted:
        return _last_scored[0][2]
    parts = [_score_chunk(masks[start:start + _SCORE_CHUNK],
                          predicted[start:start + _SCORE_CHUNK])
             for start in range(0, len(masks), _SCORE_CHUNK)]
    scores = {name: np.concatenate([part[name] for part in parts]) for name in parts[0]} \
        if parts else {name: np.zeros(0) for name in SEGMENTATION_METRICS}
    _last_scored[:] = [(masks, predicted, scores)]
    return scores


def _score_chunk(masks: np.ndarray, predicted: np.ndarray) -> dict[str, np.ndarray]:
    import warnings

    from monai.metrics import compute_dice, compute_hausdorff_distance, compute_iou

    classes = max(2, int(max(masks.max(initial=0), predicted.max(initial=0))) + 1)
    truth = torch.nn.functional.one_hot(torch.from_numpy(masks.astype(np.int64)), classes)
    guess = torch.nn.functional.one_hot(torch.from_numpy(predicted.astype(np.int64)), classes)
    truth, guess = truth.permute(0, 3, 1, 2).float(), guess.permute(0, 3, 1, 2).float()
    present = ((truth.sum((2, 3)) > 0) | (guess.sum((2, 3)) > 0))[:, 1:].numpy()
    dice = compute_dice(guess, truth, include_background=False, ignore_empty=False).numpy()
    iou = compute_iou(guess, truth, include_background=False, ignore_empty=False).numpy()
    with warnings.catch_warnings():  # an empty prediction or truth: MONAI warns, gives inf/nan
        warnings.simplefilter("ignore")
        hd95 = compute_hausdorff_distance(guess, truth, include_background=False,
                                          percentile=95).numpy()
    hd95 = np.where(np.isfinite(hd95) & present, hd95, np.nan)
    none = ~present.any(axis=1)  # no foreground anywhere: a perfect empty prediction

    def per_image(values: np.ndarray) -> np.ndarray:
        kept = np.where(present, values, 0.0).sum(axis=1) / np.maximum(present.sum(axis=1), 1)
        return np.where(none, 1.0, kept)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"dice": per_image(dice), "iou": per_image(iou),
                "hd95": np.nanmean(hd95, axis=1),
                "accuracy": (masks == predicted).reshape(len(masks), -1).mean(axis=1)}


def segmentation_metrics(masks: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """:func:`segmentation_scores` averaged over the images (NaN-aware; NaN when empty)."""
    if len(masks) == 0:
        return dict.fromkeys(SEGMENTATION_METRICS, math.nan)
    scores = segmentation_scores(masks, predicted)
    return {name: _finite_mean(values) for name, values in scores.items()}


def _finite_mean(values: np.ndarray) -> float:
    """The mean of the finite values (NaN when there is none)."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def medmnist_task(labels: np.ndarray, probs: np.ndarray) -> str:
    """The task name of MedMNIST's evaluator for predictions of this shape (ordinal regression
    is scored as multi-class, as the evaluator does)."""
    if labels.ndim == 2:
        return "multi-label, binary-class"
    return "binary-class" if probs.shape[1] == 2 else "multi-class"


def classification_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro-F1, AUC and cross-entropy of predictions.

    Accuracy and AUC are the ``medmnist`` package's ``getACC``/``getAUC`` for the task (for
    multi-label data: per-label accuracy at threshold 0.5 and per-label AUC, each averaged over
    the labels; the loss is then the binary cross-entropy averaged over labels). Where a class
    (or label) has no positives or no negatives among ``labels`` (a small client share),
    medmnist's AUC is undefined and the AUC averages the classes where it is defined (NaN when
    none is).
    """
    if len(labels) == 0:
        return dict.fromkeys(METRICS, math.nan)
    # imported at the first evaluation, not when a worker starts (scikit-learn takes seconds)
    from sklearn.metrics import f1_score, log_loss

    evaluator = medmnist_evaluator()
    task = medmnist_task(labels, probs)
    if labels.ndim == 2:
        predicted = probs > 0.5
        macro_f1 = f1_score(labels, predicted, average="macro", zero_division=np.nan)
        loss = np.mean(_label_cross_entropy(labels, probs))
    else:
        predicted = probs.argmax(axis=1)
        macro_f1 = f1_score(labels, predicted, average="macro",
                            labels=np.unique(np.concatenate([labels, predicted])),
                            zero_division=0)
        loss = log_loss(labels, probs, labels=list(range(probs.shape[1])))
    if _classes_with_both(*_one_vs_rest(labels, probs)).all():
        auc = float(evaluator.getAUC(labels, probs, task))
    else:  # a class without positives or negatives: medmnist's AUC is undefined
        defined = label_aucs(labels, probs)
        auc = float(np.nanmean(defined)) if np.isfinite(defined).any() else math.nan
    if len(labels) > 1:
        accuracy = float(evaluator.getACC(labels, probs, task))
    else:  # the evaluator squeezes its inputs, which breaks on one sample: the same rule
        accuracy = float(np.mean(predicted == labels))
    return {"accuracy": accuracy, "macro_f1": float(macro_f1), "auc": auc, "loss": float(loss)}


def label_aucs(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Each class's one-vs-rest AUC (each label's AUC for multi-label data; the positive
    class's alone for binary data), NaN where the class has no positives or no negatives."""
    from sklearn.metrics import roc_auc_score

    truth, columns = _one_vs_rest(labels, probs)
    both = _classes_with_both(truth, columns)
    return np.array([roc_auc_score(truth[:, k], probs[:, k]) if defined else math.nan
                     for k, defined in zip(columns, both, strict=True)])


def _one_vs_rest(labels: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """(0/1 truth per class or label, the score columns that have an AUC: every one, or the
    positive class's alone for binary data)."""
    truth = labels if labels.ndim == 2 else (labels[:, None] == np.arange(probs.shape[1]))
    binary = labels.ndim == 1 and probs.shape[1] == 2
    return truth, [probs.shape[1] - 1] if binary else list(range(probs.shape[1]))


def _classes_with_both(truth: np.ndarray, columns: list[int]) -> np.ndarray:
    """Per AUC column of :func:`_one_vs_rest` (its ``truth`` and ``columns``): whether the
    labels hold both positives and negatives of it (else its AUC is undefined)."""
    positives = truth[:, columns].sum(axis=0)
    return (positives > 0) & (positives < len(truth))


def _label_cross_entropy(labels: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Each sample's binary cross-entropy averaged over its labels (multi-label data)."""
    clipped = np.clip(probs, 1e-15, 1 - 1e-15)
    return -np.where(labels.astype(bool), np.log(clipped), np.log1p(-clipped)).mean(axis=1)


def share_metrics(probabilities: np.ndarray, labels: np.ndarray, shares: list[np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """Accuracy, macro-F1 (over the classes among a share's labels and predictions, as
    :func:`classification_metrics`) and loss of pooled predictions on each client's test share
    (vectorised; NaN for an empty share)."""
    if labels.ndim == 2:
        return _multi_label_share_metrics(probabilities, labels, shares)
    if labels.ndim == 3:  # segmentation: the mean of each share's images' scores
        scores = segmentation_scores(labels, probabilities)
        return {name: np.array([_finite_mean(values[share]) for share in shares])
                for name, values in scores.items()}
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


def _multi_label_share_metrics(probabilities: np.ndarray, labels: np.ndarray,
                               shares: list[np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`share_metrics` for multi-label data: per-label accuracy at 0.5 and binary
    cross-entropy averaged over labels, macro-F1 over the labels among a share's truths and
    predictions."""
    sizes = np.array([len(s) for s in shares])
    order = np.concatenate(shares) if shares else np.zeros(0, dtype=np.int64)
    owner = np.repeat(np.arange(len(shares)), sizes)
    truth, scores = labels[order].astype(bool), probabilities[order]
    predicted = scores > 0.5
    losses = _label_cross_entropy(truth, scores)

    def per_client(values: np.ndarray) -> np.ndarray:  # (samples, labels) -> (clients, labels)
        return np.stack([np.bincount(owner, values[:, k], len(shares))
                         for k in range(values.shape[1])], axis=1)

    true_positives = per_client((truth & predicted).astype(float))
    denominator = per_client(truth.astype(float)) + per_client(predicted.astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.bincount(owner, (truth == predicted).mean(axis=1), len(shares)) / sizes
        loss = np.bincount(owner, losses, len(shares)) / sizes
        f1 = np.where(denominator > 0, 2 * true_positives / np.maximum(denominator, 1), 0.0)
        present = denominator > 0
        macro_f1 = (f1 * present).sum(1) / present.sum(1)
    return {"accuracy": accuracy, "macro_f1": macro_f1, "loss": loss}


def route_counts(routes: np.ndarray, sources: np.ndarray) -> list[dict[str, int]]:
    """How often samples of each source (client share; -1: the unseen client) took each
    route (-1: the global model, k: client k's model)."""
    pairs, counts = np.unique(np.stack([sources, routes]), axis=1, return_counts=True)
    return [{"source_client": int(s), "chosen": int(c), "count": int(n)}
            for (s, c), n in zip(pairs.T, counts, strict=True)]


def test_sources(num_test: int, shares: Sequence[np.ndarray],
                 unseen: np.ndarray | None) -> np.ndarray:
    """The client whose test share holds each test sample (-1: the unseen client, -2: none)."""
    sources = np.full(num_test, -2, dtype=np.int64)
    for client, share in enumerate(shares):
        sources[share] = client
    if unseen is not None:
        sources[unseen] = -1
    return sources
