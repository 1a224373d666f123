"""The Driver actor: runs the rounds of one run (one seed) on its own pool of workers."""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from raysim.configuration.schema import EngineConfig, EvaluationConfig, LoggingConfig
from raysim.engine.launch.ray_internals import unreserved_cpus
from raysim.engine.run import driver_turns as turns
from raysim.engine.run.cluster_links import worker_order, worker_spans
from raysim.engine.run.ray_workers import Placement, RayWorkers, TransferRecords
from raysim.engine.run.server_evaluation import Evaluator
from raysim.engine.run.worker import WorkerSetup
from raysim.errors import (
    DivergenceError,
    RaysimError,
    ResultsNotWritable,
    RunError,
    WorkerFailureError,
)
from raysim.layers.assembly import assemble, build_loop
from raysim.layers.feature import RunStart
from raysim.results.live import MetricStreams
from raysim.results.manifest import update_manifest
from raysim.results.sink import ParquetSink
from raysim.rounds.checkpoint import Checkpoint, load_checkpoint, remove_checkpoint, truncate_results
from raysim.rounds.final_models import KeepFinalModels
from raysim.rounds.placement import (
    assign_groups,
    client_groups,
    group_of_client,
    per_sample_costs,
)
from raysim.rounds.round_callbacks import (
    Checkpointing,
    DivergenceStop,
    EvaluationSchedule,
    LiveMetrics,
    MembershipAudit,
    StateResidencyNotices,
    StopAtRoundBoundary,
    StoppedAtRoundBoundary,
)
from raysim.rounds.round_loop import (
    Dispatch,
    Durable,
    LoopProgress,
    RoundCallback,
    RoundLoop,
)
from raysim.vectors import blocked_sum

_RESTART_TIMEOUT = 300.0  # seconds to wait for Ray to restart a dead worker
_WAIT_STEP = 5.0  # seconds between looks at the workers (and at a stop request) meanwhile
_NODE_GRACE = float(os.environ.get("RAYSIM_NODE_GRACE_SECONDS", "60"))
"""Seconds a cluster may hold fewer CPUs than a run's workers need (a node died) before the
run stops instead of waiting for a replacement (``RAYSIM_NODE_GRACE_SECONDS``)."""


class _CapacityWatch:
    """How long the cluster's alive nodes have held fewer CPUs than ``needed``."""

    def __init__(self, needed: float):
        self.needed, self.cpus = needed, 0.0
        self._since: float | None = None

    def lost_for(self) -> float | None:
        """Seconds the cluster has been short of CPUs (None: it is not)."""
        self.cpus = float(ray.cluster_resources().get("CPU", 0.0))
        if self.cpus >= self.needed:
            self._since = None
            return None
        now = time.monotonic()
        self._since = self._since if self._since is not None else now
        return now - self._since


@dataclass(frozen=True)
class RunSpec:
    """One run: where it writes, its seed's setup and the engine resources."""

    run_dir: str
    setup: WorkerSetup
    rounds: int
    engine: EngineConfig
    evaluation: EvaluationConfig
    use_gpus: bool
    resume: bool = False
    """Continue from the run directory's checkpoint (or from round 0 without one)."""
    client_test_shares: Sequence[np.ndarray] = ()
    """Each client's test share (also for pooled runs, whose one client holds all data)."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Live metrics beside the Parquet files (TensorBoard, MLflow)."""
    live_names: tuple[str, str, str] = ("", "", "")
    """(results root, experiment name, run name) for the live metrics."""
    params: dict[str, Any] = field(default_factory=dict)
    """The run's config (MLflow parameters)."""


@dataclass(frozen=True)
class _Layout:
    """Where clients live: fixed client groups, and the worker that owns each group."""

    groups: list[np.ndarray]
    owner_of_group: dict[int, int]
    group_of_client: np.ndarray
    worker_of_client: np.ndarray
    clients_by_worker: dict[int, list[int]]


def _fetch(array: Any) -> Any:
    """An array that may travel as an object-store reference."""
    return turns.get(array) if isinstance(array, ray.ObjectRef) else array


class Driver:
    """Runs the round loop: sampling, dispatch to workers, aggregation, evaluation, results,
    checkpoints, and recovery from dying workers."""

    def __init__(self, spec: RunSpec, workers: list[Any]):
        self.spec = spec
        self.workers = workers
        """The run's worker actors (borrowed from the pool, configured by :meth:`run`)."""
        self.run_dir = Path(spec.run_dir)
        setup = spec.setup
        self.context = setup.context
        self.parts = assemble(setup.algorithm_class, setup.algorithm_params, setup.context)
        """The algorithm in its features' layers, and what the features add to the rounds."""
        self.algorithm = self.parts.algorithm
        self.test_y = _fetch(setup.arrays["test_y"])
        if self.algorithm.server_holds_inputs:
            self.algorithm.attach_server_inputs(_fetch(setup.arrays["train_x"]),
                                                setup.partition.train)
        self._progress: dict[str, Any] = {"round": 0, "rounds": spec.rounds, "status": "queued",
                                          "accuracy": math.nan}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._streams: MetricStreams | None = None
        """Set by :meth:`request_stop`: stop at the next round boundary."""
        self._loop_progress = LoopProgress(Durable(0, None, {}), recorded=0)
        self._recoveries: list[dict[str, Any]] = []
        self._node = ray.get_runtime_context().get_node_id()
        """The node this driver runs on."""
        self._worker_nodes: list[str] = []
        """The node of each worker (from their last configuration)."""
        validation_y = (None if setup.validation_index is None
                        else _fetch(setup.arrays["train_y"])[setup.validation_index])
        assert setup.test_sources is not None, "the runner gives every run its test sources"
        self._evaluator = Evaluator(self.algorithm, self.test_y, spec.client_test_shares,
                                    setup.partition.unseen, setup.test_sources, spec.evaluation,
                                    validation_y)

    def progress(self) -> dict[str, Any]:
        """Latest round, accuracy and status (callable while ``run`` is going)."""
        with self._lock:
            return dict(self._progress)

    def request_stop(self) -> None:
        """Stop at the next round boundary: the round in flight finishes and is recorded, then
        the rows and a checkpoint are written and :meth:`run` returns ``{"interrupted": next
        round}`` (callable while ``run`` is going)."""
        self._stop.set()
        self._set_progress(status="stopping")

    def _set_progress(self, **fields: Any) -> None:
        with self._lock:
            self._progress.update(fields)

    def run(self) -> dict[str, Any]:
        """Run every round; returns the final rounds row. Rows written so far are kept on error."""
        checkpoint = None
        if self.spec.resume:
            try:
                checkpoint = load_checkpoint(self.run_dir)
            except RaysimError as refused:  # the manifest must not go on saying `running`
                with contextlib.suppress(ResultsNotWritable):
                    update_manifest(self.run_dir, status="failed", finished=time.time(),
                                    error=f"{type(refused).__name__}: {refused}")
                raise
            truncate_results(self.run_dir, checkpoint.next_part if checkpoint else 0)
        sink = ParquetSink(self.run_dir, self.spec.engine.flush_seconds)
        update_manifest(self.run_dir, driver={"pid": os.getpid(), "node_id": self._node,
                                              "reduction_threads": blocked_sum.threads()})
        self._streams = self._open_streams()
        try:
            self._set_progress(status="waiting for resources")
            workers = self.workers
            try:
                # made while the workers configure and take their groups
                self.parts.before_rounds(RunStart(self.context, self.spec.setup.partition,
                                                  self.spec.setup.initial_weights,
                                                  _on_worker(workers[0])))
                update_manifest(self.run_dir, workers=self._configure(workers),
                                workers_ready_at=time.time())
                self._set_progress(status="running")
                final = self._round_loop(workers, sink, checkpoint)
            except StoppedAtRoundBoundary as stopped:
                sink.flush()
                update_manifest(self.run_dir, status="interrupted", interrupted=time.time(),
                                interrupted_before_round=stopped.next_round)
                self._set_progress(status="interrupted")
                self._finish_streams({}, "interrupted")
                return {"interrupted": stopped.next_round}
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, RunError):  # a worker's clear message, not a bug
                    raise error.cause from None
                raise
            sink.flush()
            remove_checkpoint(self.run_dir)
            reason = final.get("stop_reason") if isinstance(final.get("stop_reason"), str) \
                else None  # the privacy budget ended the run before its configured rounds
            update_manifest(self.run_dir, status="completed" if reason is None else "stopped",
                            finished=time.time(), **({} if reason is None else
                                                     {"stop_reason": reason}))
            self._set_progress(status="done" if reason is None else "stopped")
            self._finish_streams(final, "completed")
            return final
        except BaseException as exc:
            disk_full = isinstance(exc, ResultsNotWritable)
            with contextlib.suppress(ResultsNotWritable):  # (a disk's error: raised below)
                sink.flush()
            with contextlib.suppress(ResultsNotWritable):
                update_manifest(  # (a disk's error needs no traceback, and room for one)
                    self.run_dir,
                    status="diverged" if isinstance(exc, DivergenceError) else "failed",
                    finished=time.time(), error=f"{type(exc).__name__}: {exc}",
                    **({} if disk_full else {"traceback": traceback.format_exc()}))
            self._set_progress(status="failed")
            self._finish_streams({}, "failed")
            raise

    # ----- live metrics -----
    def _open_streams(self) -> MetricStreams | None:
        """TensorBoard and MLflow writers of this run when ``logging:`` asks for them (a
        resumed run continues its MLflow run)."""
        logging = self.spec.logging
        if logging.tensorboard is None and logging.mlflow is None:
            return None
        from raysim.results.manifest import read_manifest

        root, experiment, run_name = self.spec.live_names
        streams = MetricStreams(logging, Path(root), experiment, run_name, self.spec.params,
                                read_manifest(self.run_dir).get("mlflow_run_id"))
        if streams.run_id is not None:
            update_manifest(self.run_dir, mlflow_run_id=streams.run_id)
        return streams

    def _finish_streams(self, final: dict[str, Any], status: str) -> None:
        if self._streams is not None:
            self._streams.finish(final, status)

    # ----- setup -----
    def _configure(self, workers: list[Any]) -> list[dict[str, Any]]:
        """Bind every worker to this run (also after Ray restarted one); returns where each
        runs."""
        described = turns.get([worker.configure.remote(self.spec.setup, index)
                               for index, worker in enumerate(workers)])
        self._worker_nodes = [worker["node_id"] for worker in described]
        return described

    def _layout(self, num_workers: int) -> _Layout:
        partition = self.spec.setup.partition
        groups = client_groups(partition.num_clients, self.spec.engine.client_groups)
        loads = partition.sizes().astype(np.float64)
        if num_workers > 1 and (costs := per_sample_costs(self.algorithm)) is not None:
            loads = loads * costs
        owner_of_group = {}
        # the workers of one node hold adjacent ranges, so their partials merge on the node
        order = worker_order(self._worker_nodes, self._node) \
            if len(self._worker_nodes) == num_workers else list(range(num_workers))
        ranges = assign_groups([float(loads[g].sum()) for g in groups], num_workers)
        for worker, owned in zip(order, ranges, strict=True):
            for g in owned:
                owner_of_group[g] = worker
        group_of_each = group_of_client(groups)
        worker_of_client = np.array([owner_of_group[g] for g in group_of_each])
        clients_by_worker: dict[int, list[int]] = defaultdict(list)
        for g, clients in enumerate(groups):
            clients_by_worker[owner_of_group[g]].extend(int(c) for c in clients)
        return _Layout(groups, owner_of_group, group_of_each, worker_of_client,
                       dict(clients_by_worker))

    # ----- rounds -----
    def _round_loop(self, workers: list[Any], sink: ParquetSink,
                    checkpoint: Checkpoint | None) -> dict[str, Any]:
        """Run the rounds; when a worker dies, wait for Ray to restart it, roll every client
        back to the last durable state and replay the rounds since then without writing
        their rows again."""
        layout = self._layout(len(workers))
        if checkpoint is None:
            initial = self.algorithm.init_server_state(self.spec.setup.initial_weights)
            durable = Durable(0, initial, {})
        else:
            durable = Durable(checkpoint.next_round, checkpoint.server_state,
                              checkpoint.client_states)
            update_manifest(self.run_dir, resumed_from=checkpoint.next_round)
        self._loop_progress = LoopProgress(durable, recorded=durable.next_round,
                                           stateful=bool(durable.client_states))
        self._set_progress(round=durable.next_round)
        self._prepare_workers(workers, layout)
        while True:
            try:
                return self._rounds(workers, layout, sink)
            except ray.exceptions.RayActorError as error:
                self._recover(workers, layout, error)

    def _prepare_workers(self, workers: list[Any], layout: _Layout) -> None:
        """Tell every worker its clients' groups and give it their durable states."""
        self._send_groups(workers, layout.group_of_client, layout.worker_of_client)
        states = self._loop_progress.durable.client_states
        if states or self._loop_progress.stateful:
            owner = layout.worker_of_client
            turns.get([worker.restore_states.remote(
                {c: s for c, s in states.items() if owner[c] == w})
                for w, worker in enumerate(workers)])

    def _recover(self, workers: list[Any], layout: _Layout, error: Exception) -> None:
        recorded = self._loop_progress.recorded
        failures = len(self._recoveries) + 1
        limit = self.spec.engine.max_worker_failures
        if failures > limit:
            raise WorkerFailureError(
                f"A worker actor died for the {failures}th time in this run (last: {error}); "
                f"engine.max_worker_failures={limit} restarts are allowed. Rows of rounds "
                f"0-{recorded - 1} are kept in {self.run_dir}; find the cause in the "
                "Ray logs (e.g. out of memory), then continue with `raysim run CONFIG --resume`."
            ) from None
        self._set_progress(status=f"recovering from a dead worker ({failures}/{limit})")
        deadline = time.monotonic() + _RESTART_TIMEOUT
        short = _CapacityWatch(len(workers) * self.spec.engine.cpus_per_worker)
        while True:  # Ray restarts dead actors (max_restarts); wait until all answer
            if self._stop.is_set():  # Ctrl-C or SIGTERM while waiting: stop at the durable state
                raise StoppedAtRoundBoundary(self._loop_progress.durable.next_round)
            try:
                turns.get([worker.describe.remote() for worker in workers],
                        timeout=_WAIT_STEP)
                described = self._configure(workers)  # a restarted actor starts unconfigured
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                lost = short.lost_for()
                if lost is not None and lost > _NODE_GRACE:
                    raise WorkerFailureError(
                        f"A worker actor died ({error}) and the cluster's nodes left hold "
                        f"{short.cpus:g} CPUs, fewer than this run's workers need "
                        f"({short.needed:g}): a node died and none took its place within "
                        f"{_NODE_GRACE:.0f} s. Rows of rounds 0-{recorded - 1} are kept in "
                        f"{self.run_dir}; continue with `raysim run CONFIG --resume` once the "
                        "cluster has the CPUs again (or with fewer workers, `--set "
                        "engine.num_workers=N`: the numbers do not depend on it)."
                    ) from None
                if time.monotonic() > deadline:
                    raise WorkerFailureError(
                        f"A worker actor died ({error}) and was not restarted within "
                        f"{_RESTART_TIMEOUT:.0f} s. Rows of rounds 0-{recorded - 1} are kept "
                        f"in {self.run_dir}; continue with `raysim run CONFIG --resume`."
                    ) from None
                with turns.released():
                    time.sleep(0.5)
        self._prepare_workers(workers, layout)
        self._recoveries.append({"failed_at": time.time(), "rolled_back_to":
                                 self._loop_progress.durable.next_round,
                                 "rounds_recorded": recorded, "error": str(error)[:500]})
        update_manifest(self.run_dir, workers=described, recoveries=self._recoveries)
        self._set_progress(status="running")

    def _rounds(self, workers: list[Any], layout: _Layout, sink: ParquetSink) -> dict[str, Any]:
        """One pass of the round loop from the durable state to the end."""
        spec, context = self.spec, self.context
        rounds = self.parts.rounds(spec.rounds)  # a feature may allow fewer (DP's budget)
        evaluation = EvaluationSchedule(
            spec.evaluation.every, rounds,
            lambda state, round_: self._evaluator.evaluate(workers, state, round_,
                                                           layout.clients_by_worker, sink,
                                                           last=round_ + 1 >= rounds),
            final=spec.evaluation.final_rounds)
        ray_workers = RayWorkers(workers, Placement(self._worker_nodes, self._node,
                                                    worker_spans(layout.owner_of_group),
                                                    spec.engine.count_transfers))
        loop = build_loop(
            self.parts, context, spec.rounds, worker_of_client=layout.worker_of_client,
            workers=ray_workers, sink=sink, progress=self._loop_progress,
            callbacks=[_FirstDispatchStamp(self.run_dir, first=not self._recoveries), evaluation,
                       DivergenceStop(self.run_dir), StateResidencyNotices(self.run_dir),
                       MembershipAudit(spec.setup.membership_audit, spec.rounds),
                       Checkpointing(spec.engine.checkpoint_every, spec.rounds, self.run_dir,
                                     context.seed, spec.engine.checkpoint_seconds,
                                     share=spec.engine.checkpoint_share),
                       StopAtRoundBoundary(self._stop.is_set, spec.rounds, self.run_dir,
                                           context.seed),
                       *([LiveMetrics(self._streams)] if self._streams else []),
                       *([KeepFinalModels(rounds, self.run_dir, context.seed)]
                         if spec.evaluation.keep_models else []),
                       TransferRecords(ray_workers)],
            manifest=lambda entries: update_manifest(self.run_dir, **entries),
            report=self._set_progress)
        return loop.run()

    def _send_groups(self, workers: list[Any], group_of_client: np.ndarray,
                     worker_of_client: np.ndarray) -> None:
        """Tell each worker the fixed group of every client it holds (the worker puts their
        training rows on its device); where each worker's data lives goes into the manifest."""
        residence = turns.get([  # one call each: a shared host may run two calls at once
            worker.set_groups.remote(np.flatnonzero(worker_of_client == w),
                                     group_of_client[worker_of_client == w])
            for w, worker in enumerate(workers)])
        update_manifest(self.run_dir, worker_data=residence)


def _on_worker(worker: Any) -> Callable[..., Callable[[], Any]]:
    """Runs ``function(*args)`` in ``worker``'s process (before it configures: calls to an
    actor run in order) and returns the wait for the result: what a feature makes before the
    first round on a worker (:class:`~raysim.layers.feature.RunStart`)."""

    def run(function: Callable[..., Any], *args: Any) -> Callable[[], Any]:
        reference = worker.call.remote(function, *args)
        return lambda: ray.get(reference)

    return run


class _FirstDispatchStamp(RoundCallback):
    """Records when the run's first round was sent (a start-up phase in the manifest)."""

    def __init__(self, run_dir: Path, first: bool):
        self.run_dir = run_dir
        self.pending = first

    def after_dispatch(self, loop: RoundLoop, dispatch: Dispatch) -> None:
        if self.pending:
            self.pending = False
            update_manifest(self.run_dir, first_dispatch_at=time.time())


def spare_node_cpus() -> int:
    """The CPUs of this process's Ray node that no actor reserved (1 when Ray cannot say):
    what the driver host may use beside the workers, e.g. on a GPU node with more CPUs than
    workers. Read once per run, after its workers started."""
    spare = unreserved_cpus(ray.get_runtime_context().get_node_id())
    return 1 if spare is None else max(1, math.floor(spare))  # unknown: one thread


class DriverHost:
    """A pooled driver process: runs a :class:`Driver` per run it is given, each in a thread of
    its own taking turns with the others (:mod:`.driver_turns`); one run, or several runs of a seed group
    whose workers they share. ``progress`` answers while the runs are going."""

    def __init__(self) -> None:
        from raysim.rounds.process_memory import keep_freed_memory

        keep_freed_memory()  # partials and means are allocated and freed every round
        self._drivers: dict[str, Driver] = {}
        self._stops: set[str] = set()
        """Runs asked to stop before their driver started here."""

    def run(self, spec: RunSpec, workers: list[Any]) -> dict[str, Any]:
        """Run one run on ``workers``; returns its final rounds row. Server-side work (e.g.
        FedVCK's training on the synthetic sets) uses ``engine.server_threads`` threads
        (default: a worker's, so that results do not depend on the number of workers); the
        sum of the workers' partials and the mean ``engine.reduction_threads`` (default: the
        node's CPUs no actor reserved, :func:`spare_node_cpus`)."""
        import torch

        from raysim.rounds.process_memory import freeze_imported_objects

        freeze_imported_objects()  # full collections stop walking torch's and Ray's objects
        engine = spec.engine
        with turns.taking_turns():
            torch.set_num_threads(engine.server_threads
                                  or max(1, math.floor(engine.cpus_per_worker)))
            blocked_sum.set_threads(engine.reduction_threads or spare_node_cpus())
            driver = self._drivers[spec.run_dir] = Driver(spec, workers)
            if spec.run_dir in self._stops:
                driver.request_stop()
            return driver.run()

    def reset(self) -> None:
        """Forget the finished runs (before the host serves others)."""
        self._drivers, self._stops = {}, set()

    def request_stop(self, run_dir: str) -> None:
        """Ask the run writing to ``run_dir`` to stop at its next round boundary (also before
        its driver started here)."""
        self._stops.add(run_dir)
        driver = self._drivers.get(run_dir)
        if driver is not None:
            driver.request_stop()

    def progress(self, run_dir: str) -> dict[str, Any]:
        """The progress of the run writing to ``run_dir`` (queued before it starts)."""
        driver = self._drivers.get(run_dir)
        if driver is None:
            return {"round": 0, "status": "queued", "accuracy": math.nan}
        return driver.progress()
