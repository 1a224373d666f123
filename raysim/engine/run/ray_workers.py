"""A run's worker actors behind the round loop's :class:`~raysim.rounds.round_loop.Workers`
interface: each call becomes actor tasks, large broadcasts go into the object store once."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

from raysim.engine.run import driver_turns as turns
from raysim.rounds.round_loop import RoundReply
from raysim.vectors.weights import payload_bytes

_INLINE_BYTES = 100 * 1024  # Ray inlines arguments below this size


class RayWorkers:
    """The round loop's calls on a list of :class:`~raysim.engine.run.worker.ClientWorker` actors."""

    def __init__(self, actors: list[Any]):
        self.actors = actors

    def run_round(self, round_: int, message: dict[str, Any], work: dict[int, np.ndarray],
                  incoming: dict[int, list[Any]], moves: dict[int, np.ndarray],
                  audit: bool = False) -> list[Any]:
        """One ``run_round`` task per worker in ``work``; returns their futures."""
        # large broadcasts go into the object store once; small ones travel inline
        message_ref = ray.put(message) if payload_bytes(message) > _INLINE_BYTES else message
        return [self.actors[w].run_round.remote(round_, message_ref, clients,
                                                incoming.get(w, []), moves.get(w), audit)
                for w, clients in work.items()]

    def collect(self, handle: list[Any]) -> list[RoundReply]:
        return turns.get(handle)

    def deliver(self, incoming: dict[int, list[Any]]) -> None:
        turns.get([self.actors[w].receive_states.remote(refs) for w, refs in incoming.items()])

    def snapshot_states(self) -> dict[int, Any]:
        client_states: dict[int, Any] = {}
        for states in turns.get([actor.snapshot_states.remote() for actor in self.actors]):
            client_states.update(states)
        return client_states
