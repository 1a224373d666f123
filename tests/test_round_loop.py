"""The round loop's phases and callbacks against a fake worker pool, without Ray: the order of
the phases (the next round is dispatched before a round is recorded), the evaluation schedule,
checkpoints with idle workers, the divergence stop, replay after a rollback, and relayed client
states delivered before evaluation."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raysim.errors import DivergenceError
from raysim.results.manifest import write_manifest
from raysim.rounds.checkpoint import load_checkpoint
from raysim.rounds.client_sampling import UniformSampler
from raysim.rounds.round_callbacks import (
    Checkpointing,
    DivergenceStop,
    EvaluationSchedule,
    MembershipAudit,
)
from raysim.rounds.round_loop import (
    Durable,
    Evaluation,
    LoopProgress,
    RoundCallback,
    RoundLoop,
    RoundReply,
)
from raysim.vectors.reduction_tree import Subtree

NUM_CLIENTS = 4


class CountingAlgorithm:
    """The server state is a number; each client uploads round + 1; aggregation adds them.
    With ``migrate``, client states move one client up every round (as FedDC's models do)."""

    relayed_uploads: tuple[str, ...] = ()
    bookkeeping_broadcasts: tuple[str, ...] = ()

    def __init__(self, migrate: bool = False):
        self.migrate = migrate

    def broadcast(self, state: float, round_: int) -> dict[str, Any]:
        return {"model": np.array([state])}

    def migration(self, round_: int) -> np.ndarray | None:
        return (np.arange(NUM_CLIENTS) + 1) % NUM_CLIENTS if self.migrate else None

    def aggregate(self, state: float, partials: list[float], round_: int) -> float:
        return state + sum(partials)

    def merge(self, left: float, right: float) -> float:
        return left + right


class FakeWorkers:
    """Two workers (clients 0-1 and 2-3), answering at once, logging every call into
    ``events`` shared with the sink and the callbacks."""

    def __init__(self, events: list[tuple[Any, ...]], nan_round: int | None = None,
                 stateful: bool = False):
        self.events = events
        self.nan_round = nan_round
        self.stateful = stateful
        self.in_flight = 0
        self.delivered = 0
        self.handed_over: list[int] = []  # relayed states handed over with each dispatch
        self.audited: list[int] = []  # rounds whose uploads the workers were asked to attack

    def run_round(self, round_, message, work, incoming, moves, audit=False):
        self.events.append(("dispatch", round_))
        self.audited.extend([round_] if audit else [])
        self.handed_over.append(sum(len(refs) for refs in incoming.values()))
        self.in_flight += 1
        replies = []
        for worker, clients in work.items():
            loss = np.full(len(clients), math.nan if round_ == self.nan_round else 1.0)
            outgoing = {1 - worker: f"states of worker {worker}"} if moves else {}
            replies.append(RoundReply(
                [Subtree((int(c), int(c) + 1), float(round_ + 1)) for c in clients],
                {"client": np.asarray(clients, dtype=np.int64), "train_loss": loss,
                 "num_samples": np.ones(len(clients))}, {"model": 8 * len(clients)}, outgoing,
                states_held=2 if self.stateful else 0))
        return replies

    def collect(self, handle):
        self.in_flight -= 1
        self.events.append(("collect", None))
        return handle

    def deliver(self, incoming):
        self.delivered += sum(len(refs) for refs in incoming.values())
        self.events.append(("deliver", sum(len(refs) for refs in incoming.values())))

    def snapshot_states(self):
        return {c: f"state {c}" for c in range(NUM_CLIENTS)}


class ListSink:
    next_part = 0

    def __init__(self, events: list[tuple[Any, ...]]):
        self.events = events
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def add(self, table, rows):
        self.rows.setdefault(table, []).extend(rows)
        if table == "rounds":
            self.events.extend(("record", row["round"]) for row in rows)

    def add_columns(self, table, columns):
        self.rows.setdefault(table, []).append(columns)

    def maybe_flush(self):
        pass

    def flush(self):
        self.events.append(("flush", None))
        self.next_part += 1


def _loop(workers, sink, callbacks, rounds=5, migrate=False, progress=None):
    progress = progress or LoopProgress(Durable(0, 0.0, {}), recorded=0)
    return RoundLoop(CountingAlgorithm(migrate),
                     sampler=UniformSampler(0, NUM_CLIENTS, NUM_CLIENTS), rounds=rounds,
                     worker_of_client=np.array([0, 0, 1, 1]), workers=workers, sink=sink,
                     progress=progress, callbacks=callbacks)


def _evaluation(events, every, rounds=5):
    def evaluate(state, round_):
        events.append(("evaluate", round_))
        return Evaluation({"accuracy": state / 100})
    return EvaluationSchedule(every, rounds, evaluate)


def test_next_round_is_dispatched_before_a_round_is_recorded_and_evaluation_follows_schedule():
    events: list[tuple[Any, ...]] = []
    sink = ListSink(events)
    loop = _loop(FakeWorkers(events), sink, [_evaluation(events, every=2)])
    last = loop.run()
    order = [e for e in events if e[0] in ("dispatch", "record", "evaluate")]
    assert order == [("dispatch", 0), ("dispatch", 1), ("record", 0),
                     ("evaluate", 1), ("dispatch", 2), ("record", 1),
                     ("dispatch", 3), ("record", 2),
                     ("evaluate", 3), ("dispatch", 4), ("record", 3),
                     ("evaluate", 4), ("record", 4)]
    # every round's four uploads are aggregated once: 4 * (1 + 2 + 3 + 4 + 5)
    assert loop.progress.durable.state == 60.0 and loop.progress.durable.next_round == 5
    assert last["round"] == 4 and last["accuracy"] == pytest.approx(0.6)
    rows = sink.rows["rounds"]
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
    assert np.isnan(rows[0]["accuracy"]) and rows[1]["accuracy"] == pytest.approx(0.12)
    assert rows[0]["bytes_up"] == 4 * 8 and rows[0]["bytes_down"] == 4 * 8
    assert rows[0]["train_loss"] == 1.0


def test_checkpoint_runs_with_idle_workers_and_becomes_the_durable_state(tmp_path: Path):
    events: list[tuple[Any, ...]] = []
    write_manifest(tmp_path, {"status": "running"})
    workers = FakeWorkers(events, stateful=True)

    class IdleProbe(RoundCallback):
        def with_idle_workers(self, loop, outcome):
            events.append(("idle", outcome.round, workers.in_flight))

    loop = _loop(workers, ListSink(events),
                 [Checkpointing(2, 5, tmp_path, seed=0), IdleProbe()])
    loop.run()
    idle = [e for e in events if e[0] == "idle"]
    assert idle == [("idle", 1, 0), ("idle", 3, 0)]  # after rounds 1 and 3, not after the last
    # the round after a checkpoint is dispatched only once the checkpoint is written
    assert events.index(("idle", 1, 0)) < events.index(("dispatch", 2))
    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint is not None and checkpoint.next_round == 4
    assert checkpoint.server_state == 4 * (1 + 2 + 3 + 4)
    assert checkpoint.client_states == {c: f"state {c}" for c in range(NUM_CLIENTS)}
    assert loop.progress.durable.next_round == 4  # stateful clients: only checkpoints count


def test_checkpoints_keep_their_minimum_spacing_in_seconds(tmp_path: Path):
    """Every 2 rounds but at least 5 s apart, 3 s per round: after rounds 3 and 7 only."""
    events: list[tuple[Any, ...]] = []
    write_manifest(tmp_path, {"status": "running"})
    workers = FakeWorkers(events, stateful=True)
    now = [0.0]

    class Ticker(RoundCallback):  # each recorded round takes 3 s
        def after_record(self, loop, outcome):
            now[0] += 3.0

    class IdleProbe(RoundCallback):
        def with_idle_workers(self, loop, outcome):
            events.append(("idle", outcome.round))

    checkpointing = Checkpointing(2, 9, tmp_path, seed=0, min_seconds=5.0, clock=lambda: now[0])
    _loop(workers, ListSink(events), [Ticker(), checkpointing, IdleProbe()], rounds=9).run()
    assert [e for e in events if e[0] == "idle"] == [("idle", 3), ("idle", 7)]
    assert load_checkpoint(tmp_path).next_round == 8


def test_a_slow_checkpoint_spaces_the_next_by_its_cost_over_the_share(tmp_path: Path):
    """Every 2 rounds, 1 s per round, gathering the client states takes 4 s: with share 0.5
    each checkpoint starts >= 4 / 0.5 = 8 s after the previous one ended; with share 0, every
    2 rounds."""
    def checkpoints(share: float) -> list[tuple[int, float]]:
        events: list[tuple[Any, ...]] = []
        write_manifest(tmp_path, {"status": "running"})
        now = [0.0]

        class SlowSnapshot(FakeWorkers):
            def snapshot_states(self):
                events.append(("started", now[0]))
                now[0] += 4.0
                return super().snapshot_states()

        class Ticker(RoundCallback):
            def after_record(self, loop, outcome):
                now[0] += 1.0

        checkpointing = Checkpointing(2, 20, tmp_path, seed=0, clock=lambda: now[0],
                                      share=share)
        _loop(SlowSnapshot(events, stateful=True), ListSink(events),
              [Ticker(), checkpointing], rounds=20).run()
        return [e[1] for e in events if e[0] == "started"]

    assert len(checkpoints(0.0)) == 9  # after rounds 1, 3, ..., 17
    starts = checkpoints(0.5)
    assert 2 <= len(starts) <= 3
    assert all(later - (earlier + 4.0) >= 8.0 for earlier, later in pairwise(starts))


def test_divergence_stops_after_recording_the_round_and_dispatches_nothing_more(tmp_path):
    events: list[tuple[Any, ...]] = []
    sink = ListSink(events)
    loop = _loop(FakeWorkers(events, nan_round=2), sink,
                 [_evaluation(events, every=1), DivergenceStop(tmp_path)])
    with pytest.raises(DivergenceError, match=r"round 2: client\(s\) 0, 1, 2, 3"):
        loop.run()
    assert [r["round"] for r in sink.rows["rounds"]] == [0, 1, 2]
    assert ("evaluate", 2) not in events  # a diverged round is not evaluated
    assert ("dispatch", 3) not in events
    assert events[-1] == ("flush", None)  # the rows are written before the error


def test_a_diverged_global_model_stops_the_run_after_its_round(tmp_path):
    events: list[tuple[Any, ...]] = []
    sink = ListSink(events)

    def evaluate(state, round_):
        return Evaluation({"accuracy": math.nan}, model_diverged=round_ == 1)

    loop = _loop(FakeWorkers(events), sink, [EvaluationSchedule(1, 5, evaluate),
                                             DivergenceStop(tmp_path)])
    with pytest.raises(DivergenceError, match="round 1: the global model"):
        loop.run()
    assert [r["round"] for r in sink.rows["rounds"]] == [0, 1]
    assert ("dispatch", 2) not in events


def test_replayed_rounds_are_trained_but_neither_evaluated_nor_recorded_again():
    events: list[tuple[Any, ...]] = []
    sink = ListSink(events)
    progress = LoopProgress(Durable(1, 4.0, {}), recorded=3)  # rolled back to round 1
    loop = _loop(FakeWorkers(events), sink, [_evaluation(events, every=1)], progress=progress)
    loop.run()
    assert [r["round"] for r in sink.rows["rounds"]] == [3, 4]
    assert [e[1] for e in events if e[0] == "evaluate"] == [3, 4]
    assert [e[1] for e in events if e[0] == "dispatch"] == [1, 2, 3, 4]
    assert loop.progress.durable.state == 4.0 + 4 * (2 + 3 + 4 + 5)


def test_relayed_states_are_delivered_before_evaluation_and_at_the_end():
    events: list[tuple[Any, ...]] = []
    workers = FakeWorkers(events)
    loop = _loop(workers, ListSink(events), [_evaluation(events, every=2)], rounds=4,
                 migrate=True)
    loop.run()
    for round_ in (1, 3):
        at = events.index(("evaluate", round_))
        assert events[at - 1] == ("deliver", 2)  # both workers' relayed states, then evaluate
    assert not loop.in_flight and workers.delivered == 4
    # after rounds without evaluation the relayed states travel with the next dispatch
    assert workers.handed_over == [0, 2, 0, 2]


@pytest.mark.parametrize(("members", "audited"), [(8, [4]), (0, [])])
def test_the_membership_audit_attacks_the_last_round_only(members, audited):
    events: list[tuple[Any, ...]] = []
    workers = FakeWorkers(events)
    _loop(workers, ListSink(events), [MembershipAudit(members, rounds=5)]).run()
    assert workers.audited == audited


def test_a_checkpoint_round_trips_its_arrays_and_one_of_an_earlier_format_is_refused(tmp_path):
    """Checkpoints are state files (arrays as npz members, the rest JSON) with a format
    number; one an earlier version wrote (a pickle, or a ``torch.save`` archive) is refused
    with one paragraph, never read."""
    import pickle

    import torch

    from raysim.errors import RaysimError
    from raysim.rounds.checkpoint import Checkpoint, save_checkpoint
    from raysim.vectors.weights import FlatWeights

    states = {3: (FlatWeights(np.arange(6, dtype=np.float32), (("w", (2, 3)),)), None)}
    written = Checkpoint(0, 5, {"global": {"w": np.ones(3)}, "step": np.float32(0.5),
                                "t": torch.arange(4)}, states, 7)
    path = save_checkpoint(tmp_path / "new", written)
    assert path.read_bytes()[:4] == b"PK\x03\x04"
    loaded = load_checkpoint(tmp_path / "new")
    assert loaded is not None and (loaded.next_round, loaded.next_part) == (5, 7)
    assert np.array_equal(loaded.client_states[3][0]["w"], np.arange(6).reshape(2, 3))
    assert loaded.client_states[3][0].layout == (("w", (2, 3)),)
    assert type(loaded.server_state["step"]) is np.float32
    assert torch.equal(loaded.server_state["t"], torch.arange(4))
    earlier = {k: v for k, v in written.__dict__.items() if k != "format"}
    earlier["server_versions"] = {}
    for name, write in (("pickled", lambda path: path.write_bytes(pickle.dumps(earlier))),
                        ("zipped", lambda path: torch.save(earlier, path))):
        legacy = tmp_path / name / "checkpoint" / "latest.pt"
        legacy.parent.mkdir(parents=True)
        write(legacy)
        with pytest.raises(RaysimError, match="written by an earlier version of raysim") as error:
            load_checkpoint(tmp_path / name)
        assert "\n" not in str(error.value) and "without --resume" in str(error.value)
        assert str(legacy) in str(error.value)
    unregistered = Checkpoint(0, 1, {"model": object()}, {}, 1)
    with pytest.raises(TypeError, match="register its class"):
        save_checkpoint(tmp_path / "unregistered", unregistered)
    assert not any((tmp_path / "unregistered").rglob("*.tmp"))  # no temporary file is left


class _Payload:
    """A pickle that runs a command when it is loaded."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("placement", ["pickle as the checkpoint", "pickle inside the npz",
                                       "damaged npz", "empty file"])
def test_a_crafted_or_damaged_checkpoint_runs_no_code_and_is_refused_naming_the_file(
        tmp_path, placement):
    """A checkpoint is never unpickled: a crafted one (a pickle whose loading runs a command,
    whether it replaces the file or hides in one of its arrays) and a damaged one are refused
    with one paragraph naming the file, and the command never runs."""
    import io
    import pickle
    import zipfile

    from raysim.errors import RaysimError
    from raysim.rounds.checkpoint import CHECKPOINT_FILE, Checkpoint, save_checkpoint

    marker = tmp_path / "ran"
    run_dir = tmp_path / "run"
    path = save_checkpoint(run_dir, Checkpoint(0, 2, {"w": np.ones(3)}, {}, 2))
    if placement == "pickle as the checkpoint":
        path.write_bytes(pickle.dumps(_Payload(marker)))
    elif placement == "pickle inside the npz":
        buffer = io.BytesIO()
        np.save(buffer, np.array([_Payload(marker)], dtype=object), allow_pickle=True)
        with zipfile.ZipFile(path) as archive:  # the header names the array a0: replace it
            header = archive.read("header.npy")
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("header.npy", header)
            archive.writestr("a0.npy", buffer.getvalue())
    elif placement == "damaged npz":
        data = bytearray(path.read_bytes())
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:
        path.write_bytes(b"")
    with pytest.raises(RaysimError) as error:
        load_checkpoint(run_dir)
    message = str(error.value)
    assert "\n" not in message and str(run_dir / CHECKPOINT_FILE) in message
    assert not marker.exists()
    if placement == "pickle inside the npz":
        assert "Object arrays cannot be loaded" in message
