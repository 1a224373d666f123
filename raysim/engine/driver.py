"""The Driver actor: runs the rounds of one run (one seed) on its own pool of workers."""

from __future__ import annotations

import math
import os
import threading
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from raysim.engine.checkpoint import (
    Checkpoint,
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
    truncate_results,
)
from raysim.engine.memory import resident_memory_mb
from raysim.engine.placement import assign_groups, client_groups, per_sample_costs
from raysim.engine.server_evaluation import Evaluator
from raysim.engine.worker import RoundReply, WorkerSetup
from raysim.errors import DivergenceError, RunError, WorkerFailureError
from raysim.results.manifest import update_manifest
from raysim.results.sink import ParquetSink
from raysim.schema import EngineConfig, EvaluationConfig
from raysim.seeding import numpy_rng
from raysim.training.evaluation import METRICS
from raysim.training.weights import payload_bytes

_INLINE_BYTES = 100 * 1024  # Ray inlines arguments below this size
_RESTART_TIMEOUT = 300.0  # seconds to wait for Ray to restart a dead worker


@dataclass(frozen=True)
class _Dispatch:
    """A round sent to the workers and not yet collected."""

    round: int
    futures: list[Any]
    message: dict[str, Any]
    receivers: int
    started: float


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
    client_test_shares: tuple[np.ndarray, ...] = ()
    """Each client's test share (also for pooled runs, whose one client holds all data)."""


@dataclass(frozen=True)
class _Layout:
    """Where clients live: fixed client groups, and the worker that owns each group."""

    groups: list[np.ndarray]
    owner_of_group: dict[int, int]
    group_of_client: np.ndarray
    worker_of_client: np.ndarray
    clients_by_worker: dict[int, list[int]]


@dataclass
class _Durable:
    """A state the run can restart from: the state before round ``next_round``."""

    next_round: int
    state: Any
    client_states: dict[int, Any]


def _fetch(array: Any) -> Any:
    """An array that may travel as an object-store reference."""
    return ray.get(array) if isinstance(array, ray.ObjectRef) else array


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
        self.algorithm = setup.algorithm_class(setup.algorithm_params, setup.context)
        self.test_y = _fetch(setup.arrays["test_y"])
        if self.algorithm.server_holds_inputs:
            self.algorithm.attach_server_inputs(_fetch(setup.arrays["train_x"]),
                                                setup.partition.train)
        self._progress: dict[str, Any] = {"round": 0, "rounds": spec.rounds, "status": "queued",
                                          "accuracy": math.nan}
        self._lock = threading.Lock()
        self._durable = _Durable(0, None, {})
        self._recorded = 0  # rounds [0, _recorded) have their rows in the results
        self._stateful = False  # some client keeps state between rounds
        self._recoveries: list[dict[str, Any]] = []
        validation_y = (None if setup.validation_index is None
                        else _fetch(setup.arrays["train_y"])[setup.validation_index])
        self._evaluator = Evaluator(self.algorithm, self.test_y, spec.client_test_shares,
                                    setup.partition.unseen, setup.test_sources, spec.evaluation,
                                    validation_y)

    def progress(self) -> dict[str, Any]:
        """Latest round, accuracy and status (callable while ``run`` is going)."""
        with self._lock:
            return dict(self._progress)

    def _set_progress(self, **fields: Any) -> None:
        with self._lock:
            self._progress.update(fields)

    def run(self) -> dict[str, Any]:
        """Run every round; returns the final rounds row. Rows written so far are kept on error."""
        checkpoint = None
        if self.spec.resume:
            checkpoint = load_checkpoint(self.run_dir)
            truncate_results(self.run_dir, checkpoint.next_part if checkpoint else 0)
        sink = ParquetSink(self.run_dir, self.spec.engine.flush_seconds)
        update_manifest(self.run_dir, driver={"pid": os.getpid(),
                                              "node_id": ray.get_runtime_context().get_node_id()})
        try:
            self._set_progress(status="waiting for resources")
            workers = self.workers
            try:
                update_manifest(self.run_dir, workers=self._configure(workers),
                                workers_ready_at=time.time())
                self._set_progress(status="running")
                final = self._round_loop(workers, sink, checkpoint)
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, RunError):  # a worker's clear message, not a bug
                    raise error.cause from None
                raise
            sink.flush()
            remove_checkpoint(self.run_dir)
            update_manifest(self.run_dir, status="completed", finished=time.time())
            self._set_progress(status="done")
            return final
        except BaseException as exc:
            sink.flush()
            update_manifest(self.run_dir,
                            status="diverged" if isinstance(exc, DivergenceError) else "failed",
                            finished=time.time(), error=f"{type(exc).__name__}: {exc}",
                            traceback=traceback.format_exc())
            self._set_progress(status="failed")
            raise

    # ----- setup -----
    def _configure(self, workers: list[Any]) -> list[dict[str, Any]]:
        """Bind every worker to this run (also after Ray restarted one); returns where each
        runs."""
        return ray.get([worker.configure.remote(self.spec.setup, index)
                        for index, worker in enumerate(workers)])

    def _layout(self, num_workers: int) -> _Layout:
        partition = self.spec.setup.partition
        groups = client_groups(partition.num_clients, self.spec.engine.client_groups)
        loads = partition.sizes().astype(np.float64)
        if num_workers > 1 and (costs := per_sample_costs(self.algorithm)) is not None:
            loads = loads * costs
        owner_of_group = {}
        for worker, owned in enumerate(assign_groups([float(loads[g].sum()) for g in groups],
                                                     num_workers)):
            for g in owned:
                owner_of_group[g] = worker
        group_of_client = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
        worker_of_client = np.array([owner_of_group[g] for g in group_of_client])
        clients_by_worker: dict[int, list[int]] = defaultdict(list)
        for g, clients in enumerate(groups):
            clients_by_worker[owner_of_group[g]].extend(int(c) for c in clients)
        return _Layout(groups, owner_of_group, group_of_client, worker_of_client,
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
            self._durable = _Durable(0, initial, {})
        else:
            self._durable = _Durable(checkpoint.next_round, checkpoint.server_state,
                                     checkpoint.client_states)
            self._stateful = bool(checkpoint.client_states)
            update_manifest(self.run_dir, resumed_from=checkpoint.next_round)
        self._recorded = self._durable.next_round
        self._set_progress(round=self._recorded)
        self._prepare_workers(workers, layout)
        while True:
            try:
                return self._rounds(workers, layout, sink)
            except ray.exceptions.RayActorError as error:
                self._recover(workers, layout, error)

    def _prepare_workers(self, workers: list[Any], layout: _Layout) -> None:
        """Tell every worker its clients' groups and give it their durable states."""
        self._send_groups(workers, layout.group_of_client, layout.worker_of_client)
        states = self._durable.client_states
        if states or self._stateful:
            owner = layout.worker_of_client
            ray.get([worker.restore_states.remote(
                {c: s for c, s in states.items() if owner[c] == w})
                for w, worker in enumerate(workers)])

    def _recover(self, workers: list[Any], layout: _Layout, error: Exception) -> None:
        failures = len(self._recoveries) + 1
        limit = self.spec.engine.max_worker_failures
        if failures > limit:
            raise WorkerFailureError(
                f"A worker actor died for the {failures}th time in this run (last: {error}); "
                f"engine.max_worker_failures={limit} restarts are allowed. Rows of rounds "
                f"0-{self._recorded - 1} are kept in {self.run_dir}; find the cause in the "
                "Ray logs (e.g. out of memory), then continue with `raysim run CONFIG --resume`."
            ) from None
        self._set_progress(status=f"recovering from a dead worker ({failures}/{limit})")
        deadline = time.monotonic() + _RESTART_TIMEOUT
        while True:  # Ray restarts dead actors (max_restarts); wait until all answer
            try:
                ray.get([worker.describe.remote() for worker in workers],
                        timeout=_RESTART_TIMEOUT)
                described = self._configure(workers)  # a restarted actor starts unconfigured
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise WorkerFailureError(
                        f"A worker actor died ({error}) and was not restarted within "
                        f"{_RESTART_TIMEOUT:.0f} s. Rows of rounds 0-{self._recorded - 1} are kept "
                        f"in {self.run_dir}; continue with `raysim run CONFIG --resume`."
                    ) from None
                time.sleep(0.5)
        self._prepare_workers(workers, layout)
        self._recoveries.append({"failed_at": time.time(), "rolled_back_to": self._durable.next_round,
                                 "rounds_recorded": self._recorded, "error": str(error)[:500]})
        update_manifest(self.run_dir, workers=described, recoveries=self._recoveries)
        self._set_progress(status="running")

    def _rounds(self, workers: list[Any], layout: _Layout, sink: ParquetSink) -> dict[str, Any]:
        """Rounds from the durable state to the end. Round r+1 is dispatched before round r's
        rows are written (workers train while the driver does bookkeeping), except before a
        checkpoint, which needs the workers idle."""
        state = self._durable.state
        round_ = self._durable.next_round
        in_flight: dict[int, list[Any]] = defaultdict(list)  # relayed client states per worker
        last_row: dict[str, Any] = {}
        pending = (self._dispatch(workers, round_, state, layout.worker_of_client, in_flight)
                   if round_ < self.spec.rounds else None)
        if pending is not None and not self._recoveries:
            update_manifest(self.run_dir, first_dispatch_at=time.time())
        while pending is not None:
            replies: list[RoundReply] = ray.get(pending.futures)
            for reply in replies:
                self._stateful |= reply.states_held > 0
                for destination, ref in reply.outgoing.items():
                    in_flight[destination].append(ref)
            partials = sorted((g for reply in replies for g in reply.groups), key=lambda g: g.group)
            trained = time.perf_counter()
            state = self.algorithm.aggregate(state, [g.partial for g in partials], round_)
            aggregated = time.perf_counter()
            replay = round_ < self._recorded  # rows already written before a rollback
            diverged = _diverged_clients(replies)
            metrics = dict.fromkeys(METRICS, math.nan)
            if not replay and not diverged and self._due(round_):
                self._deliver(workers, in_flight)  # evaluate before the next round changes states
                metrics = self._evaluator.evaluate(workers, state, round_,
                                                   layout.clients_by_worker, sink)
            model_diverged = bool(metrics.pop("diverged", False))
            evaluated = time.perf_counter()
            checkpoint_due = not replay and self._checkpoint_due(round_)
            current, pending = pending, None
            stop = bool(diverged) or model_diverged
            if round_ + 1 < self.spec.rounds and not checkpoint_due and not stop:
                pending = self._dispatch(workers, round_ + 1, state, layout.worker_of_client,
                                         in_flight)
            if not replay:
                last_row = self._record(sink, current, replies, metrics, trained, aggregated,
                                        evaluated)
                self._recorded = round_ + 1
                self._stop_if_diverged(round_, diverged, model_diverged, sink)
            if checkpoint_due:
                self._deliver(workers, in_flight)
                self._checkpoint(workers, round_ + 1, state, sink)
                if round_ + 1 < self.spec.rounds:
                    pending = self._dispatch(workers, round_ + 1, state,
                                             layout.worker_of_client, in_flight)
            elif not self._stateful and not in_flight:
                # nothing lives on the workers: the server state alone is a durable state
                self._durable = _Durable(round_ + 1, state, {})
            round_ += 1
        self._deliver(workers, in_flight)
        return last_row

    def _checkpoint_due(self, round_: int) -> bool:
        every = self.spec.engine.checkpoint_every
        return every > 0 and (round_ + 1) % every == 0 and round_ + 1 < self.spec.rounds

    def _checkpoint(self, workers: list[Any], next_round: int, state: Any,
                    sink: ParquetSink) -> None:
        """Flush the results, gather every client state and write the checkpoint."""
        sink.flush()
        client_states: dict[int, Any] = {}
        if self._stateful:
            for states in ray.get([worker.snapshot_states.remote() for worker in workers]):
                client_states.update(states)
        self._durable = _Durable(next_round, state, client_states)
        save_checkpoint(self.run_dir, Checkpoint(self.context.seed, next_round, state,
                                                 client_states, sink.next_part))
        update_manifest(self.run_dir, checkpoint_round=next_round)

    def _stop_if_diverged(self, round_: int, diverged: list[int], model_diverged: bool,
                          sink: ParquetSink) -> None:
        """Raise a DivergenceError (after the round's rows are written) on non-finite losses."""
        if not diverged and not model_diverged:
            return
        sink.flush()
        if diverged:
            shown = ", ".join(str(c) for c in diverged[:10])
            more = f" and {len(diverged) - 10} more" if len(diverged) > 10 else ""
            what = f"client(s) {shown}{more} reported a non-finite training loss (NaN or inf)"
        else:
            what = "the global model's test predictions are not finite (NaN or inf weights)"
        raise DivergenceError(
            f"Training diverged in round {round_}: {what}. The run stopped; the rows of rounds "
            f"0-{round_} are kept in {self.run_dir}. Lower training.optimizer.lr, add gradient "
            "clipping through the algorithm's options where it has them, or check the data for "
            "extreme values."
        )

    def _dispatch(self, workers: list[Any], round_: int, state: Any,
                  worker_of_client: np.ndarray, in_flight: dict[int, list[Any]]) -> _Dispatch:
        """Send round ``round_`` to the workers that hold its sampled clients (or states)."""
        started = time.perf_counter()
        sampled = self._sample_clients(round_)
        message = self.algorithm.broadcast(state, round_)
        # large broadcasts go into the object store once; small ones travel inline
        message_ref = ray.put(message) if payload_bytes(message) > _INLINE_BYTES else message
        owners = worker_of_client[sampled]
        work = {int(w): sampled[owners == w] for w in np.unique(owners)}
        moves = self._moves(round_, worker_of_client)
        for w in [*in_flight, *moves]:
            work.setdefault(w, sampled[:0])
        futures = [workers[w].run_round.remote(round_, message_ref, clients,
                                               in_flight.pop(w, []), moves.get(w))
                   for w, clients in sorted(work.items())]
        return _Dispatch(round_, futures, message, len(sampled), started)

    def _record(self, sink: ParquetSink, dispatch: _Dispatch, replies: list[RoundReply],
                metrics: dict[str, float], trained: float, aggregated: float,
                evaluated: float) -> dict[str, Any]:
        """Write one round's rows (rounds, clients, communication) and update progress."""
        round_ = dispatch.round
        clients = _merge_columns([reply.clients for reply in replies])
        bytes_rows = self._communication(round_, dispatch.message, dispatch.receivers, replies,
                                         self.algorithm.relayed_uploads)
        row = {"round": round_, "clients_sampled": dispatch.receivers, **metrics,
               "bytes_down": sum(r["bytes"] for r in bytes_rows if r["direction"] == "down"),
               "bytes_up": sum(r["bytes"] for r in bytes_rows if r["direction"] == "up"),
               "train_loss": _weighted_train_loss(clients),
               "seconds_train": trained - dispatch.started,
               "seconds_aggregate": aggregated - trained,
               "seconds_evaluate": evaluated - aggregated, "wall_time": time.time(),
               "driver_memory_mb": resident_memory_mb(),
               "worker_memory_mb": max((r.memory_mb for r in replies), default=math.nan)}
        sink.add("rounds", [row])
        sink.add_columns("clients", {"round": np.full(len(clients["client"]), round_),
                                     **clients})
        sink.add("communication", bytes_rows)
        sink.maybe_flush()
        if not math.isnan(row.get("accuracy", math.nan)):
            self._set_progress(accuracy=row["accuracy"])
        self._set_progress(round=round_ + 1)
        return row

    @staticmethod
    def _send_groups(workers: list[Any], group_of_client: np.ndarray,
                     worker_of_client: np.ndarray) -> None:
        """Tell each worker the fixed group of every client it holds."""
        ray.get([worker.set_groups.remote(np.flatnonzero(worker_of_client == w),
                                          group_of_client[worker_of_client == w])
                 for w, worker in enumerate(workers)])

    def _moves(self, round_: int, worker_of_client: np.ndarray) -> dict[int, np.ndarray]:
        """Per source worker: rows (client, destination client, destination worker)."""
        destination = self.algorithm.migration(round_)
        if destination is None:
            return {}
        table = np.stack([np.arange(len(destination)), destination,
                          worker_of_client[destination]], axis=1).astype(np.int64)
        return {int(w): table[worker_of_client == w] for w in np.unique(worker_of_client)}

    @staticmethod
    def _deliver(workers: list[Any], in_flight: dict[int, list[Any]]) -> None:
        """Hand relayed client states to their workers now (before evaluation, at the end)."""
        ray.get([workers[w].receive_states.remote(refs) for w, refs in in_flight.items() if refs])
        in_flight.clear()

    def _sample_clients(self, round_: int) -> np.ndarray:
        total = self.context.num_clients
        count = min(self.context.clients_per_round, total)
        if count == total:
            return np.arange(total)
        return np.sort(numpy_rng(self.context.seed, "sample", round_).choice(total, count,
                                                                             replace=False))

    def _due(self, round_: int) -> bool:
        every = self.spec.evaluation.every
        return every > 0 and ((round_ + 1) % every == 0 or round_ + 1 == self.spec.rounds)

    @staticmethod
    def _communication(round_: int, message: dict[str, Any], receivers: int,
                       replies: list[RoundReply], relayed: tuple[str, ...]
                       ) -> list[dict[str, Any]]:
        rows = [{"round": round_, "direction": "down", "message_type": kind,
                 "bytes": payload_bytes(payload) * receivers} for kind, payload in message.items()]
        up: dict[str, int] = defaultdict(int)
        for reply in replies:
            for kind, count in reply.bytes_up.items():
                up[kind] += count
        rows += [{"round": round_, "direction": "up", "message_type": kind, "bytes": count}
                 for kind, count in sorted(up.items())]
        rows += [{"round": round_, "direction": "down", "message_type": kind, "bytes": count}
                 for kind, count in sorted(up.items()) if kind in relayed]
        return rows


def _merge_columns(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate per-worker client columns, sorted by client id (worker-count independent)."""
    parts = [p for p in parts if len(p["client"])]
    if not parts:
        return {"client": np.zeros(0, dtype=np.int64)}
    keys = dict.fromkeys(k for p in parts for k in p)
    merged = {k: np.concatenate([p.get(k, np.full(len(p["client"]), np.nan)) for p in parts])
              for k in keys}
    order = np.argsort(merged["client"], kind="stable")
    return {k: v[order] for k, v in merged.items()}


def _diverged_clients(replies: list[RoundReply]) -> list[int]:
    """Clients whose training loss this round is NaN or infinite, in id order."""
    bad: list[int] = []
    for reply in replies:
        losses = reply.clients.get("train_loss")
        if losses is not None:
            bad += reply.clients["client"][~np.isfinite(losses)].tolist()
    return sorted(bad)


def _weighted_train_loss(clients: dict[str, np.ndarray]) -> float:
    if "train_loss" not in clients or "num_samples" not in clients:
        return math.nan
    total = clients["num_samples"].sum()
    if not total:
        return math.nan
    return float((clients["train_loss"] * clients["num_samples"]).sum() / total)


class DriverHost:
    """A pooled driver process: runs one :class:`Driver` at a time (``progress`` answers
    while ``run`` is going: the actor runs with two threads)."""

    def __init__(self) -> None:
        self._driver: Driver | None = None

    def run(self, spec: RunSpec, workers: list[Any]) -> dict[str, Any]:
        """Run one run on ``workers``; returns its final rounds row. Server-side work (e.g.
        FedVCK's training on the synthetic sets) uses ``engine.server_threads`` threads
        (default: a worker's, so that results do not depend on the number of workers)."""
        import torch

        engine = spec.engine
        torch.set_num_threads(engine.server_threads or max(1, math.floor(engine.cpus_per_worker)))
        self._driver = Driver(spec, workers)
        return self._driver.run()

    def reset(self) -> None:
        """Forget the finished run (before the host serves another)."""
        self._driver = None

    def progress(self) -> dict[str, Any]:
        """The current run's progress (queued before it starts)."""
        driver = self._driver
        if driver is None:
            return {"round": 0, "status": "queued", "accuracy": math.nan}
        return driver.progress()
