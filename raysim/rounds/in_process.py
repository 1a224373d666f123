"""A run's workers and result sink inside one process, for the production round loop without
Ray: the algorithm contract's and the methods' tests run :class:`~raysim.rounds.round_loop.
RoundLoop` on these, so what they check is the loop the engine runs."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from raysim.rounds.client_work import ClientWork
from raysim.rounds.round_loop import RoundReply


class InProcessWorkers:
    """The round loop's :class:`~raysim.rounds.round_loop.Workers` over :class:`ClientWork`
    objects in this process: a round runs when it is dispatched, and relayed client states
    travel as the states themselves."""

    def __init__(self, works: list[ClientWork]):
        self.works = works

    def run_round(self, round_: int, message: dict[str, Any], work: dict[int, np.ndarray],
                  incoming: dict[int, list[Any]], moves: dict[int, np.ndarray],
                  audit: bool = False) -> list[RoundReply]:
        return [self.works[w].run_round(round_, message, clients, incoming.get(w, []),
                                        moves.get(w), audit)
                for w, clients in work.items()]

    def collect(self, handle: list[RoundReply]) -> list[RoundReply]:
        return handle

    def deliver(self, incoming: dict[int, list[Any]]) -> None:
        for w, bundles in incoming.items():
            self.works[w].receive(bundles)

    def snapshot_states(self) -> dict[int, Any]:
        return {client: state for work in self.works
                for client, state in work.client_states.items()}


class MemorySink:
    """The round loop's :class:`~raysim.rounds.round_loop.Sink` as lists of rows in memory."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = defaultdict(list)

    @property
    def next_part(self) -> int:
        return 0

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.rows[table].extend(rows)

    def add_columns(self, table: str, columns: dict[str, np.ndarray]) -> None:
        count = len(next(iter(columns.values()))) if columns else 0
        self.rows[table].extend({name: values[i] for name, values in columns.items()}
                                for i in range(count))

    def maybe_flush(self) -> bool:
        return False

    def flush(self) -> None:
        pass
