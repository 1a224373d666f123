"""Evaluation of a round on the driver: server-side models on the pooled test set, on every
client's own test share and on a held-out client's share (predictions computed in fixed chunks
spread over the workers), and personal models on their workers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray

from raysim.algorithms.contract import RunAlgorithm
from raysim.configuration.schema import EvaluationConfig
from raysim.engine.run import driver_turns as turns
from raysim.results.sink import ParquetSink
from raysim.rounds.round_loop import Evaluation
from raysim.training.evaluation import (
    label_aucs,
    metric_names,
    prediction_metrics,
    route_counts,
    share_metrics,
)

_EVAL_CHUNK = 256  # fixed test-set chunks: predictions do not depend on the worker count


class Evaluator:
    """Evaluates one run's models; writes ``client_eval`` and ``selection`` rows."""

    def __init__(self, algorithm: RunAlgorithm, test_y: np.ndarray,
                 shares: Sequence[np.ndarray], unseen: np.ndarray | None,
                 sources: np.ndarray, settings: EvaluationConfig,
                 validation_y: np.ndarray | None = None):
        self.algorithm = algorithm
        self.test_y = test_y
        self.validation_y = validation_y if validation_y is not None and len(validation_y) else None
        self.shares = shares
        self.unseen = unseen
        self._sources = sources
        self.settings = settings

    def evaluate(self, workers: list[Any], state: Any, round_: int,
                 clients_by_worker: dict[int, list[int]], sink: ParquetSink,
                 last: bool = False) -> Evaluation:
        """Server-side models on the pooled test set (and on each client's share and the unseen
        client's share), then personal models on the workers, and after the ``last`` round
        the fine-tuned global model of every client (``evaluation.fine_tune_epochs``); writes
        client_eval and selection rows and returns the round's metric columns (stopping at
        the first server model whose predictions are not finite: the run diverged)."""
        metrics = metric_names(self.algorithm.context.info)
        row = dict.fromkeys(metrics, math.nan)
        models = self.algorithm.evaluation_models(state)
        shares, unseen = self.shares, self.unseen
        per_client: dict[str, np.ndarray] = {}
        if self.validation_y is not None:  # server models on the pooled validation set
            for name, (probabilities, _) in self._predict(workers, models, "validation",
                                                          len(self.validation_y)).items():
                if np.isfinite(probabilities).all():
                    row.update(_prefixed(prediction_metrics(self.validation_y,
                                                                probabilities), f"{name}val_"))
        for name, (probabilities, routes) in self._predict(workers, models, "test",
                                                           len(self.test_y)).items():
            if not np.isfinite(probabilities).all():
                return Evaluation(row, model_diverged=True)
            row.update(_prefixed(prediction_metrics(self.test_y, probabilities), name))
            if self.test_y.ndim == 2:  # multi-label: every label's AUC beside their mean
                row.update(_prefixed(self._label_aucs(probabilities), name))
            if unseen is not None and len(unseen):
                row.update(_prefixed(prediction_metrics(self.test_y[unseen],
                                                            probabilities[unseen]),
                                     f"{name}unseen_"))
            if self.settings.clients and shares:
                scores = share_metrics(probabilities, self.test_y, list(shares))
                for metric, values in scores.items():
                    per_client[f"{name or 'main_'}own_{metric}"] = values
                    row[f"{name}own_{metric}"] = float(np.nanmean(values))
            if routes is not None:
                sink.add("selection", [{"round": round_, "model": name or "main", **counts}
                                       for counts in route_counts(routes, self._sources)])
        personal_rows = []
        # personal models: always when they are the only models, else when asked for
        if self.algorithm.personalized and (self.settings.clients or not models):
            base = self.algorithm.personal_base(state)
            base_ref = None if base is None else ray.put(dict(base))
            personal_rows = sorted(
                (r for rows in turns.get([workers[w].evaluate_clients.remote(round_, clients,
                                                                             base_ref)
                                        for w, clients in sorted(clients_by_worker.items())])
                 for r in rows), key=lambda r: r["client"])
            row.update(_mean_client_metrics(personal_rows, metrics, "own_", "personal_"))
            if not models:  # no global model: the clients' models on the global test set
                row.update(_mean_client_metrics(personal_rows, metrics, "global_", ""))
            if any("val_accuracy" in r for r in personal_rows):  # and on their validation shares
                row.update(_mean_client_metrics(personal_rows, metrics, "val_", "personal_val_"))
                if not models:
                    row.update(_mean_client_metrics(personal_rows, metrics, "val_", "val_"))
            if any("pooled_val_accuracy" in r for r in personal_rows):  # the global test set's
                # counterpart for selection: each personal model on the pooled validation set
                row.update(_mean_client_metrics(personal_rows, metrics, "pooled_val_", "pooled_val_"))
        if per_client:  # server models' per-client columns join the personal models' rows
            by_client = {r["client"]: r for r in personal_rows}
            for client in range(len(shares)):
                entry = by_client.setdefault(client, {"round": round_, "client": client})
                entry.update({key: float(values[client]) for key, values in per_client.items()})
            personal_rows = [by_client[c] for c in sorted(by_client)]
        if last and self.settings.fine_tune_epochs:
            personal_rows = self._fine_tuned(workers, state, round_, clients_by_worker,
                                             personal_rows, row, metrics)
        sink.add("client_eval", personal_rows)
        return Evaluation(row)

    def _fine_tuned(self, workers: list[Any], state: Any, round_: int,
                    clients_by_worker: dict[int, list[int]],
                    personal_rows: list[dict[str, Any]], row: dict[str, Any],
                    metrics: tuple[str, ...]) -> list[dict[str, Any]]:
        """"+FT": every client fine-tunes the final global model on its own training share
        (on the worker that holds it); its ``ft_`` columns join the client's row, their means
        the round's (``ft_own_*``: each client on its own test share, ``ft_val_*`` on its
        validation share, ``ft_global_*`` on the pooled test set)."""
        start = self.algorithm.global_weights(state)
        assert start is not None, "the run's checks refuse +FT without a global model"
        start_ref = ray.put(dict(start))
        epochs = self.settings.fine_tune_epochs
        tuned = [r for rows in turns.get([
            workers[w].fine_tune_clients.remote(round_, clients, start_ref, epochs)
            for w, clients in sorted(clients_by_worker.items())]) for r in rows]
        for source in ("ft_own_", "ft_val_", "ft_global_"):
            if any(source + metrics[0] in r for r in tuned):
                row.update(_mean_client_metrics(tuned, metrics, source, source))
        by_client = {r["client"]: r for r in personal_rows}
        for entry in tuned:
            by_client.setdefault(entry["client"], {"round": round_}).update(entry)
        return [by_client[c] for c in sorted(by_client)]

    def _label_aucs(self, probabilities: np.ndarray) -> dict[str, float]:
        """``auc_<label name>`` (``auc_label_<k>`` without names) on the pooled test set."""
        names = self.algorithm.context.info.label_names
        values = label_aucs(self.test_y, probabilities)
        return {f"auc_{names[k] if k < len(names) else f'label_{k}'}": float(value)
                for k, value in enumerate(values)}

    def _predict(self, workers: list[Any], models: dict[str, Any], split: str, size: int
                 ) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Every evaluation model's predictions on the whole test (or validation) set, computed
        in fixed chunks spread over the workers (the result does not depend on the worker
        count)."""
        if not models:
            return {}
        models_ref = ray.put(models)
        bounds = [(s, min(s + _EVAL_CHUNK, size)) for s in range(0, size, _EVAL_CHUNK)]
        assigned = [bounds[i::len(workers)] for i in range(len(workers))]
        outputs = turns.get([w.predict_test.remote(models_ref, chunks, split)
                           for w, chunks in zip(workers, assigned, strict=True) if chunks])
        results = {}
        for name in models:
            ordered: list[Any] = [None] * len(bounds)
            for worker_index, output in enumerate(outputs):
                for position, chunk in enumerate(output[name]):
                    ordered[worker_index + position * len(workers)] = chunk
            probabilities = np.concatenate([probs for probs, _ in ordered])
            routes = (None if ordered[0][1] is None
                      else np.concatenate([r for _, r in ordered]))
            results[name] = (probabilities, routes)
        return results


def _prefixed(metrics: dict[str, float], prefix: str) -> dict[str, float]:
    return {f"{prefix}{key}": value for key, value in metrics.items()}


def _mean_client_metrics(rows: list[dict[str, Any]], metrics: tuple[str, ...], source: str,
                         target: str) -> dict[str, float]:
    """Mean over clients of each metric (NaN-aware; NaN when no client has one)."""
    means = {}
    for metric in metrics:
        values = np.array([r.get(source + metric, math.nan) for r in rows], dtype=float)
        means[target + metric] = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
    return means
