"""The simulated clock of asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022): up
to ``concurrency`` clients train at once, each from the server version current when it
started; the server applies an update after every ``buffer_size`` arrivals, each arrival of
staleness s (server updates since it started) weighted (1 + s)^-exponent (the paper's
polynomial staleness function; exponent 0.5 is its 1 / sqrt(1 + s)). A freed slot is filled
at once by a client available then and not training (a seeded draw); a client whose
availability window closes before it finishes drops out and frees its slot. A site whose
update waits in the buffer starts again only after the server's next update (one update per
site and buffer: the engine trains each client once per round).

The plan is a pure function of the profiles, the workload and the seed, computed before the
run: round r of the engine is server update r, which trains the clients of its buffer from
their own start versions.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from raysim.seeding import numpy_rng
from raysim.system.clock import (
    OFFLINE,
    ClientTiming,
    RoundPlan,
    Workload,
    client_timing,
    finishes_online,
    next_online,
)
from raysim.system.profiles import OnlineMask, SiteProfile


def staleness_weight(staleness: int, exponent: float) -> float:
    """(1 + staleness)^-exponent."""
    return float((1 + staleness) ** -exponent)


def fedbuff_plan(profiles: list[SiteProfile], workload: Workload, rounds: int,
                 buffer_size: int, concurrency: int, exponent: float, seed: int
                 ) -> list[RoundPlan]:
    """Every server update's buffer: its clients (with start versions and weights), the
    dropouts since the last update, and the update's start (the previous update) and end."""
    training: set[int] = set()
    events: list[tuple[float, int, int]] = []  # (finish, client, start version)
    timings: dict[tuple[int, int], ClientTiming] = {}
    starts = 0
    version, now, previous = 0, 0.0, 0.0
    buffer: list[ClientTiming] = []
    dropped: list[ClientTiming] = []
    plans: list[RoundPlan] = []

    def fill(time: float) -> None:
        nonlocal starts
        if len(training) >= concurrency:
            return
        idle = np.flatnonzero(online.at(time) & ~busy)  # one update per site and buffer
        picks = rng.permutation(idle)[:concurrency - len(training)]
        for client in picks.tolist():
            busy[client] = True
            starts += 1
            timing = client_timing(profiles[client], workload, client, time,
                                   start_version=version)
            if not finishes_online(profiles[client], timing):
                timing = ClientTiming(timing.client, timing.start, timing.download_s,
                                      timing.compute_s, timing.upload_s, OFFLINE, version)
            training.add(client)
            timings[(client, starts)] = timing
            heapq.heappush(events, (timing.finish, client, starts))

    rng = numpy_rng(seed, "system-fedbuff")  # one stream: the plan is computed in order
    online = OnlineMask(profiles)
    busy = np.zeros(len(profiles), dtype=bool)  # training, or waiting in the buffer
    fill(now)
    while len(plans) < rounds:
        if not events:  # nobody training: wait for the next window
            now = next_online(profiles, now)
            if math.isinf(now):
                raise ValueError("no site is ever available again")
            fill(now)
            continue
        now, client, key = heapq.heappop(events)
        timing = timings.pop((client, key))
        training.discard(client)
        if timing.status == OFFLINE:
            dropped.append(timing)
            busy[client] = False
        else:
            buffer.append(timing)  # busy until the server's next update
        if len(buffer) == buffer_size:
            weights = {t.client: staleness_weight(version - t.start_version, exponent)
                       for t in buffer}
            plans.append(RoundPlan(version, previous, now, tuple(buffer + dropped), weights))
            busy[[t.client for t in buffer]] = False
            buffer, dropped, previous = [], [], now
            version += 1
        fill(now)
    return plans


__all__ = ["fedbuff_plan", "staleness_weight"]
