"""The round loop of one run in named phases, Ray-free: the driver hands it its workers behind
the small :class:`Workers` interface (Ray actors in the engine, plain objects in tests).

One round reads top to bottom in :meth:`RoundLoop.run`::

    dispatch -> collect -> aggregate -> evaluate -> (dispatch the next round) -> record
             -> after-record callbacks (divergence stop) -> with idle workers (checkpoint)

Round r+1 is dispatched before round r's rows are recorded, so the workers train while the
driver does bookkeeping, unless a callback needs the workers idle after round r (a checkpoint
gathers the client states) or round r asks to stop. Evaluation schedule, divergence stop and
checkpointing and the membership audit's schedule are :class:`RoundCallback` s
(``raysim.rounds.round_callbacks``).

After a rollback (a worker died and the driver restored the last durable state) the rounds
between the durable state and the last recorded round are *replayed*: trained and aggregated
again, but neither evaluated nor recorded twice.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from raysim.algorithms.contract import RunAlgorithm
from raysim.rounds.process_memory import resident_memory_mb
from raysim.training.evaluation import METRICS
from raysim.vectors.reduction_tree import Subtree, combine
from raysim.vectors.weights import payload_bytes


@dataclass
class RoundReply:
    """A worker's round: the roots of its subtrees of the reduction tree (its partial),
    per-client metrics as columns (cheap to ship), upload bytes by message type, and the client
    states it relayed to other workers."""

    groups: list[Subtree]
    clients: dict[str, np.ndarray]
    bytes_up: dict[str, int]
    outgoing: dict[int, Any]
    states_held: int = 0
    """Client states resident on this worker after the round."""
    memory_mb: float = 0.0
    """The worker process's resident memory after the round."""
    notice: str | None = None
    """Set the round this worker's client states moved to the host (they no longer fit its
    device memory cap; :mod:`raysim.training.resident_states`)."""
    outgoing_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)
    """(states, bytes) of the relayed client states bound for each other worker
    (``outgoing``)."""
    moved_states: int = 0
    """Client states this worker moved to another client after the round (to this worker or
    another)."""


class Workers(Protocol):
    """The round loop's view of a run's workers."""

    def run_round(self, round_: int, message: dict[str, Any], work: dict[int, np.ndarray],
                  incoming: dict[int, list[Any]], moves: dict[int, np.ndarray],
                  audit: bool = False) -> Any:
        """Start round ``round_`` on the workers named in ``work`` (worker -> its sampled
        clients), handing each its ``incoming`` relayed states and its ``moves``; ``audit``:
        attack every sampled client's upload (the membership audit). Returns a handle for
        :meth:`collect`."""

    def collect(self, handle: Any) -> list[RoundReply]:
        """Wait for a started round; the replies in worker order."""

    def deliver(self, incoming: dict[int, list[Any]]) -> None:
        """Hand relayed client states to their workers now."""

    def snapshot_states(self) -> dict[int, Any]:
        """Every client state the workers hold."""


class Sink(Protocol):
    """Where the rows go (:class:`raysim.results.sink.ParquetSink`)."""

    @property
    def next_part(self) -> int:
        """The number of the next part file (a checkpoint records it)."""
        ...

    def add(self, table: str, rows: list[dict[str, Any]]) -> None: ...

    def add_columns(self, table: str, columns: dict[str, np.ndarray]) -> None: ...

    def maybe_flush(self) -> bool: ...

    def flush(self) -> None: ...


class Sampler(Protocol):
    """Who takes part in each round (:mod:`raysim.rounds.client_sampling`)."""

    skip_empty_rounds: bool
    """A round without a client that sent anything leaves the server state as it is (True), or
    the algorithm still aggregates nothing (False: it may still move, e.g. by noise added to
    an empty sum)."""

    def clients(self, round_: int) -> np.ndarray:
        """The round's clients, ascending."""
        ...


@dataclass
class Durable:
    """A state the run can restart from: the state before round ``next_round``."""

    next_round: int
    state: Any
    client_states: dict[int, Any]


@dataclass
class LoopProgress:
    """What outlives one pass of the loop (a rollback starts a new pass)."""

    durable: Durable
    recorded: int
    """Rounds [0, recorded) have their rows in the results."""
    stateful: bool = False
    """Some client keeps state between rounds (then only a checkpoint is durable)."""


@dataclass(frozen=True)
class Dispatch:
    """A round sent to the workers and not yet collected."""

    round: int
    handle: Any
    message: dict[str, Any]
    receivers: int
    started: float


@dataclass(frozen=True)
class Evaluation:
    """A round's evaluation: its metric columns, and whether the global model diverged."""

    metrics: dict[str, float]
    model_diverged: bool = False
    """The global model's test predictions are not finite (NaN or infinite weights)."""


@dataclass
class RoundOutcome:
    """One collected round, filled in phase by phase."""

    dispatch: Dispatch
    replies: list[RoundReply]
    replay: bool
    """Rows of this round were recorded before a rollback: do not evaluate or record again."""
    diverged_clients: list[int]
    """Clients whose training loss is NaN or infinite, in id order."""
    state: Any = None
    """The server state after aggregation."""
    metrics: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METRICS, math.nan))
    model_diverged: bool = False
    """The global model's test predictions are not finite."""
    trained: float = 0.0
    aggregated: float = 0.0
    evaluated: float = 0.0

    @property
    def round(self) -> int:
        return self.dispatch.round

    @property
    def stop(self) -> bool:
        """The run must stop after this round (it diverged)."""
        return bool(self.diverged_clients) or self.model_diverged


class RoundCallback:
    """Hooks into the round loop; every hook is optional."""

    def audits(self, round_: int) -> bool:
        """Whether the workers attack this round's uploads (the membership audit)."""
        return False

    def after_dispatch(self, loop: RoundLoop, dispatch: Dispatch) -> None:
        """A round was just sent to the workers."""

    def evaluate(self, loop: RoundLoop, outcome: RoundOutcome) -> Evaluation | None:
        """The round's evaluation, or None when this callback does not evaluate it."""
        return None

    def needs_idle_workers(self, outcome: RoundOutcome) -> bool:
        """Whether :meth:`with_idle_workers` must run after this round (no round in flight)."""
        return False

    def columns(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, Any]:
        """Extra columns of the round's ``rounds`` row (e.g. a budget spent)."""
        return {}

    def client_columns(self, loop: RoundLoop, outcome: RoundOutcome,
                       clients: np.ndarray) -> dict[str, np.ndarray]:
        """Extra columns of the round's ``clients`` rows, aligned with ``clients``."""
        return {}

    def tables(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, dict[str, Any]]:
        """Rows of other tables for the round, as columns by table name."""
        return {}

    def after_record(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        """The round's rows are recorded (not called for replayed rounds); may raise to stop."""

    def with_idle_workers(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        """Runs while no round is in flight and every relayed state is delivered."""


class RoundLoop:
    """One pass of the rounds from ``progress.durable`` to ``rounds``."""

    def __init__(self, algorithm: RunAlgorithm, *, sampler: Sampler, rounds: int,
                 worker_of_client: np.ndarray, workers: Workers, sink: Sink,
                 progress: LoopProgress, callbacks: Sequence[RoundCallback] = (),
                 report: Callable[..., None] = lambda **fields: None):
        self.algorithm = algorithm
        self.sampler = sampler
        self.rounds = rounds
        self.worker_of_client = worker_of_client
        self.workers = workers
        self.sink = sink
        self.progress = progress
        self.callbacks = list(callbacks)
        self.report = report
        """Receives progress fields (round, accuracy) as keyword arguments."""
        self.in_flight: dict[int, list[Any]] = defaultdict(list)
        """Relayed client states per destination worker, not yet delivered."""

    def run(self) -> dict[str, Any]:
        """Every round from the durable state on; returns the last recorded rounds row."""
        state = self.progress.durable.state
        round_ = self.progress.durable.next_round
        last_row: dict[str, Any] = {}
        pending = self.dispatch(round_, state) if round_ < self.rounds else None
        while pending is not None:
            outcome = self.collect(pending)
            state = self.aggregate(outcome, state)
            self.evaluate(outcome)
            idle = any(callback.needs_idle_workers(outcome) for callback in self.callbacks)
            has_next = round_ + 1 < self.rounds
            pending = None
            if has_next and not idle and not outcome.stop:
                pending = self.dispatch(round_ + 1, state)  # workers train while we record
            if not outcome.replay:
                last_row = self.record(outcome)
            if idle:
                self.deliver()
                for callback in self.callbacks:
                    callback.with_idle_workers(self, outcome)
                if has_next:
                    pending = self.dispatch(round_ + 1, state)
            elif not self.progress.stateful and not self.in_flight:
                # nothing lives on the workers: the server state alone is a durable state
                self.progress.durable = Durable(round_ + 1, state, {})
            round_ += 1
        self.deliver()
        return last_row

    # ----- phases -----
    def dispatch(self, round_: int, state: Any) -> Dispatch:
        """Send round ``round_`` to the workers that hold its sampled clients (or states)."""
        started = time.perf_counter()
        sampled = self.sampler.clients(round_)
        message = self.algorithm.broadcast(state, round_)
        owners = self.worker_of_client[sampled]
        work = {int(w): sampled[owners == w] for w in np.unique(owners)}
        moves = self._moves(round_)
        for w in [*self.in_flight, *moves]:
            work.setdefault(w, sampled[:0])
        incoming = {w: self.in_flight.pop(w, []) for w in sorted(work)}
        audit = any(callback.audits(round_) for callback in self.callbacks)
        handle = self.workers.run_round(round_, message, dict(sorted(work.items())), incoming,
                                        moves, audit)
        dispatch = Dispatch(round_, handle, message, len(sampled), started)
        for callback in self.callbacks:
            callback.after_dispatch(self, dispatch)
        return dispatch

    def collect(self, dispatch: Dispatch) -> RoundOutcome:
        """Wait for the workers' replies; keep their relayed states for delivery."""
        replies = self.workers.collect(dispatch.handle)
        for reply in replies:
            self.progress.stateful |= reply.states_held > 0
            for destination, ref in reply.outgoing.items():
                self.in_flight[destination].append(ref)
        return RoundOutcome(dispatch, replies, replay=dispatch.round < self.progress.recorded,
                            diverged_clients=_diverged_clients(replies),
                            trained=time.perf_counter())

    def aggregate(self, outcome: RoundOutcome, state: Any) -> Any:
        """The new server state from the workers' subtrees, merged up the reduction tree."""
        root = combine([s for reply in outcome.replies for s in reply.groups],
                       self.algorithm.merge)
        if root is None and self.sampler.skip_empty_rounds and not outcome.dispatch.receivers:
            outcome.state = state  # no client took part in this round
        else:
            outcome.state = self.algorithm.aggregate(state, [] if root is None else [root],
                                                     outcome.round)
        outcome.aggregated = time.perf_counter()
        return outcome.state

    def evaluate(self, outcome: RoundOutcome) -> None:
        """The round's metric columns from the first callback that evaluates it."""
        for callback in self.callbacks:
            evaluation = callback.evaluate(self, outcome)
            if evaluation is not None:
                outcome.metrics = dict(evaluation.metrics)
                outcome.model_diverged = evaluation.model_diverged
                break
        outcome.evaluated = time.perf_counter()

    def record(self, outcome: RoundOutcome) -> dict[str, Any]:
        """Write the round's rows (rounds, clients, communication), report progress, then run
        the after-record callbacks."""
        dispatch, replies, round_ = outcome.dispatch, outcome.replies, outcome.round
        clients = _merge_columns([reply.clients for reply in replies])
        bytes_rows = _communication(round_, dispatch.message, dispatch.receivers, replies,
                                    self.algorithm.relayed_uploads,
                                    self.algorithm.bookkeeping_broadcasts)
        row = {"round": round_, "clients_sampled": dispatch.receivers, **outcome.metrics,
               "bytes_down": sum(r["bytes"] for r in bytes_rows if r["direction"] == "down"),
               "bytes_up": sum(r["bytes"] for r in bytes_rows if r["direction"] == "up"),
               "train_loss": _weighted_train_loss(clients),
               "seconds_train": outcome.trained - dispatch.started,
               "seconds_aggregate": outcome.aggregated - outcome.trained,
               "seconds_evaluate": outcome.evaluated - outcome.aggregated,
               "wall_time": time.time(), "driver_memory_mb": resident_memory_mb(),
               "worker_memory_mb": max((r.memory_mb for r in replies), default=math.nan)}
        for callback in self.callbacks:
            row.update(callback.columns(self, outcome))
            clients.update(callback.client_columns(self, outcome, clients["client"]))
            for table, columns in callback.tables(self, outcome).items():
                self.sink.add_columns(table, columns)
        self.sink.add("rounds", [row])
        self.sink.add_columns("clients", {"round": np.full(len(clients["client"]), round_),
                                          **clients})
        self.sink.add("communication", bytes_rows)
        self.sink.maybe_flush()
        if not math.isnan(row.get("accuracy", math.nan)):
            self.report(accuracy=row["accuracy"])
        self.report(round=round_ + 1)
        self.progress.recorded = round_ + 1
        for callback in self.callbacks:
            callback.after_record(self, outcome)
        return row

    def deliver(self) -> None:
        """Hand the relayed client states to their workers (before evaluating personal models,
        before a checkpoint, at the end)."""
        if any(self.in_flight.values()):
            self.workers.deliver({w: refs for w, refs in self.in_flight.items() if refs})
        self.in_flight.clear()

    # ----- helpers -----
    def _moves(self, round_: int) -> dict[int, np.ndarray]:
        """Per source worker: rows (client, destination client, destination worker)."""
        destination = self.algorithm.migration(round_)
        if destination is None:
            return {}
        owner = self.worker_of_client
        table = np.stack([np.arange(len(destination)), destination,
                          owner[destination]], axis=1).astype(np.int64)
        return {int(w): table[owner == w] for w in np.unique(owner)}


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


def _communication(round_: int, message: dict[str, Any], receivers: int,
                   replies: list[RoundReply], relayed: tuple[str, ...],
                   bookkeeping: tuple[str, ...]) -> list[dict[str, Any]]:
    """Bytes by direction and message type (relayed uploads also travel down; the
    simulation's bookkeeping in the broadcast does not count)."""
    rows = [{"round": round_, "direction": "down", "message_type": kind,
             "bytes": payload_bytes(payload) * receivers} for kind, payload in message.items()
            if kind not in bookkeeping]
    up: dict[str, int] = defaultdict(int)
    for reply in replies:
        for kind, count in reply.bytes_up.items():
            up[kind] += count
    rows += [{"round": round_, "direction": "up", "message_type": kind, "bytes": count}
             for kind, count in sorted(up.items())]
    rows += [{"round": round_, "direction": "down", "message_type": kind, "bytes": count}
             for kind, count in sorted(up.items()) if kind in relayed]
    return rows
