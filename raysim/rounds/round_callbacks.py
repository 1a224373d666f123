"""The round loop's callbacks (``raysim.rounds.round_loop``): evaluation schedule, divergence
stop, checkpointing and the membership audit's schedule. Ray-free: what touches the workers
comes in as functions."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysim.errors import DivergenceError
from raysim.results.manifest import read_manifest, update_manifest
from raysim.rounds.checkpoint import CHECKPOINT_FORMAT, Checkpoint, save_checkpoint
from raysim.rounds.round_loop import (
    Durable,
    Evaluation,
    RoundCallback,
    RoundLoop,
    RoundOutcome,
)


class EvaluationSchedule(RoundCallback):
    """Evaluates every ``every`` rounds and each of the last ``final`` rounds (never a
    replayed round or one in which a client diverged); relayed client states are delivered
    first, so personal models are evaluated where they now live."""

    def __init__(self, every: int, rounds: int,
                 evaluate: Callable[[Any, int], Evaluation], final: int = 1):
        self.every = every
        self.rounds = rounds
        self.final = final
        self._evaluate = evaluate
        """(server state, round) -> the round's evaluation."""

    def due(self, round_: int) -> bool:
        """Whether round ``round_`` is on the schedule."""
        every = self.every
        return every > 0 and ((round_ + 1) % every == 0 or round_ + 1 > self.rounds - self.final)

    def evaluate(self, loop: RoundLoop, outcome: RoundOutcome) -> Evaluation | None:
        if outcome.replay or outcome.diverged_clients or not self.due(outcome.round):
            return None
        loop.deliver()  # evaluate before the next round changes the states
        return self._evaluate(outcome.state, outcome.round)


class MembershipAudit(RoundCallback):
    """The membership audit (``evaluation.membership_audit``) attacks the uploads of the last
    round: the workers score each sampled client's upload with the algorithm's attack
    (``Algorithm.membership_scores``) and report ``mia_auc`` in the clients table."""

    def __init__(self, members: int, rounds: int):
        self.members = members
        self.rounds = rounds

    def audits(self, round_: int) -> bool:
        return self.members > 0 and round_ == self.rounds - 1


class DivergenceStop(RoundCallback):
    """Stops the run with a :class:`DivergenceError` after a round whose training loss or
    global predictions are not finite (that round's rows are written first)."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def after_record(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        if not outcome.stop:
            return
        loop.sink.flush()
        diverged, round_ = outcome.diverged_clients, outcome.round
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


class Checkpointing(RoundCallback):
    """Every ``every`` rounds (not after the last), at least ``min_seconds`` after the previous
    checkpoint (or the loop's start), and at least the previous checkpoint's own duration /
    ``share`` after it: flush the results, gather every client state and write a checkpoint,
    which becomes the durable state. The time floors keep fast runs (tens of rounds per second)
    and runs with large client states (GBs to gather and write) from spending more than about
    ``share`` of their time on checkpoints; results never depend on when checkpoints are
    written."""

    def __init__(self, every: int, rounds: int, run_dir: Path, seed: int,
                 min_seconds: float = 0.0, clock: Callable[[], float] = time.monotonic,
                 share: float = 0.0):
        self.every = every
        self.rounds = rounds
        self.run_dir = run_dir
        self.seed = seed
        self.min_seconds = min_seconds
        self.clock = clock
        self.share = share
        self._last = clock()
        self._cost = 0.0  # seconds the last checkpoint took

    def needs_idle_workers(self, outcome: RoundOutcome) -> bool:
        next_round = outcome.round + 1
        if outcome.replay or self.every <= 0 or next_round % self.every or (
                next_round >= self.rounds):
            return False
        floor = max(self.min_seconds, self._cost / self.share if self.share > 0 else 0.0)
        return self.clock() - self._last >= floor

    def with_idle_workers(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        started = self.clock()
        write_checkpoint(loop, outcome, self.run_dir, self.seed)
        self._last = self.clock()
        self._cost = self._last - started


def write_checkpoint(loop: RoundLoop, outcome: RoundOutcome, run_dir: Path, seed: int) -> None:
    """Flush the results, gather every client state (workers idle) and write a checkpoint of
    the state after ``outcome``'s round, which becomes the durable state."""
    next_round = outcome.round + 1
    loop.sink.flush()
    client_states = loop.workers.snapshot_states() if loop.progress.stateful else {}
    loop.progress.durable = Durable(next_round, outcome.state, client_states)
    save_checkpoint(run_dir, Checkpoint(seed, next_round, outcome.state, client_states,
                                        loop.sink.next_part))
    update_manifest(run_dir, checkpoint_round=next_round, checkpoint_format=CHECKPOINT_FORMAT)


class StoppedAtRoundBoundary(Exception):
    """Raised by :class:`StopAtRoundBoundary` once the run's rows and checkpoint are written."""

    def __init__(self, next_round: int):
        super().__init__(f"stopped before round {next_round}")
        self.next_round = next_round


class StopAtRoundBoundary(RoundCallback):
    """When ``requested()`` turns true: let the round in flight finish and be recorded, dispatch
    no other, write the rows and a checkpoint of the last completed round, then end the loop
    (:class:`StoppedAtRoundBoundary`). Replayed rounds (after a rollback) are not a boundary:
    their rows exist already."""

    def __init__(self, requested: Callable[[], bool], rounds: int, run_dir: Path, seed: int):
        self.requested = requested
        self.rounds = rounds
        self.run_dir = run_dir
        self.seed = seed

    def needs_idle_workers(self, outcome: RoundOutcome) -> bool:
        return (self.requested() and not outcome.replay and not outcome.stop
                and outcome.round + 1 < self.rounds)

    def with_idle_workers(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        if not self.needs_idle_workers(outcome):
            return
        write_checkpoint(loop, outcome, self.run_dir, self.seed)
        raise StoppedAtRoundBoundary(outcome.round + 1)


class LiveMetrics(RoundCallback):
    """Streams every recorded round's metrics to TensorBoard and MLflow
    (:class:`~raysim.results.live.MetricStreams`); replayed rounds are not sent twice."""

    def __init__(self, streams: Any):
        self.streams = streams

    def after_record(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        self.streams.log_round(outcome.round, outcome.metrics)


class StateResidencyNotices(RoundCallback):
    """Writes into the manifest (``worker_states``: worker -> round and notice) when a worker's
    client states no longer fit its device memory cap and move to the host."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir

    def after_record(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        notices = {str(worker): {"round": outcome.round, "notice": reply.notice}
                   for worker, reply in enumerate(outcome.replies) if reply.notice}
        if notices:
            known = read_manifest(self.run_dir).get("worker_states", {})
            update_manifest(self.run_dir, worker_states={**known, **notices})
