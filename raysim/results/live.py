"""Live metrics in TensorBoard and MLflow (``logging:``), streamed by each run's driver beside
its Parquet files, which stay the source of truth: one TensorBoard run and one MLflow run per
seed and variant (TensorBoard's at ``<dir>/<run root's name>/[<variant>/]seed_<s>``, so two
invocations never write into one run), the config as parameters, every evaluated round's
metrics at its round as the step, the final summary, and (from the invocation, once written)
the learning curves.

Both libraries are optional extras, imported only when configured; a missing one is a clear
error before any run starts (:func:`check_available`)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysim.configuration.schema import LoggingConfig
from raysim.errors import ConfigError


def check_available(logging: LoggingConfig) -> None:
    """Exit 2 with one paragraph when a configured backend's library is not installed."""
    import importlib.util

    for key in ("tensorboard", "mlflow"):  # each the package and the extra of that name
        if getattr(logging, key) is not None and importlib.util.find_spec(key) is None:
            raise ConfigError(
                f"Invalid config field `logging.{key}`: it needs the `{key}` package, which "
                f"is not installed. Install it with `pip install -e '.[{key}]'`, or remove "
                f"logging.{key} (the Parquet results need neither).")


def mlflow_uri(value: str, root: Path) -> str:
    """``local``: a SQLite store in the results root; any other value is a tracking URI."""
    return f"sqlite:///{root / 'mlflow.db'}" if value == "local" else value


def prepare_store(logging: LoggingConfig, root: Path, experiments: list[str]) -> None:
    """Create the MLflow store and its experiments once, before the runs' drivers write to it
    concurrently (a SQLite store's tables must not be created by two processes at once)."""
    if logging.mlflow is None:
        return
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri(logging.mlflow, root))
    for name in dict.fromkeys(experiments):
        _experiment_id(client, name, root)


def _experiment_id(client: Any, name: str, root: Path) -> str:
    """The MLflow experiment ``name``, created (artifacts under the results root) if new."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    return str(client.create_experiment(name,
                                        artifact_location=(root / "mlflow-artifacts").as_uri()))


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys with string values (MLflow parameters)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:6000]
    return flat


class MetricStreams:
    """One run's live metrics (in its driver); ``mlflow_run_id`` continues an earlier MLflow run
    after ``--resume``."""

    def __init__(self, logging: LoggingConfig, root: Path, experiment: str, run_name: str,
                 params: Mapping[str, Any], mlflow_run_id: str | None = None):
        self.writer: Any = None
        self.client: Any = None
        self.run_id: str | None = None
        if logging.tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(os.path.join(logging.tensorboard, root.name, run_name))
            self.writer.add_text("config", "\n".join(f"    {k}: {v}"
                                                     for k, v in flatten(params).items()))
        if logging.mlflow is not None:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=mlflow_uri(logging.mlflow, root))
            if mlflow_run_id is None:
                run = self.client.create_run(_experiment_id(self.client, experiment, root),
                                             run_name=run_name,
                                             tags={"raysim.run_dir": str(root)})
                self.run_id = run.info.run_id
                flat = [Param(k, v) for k, v in flatten(params).items()]
                for start in range(0, len(flat), 100):  # MLflow takes 100 per batch
                    self.client.log_batch(self.run_id, params=flat[start:start + 100])
            else:
                self.run_id = mlflow_run_id
                self.client.update_run(self.run_id, status="RUNNING")

    def log_round(self, round_: int, metrics: Mapping[str, float]) -> None:
        """One evaluated round's finite metrics, at its round as the step."""
        finite = {k: float(v) for k, v in metrics.items() if not math.isnan(float(v))}
        if not finite:
            return
        if self.writer is not None:
            for key, value in finite.items():
                self.writer.add_scalar(key, value, round_)
            self.writer.flush()
        self._log_mlflow(finite, round_)

    def _log_mlflow(self, metrics: Mapping[str, float], step: int) -> None:
        if self.client is None or not metrics:
            return
        from mlflow.entities import Metric

        stamp = int(1000 * time.time())
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step)
                                                    for k, v in metrics.items()])

    def finish(self, summary: Mapping[str, Any], status: str) -> None:
        """The final row's metrics as the summary (``final_*``) and the run's end status
        (``completed``, ``failed``, ``interrupted``)."""
        final = {f"final_{k}": float(v) for k, v in summary.items()
                 if isinstance(v, (int, float)) and not isinstance(v, bool)
                 and math.isfinite(float(v)) and "seconds" not in k and "time" not in k}
        if self.writer is not None:
            self.writer.add_hparams({}, final or {"final_round": -1.0}, run_name=".")
            self.writer.close()
        self._log_mlflow(final, 0)
        if self.client is not None:
            self.client.set_terminated(self.run_id, status={
                "completed": "FINISHED", "interrupted": "KILLED"}.get(status, "FAILED"))


def log_artifact(logging: LoggingConfig, root: Path, run_id: str, path: Path) -> None:
    """Attach a file (the learning curves) to an MLflow run."""
    if logging.mlflow is None:
        return
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=mlflow_uri(logging.mlflow, root)).log_artifact(run_id, str(path))
