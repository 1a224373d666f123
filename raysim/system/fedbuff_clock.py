"""The simulated clock of asynchronous buffered aggregation (FedBuff, Nguyen et al. 2022): up
to ``concurrency`` clients train at once, each from the server version current when it
started; the server applies an update after every ``buffer_size`` arrivals, each arrival of
staleness s (server updates since it started) weighted (1 + s)^-exponent (the paper's
polynomial staleness function; exponent 0.5 is its 1 / sqrt(1 + s)). A freed slot is filled
at once by a client available then and not training (a seeded uniform draw); a client whose
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
    OUTCOME_DTYPE,
    TRAINED,
    RoundPlan,
    SiteTimes,
    Workload,
    next_online,
    round_plan,
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
    times = SiteTimes.of(profiles, workload)
    training = 0
    events: list[tuple[float, int, int]] = []  # (finish, client, start number)
    started: dict[int, tuple[float, int, bool]] = {}  # start number: (start, version, offline)
    starts = 0
    version, now, previous = 0, 0.0, 0.0
    buffer: list[tuple[int, float, int]] = []  # (client, start, start version)
    dropped: list[tuple[int, float, int]] = []
    plans: list[RoundPlan] = []

    def fill(time: float) -> None:
        nonlocal starts, training
        free = concurrency - training
        if free <= 0:
            return
        picks = np.flatnonzero(online.at(time) & ~busy)  # one update per site and buffer
        if len(picks) > free:  # a seeded uniform draw of the sites that start
            picks = (picks[[rng.integers(len(picks))]] if free == 1  # an arrival's slot
                     else rng.choice(picks, free, replace=False))
        busy[picks] = True
        for client in picks.tolist():  # mostly one: the slot an arrival freed
            finish = float(times.finish(client, time))
            window = profiles[client].availability.window_at(time)
            late = window is None or not finish <= window[1]  # offline before it finishes
            starts += 1
            training += 1
            started[starts] = (time, version, late)
            heapq.heappush(events, (finish, client, starts))

    def update(end: float) -> RoundPlan:
        rows = buffer + dropped
        clients = np.array([row[0] for row in rows], dtype=np.int64)
        versions = np.array([row[2] for row in rows], dtype=np.int64)
        outcomes = np.array([TRAINED] * len(buffer) + [OFFLINE] * len(dropped),
                            dtype=OUTCOME_DTYPE)
        weights = np.array([staleness_weight(version - row[2], exponent) for row in buffer]
                           + [1.0] * len(dropped))
        return round_plan(version, previous, end, clients, np.array([row[1] for row in rows]),
                          times, outcomes, versions, weights)

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
        start, start_version, late = started.pop(key)
        training -= 1
        if late:
            dropped.append((client, start, start_version))
            busy[client] = False
        else:
            buffer.append((client, start, start_version))  # busy until the next update
        if len(buffer) == buffer_size:
            plans.append(update(now))
            busy[[row[0] for row in buffer]] = False
            buffer, dropped, previous = [], [], now
            version += 1
        fill(now)
    return plans


__all__ = ["fedbuff_plan", "staleness_weight"]
