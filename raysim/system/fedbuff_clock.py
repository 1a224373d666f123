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
    no_site_available,
    round_plan,
)
from raysim.system.profiles import OnlineMask, SiteProfile


def staleness_weight(staleness: int, exponent: float) -> float:
    """(1 + staleness)^-exponent."""
    return float((1 + staleness) ** -exponent)


class IdleSites:
    """The sites that are available and not busy (training, or waiting in the buffer): the
    candidates of a freed slot, kept as a list between changes of the availability mask so
    that an arrival's draw costs O(1), not a scan of every site.

    The list's order depends on the earlier starts and releases (a start swaps the last entry
    into its place), not on ids; a draw is uniform over the entries whatever their order, and
    the order is a function of the seed's history, so the plan stays deterministic."""

    def __init__(self, online: OnlineMask):
        self.online = online
        count = len(online.always)
        self.busy = np.zeros(count, dtype=bool)
        self.position = [-1] * count
        """Each site's index in ``sites`` (-1: not a candidate; a list: read per arrival)."""
        self.sites: list[int] = []
        self.mask: np.ndarray | None = None
        """The availability mask ``sites`` was built from (rebuilt when it changes)."""
        self._uniforms: list[float] = []
        self._next_uniform = 0

    UNIFORM_BLOCK = 1024
    """Uniforms drawn from the generator at a time for single-slot draws (one numpy call per
    arrival cost more than the rest of the arrival's bookkeeping)."""

    def take(self, time: float, free: int, rng: np.random.Generator) -> list[int]:
        """Up to ``free`` sites available at ``time`` and idle (all of them, in id order, when
        they fit; else a seeded uniform draw without replacement), marked busy."""
        mask = self.online.at(time)
        if mask is not self.mask:  # a window opened or closed: rebuild from the mask
            self.mask = mask
            self.sites = np.flatnonzero(mask & ~self.busy).tolist()
            self.position = [-1] * len(self.position)
            for index, site in enumerate(self.sites):
                self.position[site] = index
        sites = self.sites
        count = len(sites)
        if count <= free:
            chosen = sorted(sites)
        elif free == 1:  # an arrival's slot: floor(u x count) is uniform to 2^-53 of a site
            if self._next_uniform == len(self._uniforms):
                self._uniforms, self._next_uniform = rng.random(self.UNIFORM_BLOCK).tolist(), 0
            uniform = self._uniforms[self._next_uniform]
            self._next_uniform += 1
            chosen = [sites[min(int(uniform * count), count - 1)]]
        else:
            chosen = [sites[i] for i in rng.choice(count, free, replace=False).tolist()]
        busy, position = self.busy, self.position
        for site in chosen:
            busy[site] = True
            index, last = position[site], sites.pop()
            if last != site:  # the last entry fills the hole
                sites[index] = last
                position[last] = index
            position[site] = -1
        return chosen

    def release(self, sites: list[int]) -> None:
        """``sites`` are idle again (candidates if the current mask has them available)."""
        for site in sites:
            self.busy[site] = False
            if self.mask is not None and self.mask[site] and self.position[site] < 0:
                self.position[site] = len(self.sites)
                self.sites.append(site)


def fedbuff_plan(profiles: list[SiteProfile], workload: Workload, rounds: int,
                 buffer_size: int, concurrency: int, exponent: float, seed: int
                 ) -> list[RoundPlan]:
    """Every server update's buffer: its clients (with start versions and weights), the
    dropouts since the last update, and the update's start (the previous update) and end."""
    times = SiteTimes.of(profiles, workload)
    # per arrival: Python floats (numpy scalars cost more than the arithmetic), added in the
    # order of SiteTimes.finish so that the times are the same to the bit
    download, compute, upload = (times.download_s.tolist(), times.compute_s.tolist(),
                                 times.upload_s.tolist())
    availabilities = [profile.availability for profile in profiles]
    always = [availability.always for availability in availabilities]
    training = 0
    # (finish or drop-out time, client, start number, start, start version, late: offline
    # before it finishes);
    # the start number is unique, so later entries are never compared
    events: list[tuple[float, int, int, float, int, bool]] = []
    starts = 0
    version, now, previous = 0, 0.0, 0.0
    buffer: list[tuple[int, float, int]] = []  # (client, start, start version)
    dropped: list[tuple[int, float, int]] = []
    plans: list[RoundPlan] = []
    push, pop = heapq.heappush, heapq.heappop

    def fill(time: float) -> None:
        nonlocal starts, training
        free = concurrency - training
        if free <= 0:
            return
        for client in idle.take(time, free, rng):  # mostly one: the slot an arrival freed
            finish = time + download[client] + compute[client] + upload[client]
            window = (time, math.inf) if always[client] else \
                availabilities[client].window_at(time)
            starts += 1
            training += 1
            late = window is None or not finish <= window[1]  # offline before it finishes
            # a client that drops out frees its slot when it drops (its window's end)
            push(events, (min(finish, time if window is None else window[1]) if late else finish,
                          client, starts, time, version, late))

    def update(end: float) -> RoundPlan:
        clients, starts_at, versions = (np.array(column) for column in zip(*buffer, *dropped,
                                                                          strict=True))
        outcomes = np.full(len(clients), OFFLINE, dtype=OUTCOME_DTYPE)
        outcomes[:len(buffer)] = TRAINED
        weights = np.ones(len(clients))
        staleness, which = np.unique(version - versions[:len(buffer)], return_inverse=True)
        weights[:len(buffer)] = np.array(  # Python's power, once per distinct staleness
            [staleness_weight(int(value), exponent) for value in staleness])[which]
        return round_plan(version, previous, end, clients.astype(np.int64, copy=False),
                          starts_at.astype(float, copy=False), times, outcomes,
                          versions.astype(np.int64, copy=False), weights)

    rng = numpy_rng(seed, "system-fedbuff")  # one stream: the plan is computed in order
    idle = IdleSites(OnlineMask(profiles))  # not training nor waiting in the buffer
    fill(now)
    while len(plans) < rounds:
        if not events:  # nobody training: wait for the next window
            later = next_online(profiles, now)
            if math.isinf(later):
                raise no_site_available(len(plans), rounds, now)
            now = later
            fill(now)
            continue
        now, client, _, start, start_version, late = pop(events)
        training -= 1
        if late:
            dropped.append((client, start, start_version))
            idle.release([client])
        else:
            buffer.append((client, start, start_version))  # busy until the next update
        if len(buffer) == buffer_size:
            plans.append(update(now))
            idle.release([row[0] for row in buffer])
            buffer, dropped, previous = [], [], now
            version += 1
        fill(now)
    return plans


__all__ = ["fedbuff_plan", "staleness_weight"]
