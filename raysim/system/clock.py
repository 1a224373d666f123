"""The simulated clock of a run with ``system:``: which clients train in each round and when,
for the synchronous policies (sync, deadline, over-selection). A pure function of the sites'
profiles, the clients' work and the seed: it never reads wall time, so 1 or N workers, and a
resumed run, see the same clock.

A selected client's time is download (broadcast bytes / downlink) + compute (its training
FLOPs / its speed) + upload (the model's bytes / uplink), starting at the round's start. Only
clients available at the round's start are selected (as FedScale samples online devices); one
whose availability window closes before it finishes drops out (``offline``). The round ends
when the policy says: sync at the last finisher, deadline at ``deadline_s`` if a client was late
(else at the last finisher), over-selection at the k-th finisher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from raysim.seeding import numpy_rng
from raysim.system.profiles import OnlineMask, SiteProfile

TRAINED, LATE, OFFLINE, SURPLUS = "trained", "late", "offline", "surplus"
"""A selected client's outcome: its update is used; it missed the deadline; its availability
window closed before it finished; over-selection kept the first k finishers without it."""


@dataclass(frozen=True)
class ClientTiming:
    """One selected client's times in a round (simulated seconds)."""

    client: int
    start: float
    download_s: float
    compute_s: float
    upload_s: float
    status: str
    start_version: int = -1
    """fedbuff: the server version the client trained from (-1: the round's own)."""

    @property
    def finish(self) -> float:
        return self.start + self.download_s + self.compute_s + self.upload_s


@dataclass(frozen=True)
class RoundPlan:
    """What the clock decided for one round (for fedbuff: one server update)."""

    round: int
    start: float
    end: float
    timings: tuple[ClientTiming, ...]
    staleness_weights: dict[int, float] = field(default_factory=dict)
    """fedbuff: each trained client's weight (1 + staleness)^-exponent."""

    @property
    def trained(self) -> np.ndarray:
        """The clients whose updates the round uses, sorted."""
        return np.array(sorted(t.client for t in self.timings if t.status == TRAINED),
                        dtype=np.int64)


@dataclass(frozen=True)
class Workload:
    """Per-client work and message sizes the clock needs."""

    train_gflop: np.ndarray
    """Training GFLOPs of each client's round (3 x forward FLOPs x samples)."""
    down_bytes: float
    up_bytes: float


def client_timing(profile: SiteProfile, workload: Workload, client: int, start: float,
                  status: str = TRAINED, start_version: int = -1) -> ClientTiming:
    """A client's download, compute and upload times from ``start``."""
    return ClientTiming(client, start, workload.down_bytes * 8 / (profile.down_mbps * 1e6),
                        float(workload.train_gflop[client]) / profile.speed_gflops,
                        workload.up_bytes * 8 / (profile.up_mbps * 1e6), status, start_version)


def finishes_online(profile: SiteProfile, timing: ClientTiming) -> bool:
    """Whether the client's availability window lasts until it finishes."""
    if profile.availability.always:  # (the window (start, inf) holds any finish)
        return True
    window = profile.availability.window_at(timing.start)
    return window is not None and timing.finish <= window[1]


def next_online(profiles: list[SiteProfile], time: float) -> float:
    """The first moment at or after ``time`` when some site is available."""
    return min(p.availability.next_start(time) for p in profiles)


def synchronous_plan(profiles: list[SiteProfile], workload: Workload, rounds: int,
                     clients_per_round: int, policy: str, seed: int,
                     deadline_s: float | None = None, over_selection: float = 0.0
                     ) -> list[RoundPlan]:
    """Every round's selected clients, their times and outcomes, and the round's start and end
    under ``policy`` (sync, deadline or overselect)."""
    plans, now = [], 0.0
    mask = OnlineMask(profiles)
    for round_ in range(rounds):
        online = np.flatnonzero(mask.at(now)).tolist()
        if not online:  # nobody can train: the clock jumps to the next window
            now = next_online(profiles, now)
            if math.isinf(now):
                raise ValueError("no site is ever available again")
            online = np.flatnonzero(mask.at(now)).tolist()
        wanted = min(clients_per_round, len(profiles))
        if policy == "overselect":
            wanted = math.ceil(wanted * (1 + over_selection))
        count = min(wanted, len(online))
        chosen = np.sort(numpy_rng(seed, "system-select", round_).choice(
            np.array(online), count, replace=False))
        timings = []
        for client in chosen.tolist():
            timing = client_timing(profiles[client], workload, client, now)
            if not finishes_online(profiles[client], timing):
                timing = _with_status(timing, OFFLINE)
            elif policy == "deadline" and deadline_s is not None and (
                    timing.finish > now + deadline_s):
                timing = _with_status(timing, LATE)
            timings.append(timing)
        if policy == "overselect":
            timings = _keep_first(timings, min(clients_per_round, len(profiles)))
        end = _round_end(timings, now, policy, deadline_s)
        plans.append(RoundPlan(round_, now, end, tuple(timings)))
        now = end
    return plans


def _with_status(timing: ClientTiming, status: str) -> ClientTiming:
    return ClientTiming(timing.client, timing.start, timing.download_s, timing.compute_s,
                        timing.upload_s, status, timing.start_version)


def _keep_first(timings: list[ClientTiming], keep: int) -> list[ClientTiming]:
    """Over-selection: the first ``keep`` clients to finish (ties: lower id) stay trained."""
    finished = sorted((t for t in timings if t.status == TRAINED),
                      key=lambda t: (t.finish, t.client))
    kept = {t.client for t in finished[:keep]}
    return [t if t.status != TRAINED or t.client in kept else _with_status(t, SURPLUS)
            for t in timings]


def _round_end(timings: list[ClientTiming], start: float, policy: str,
               deadline_s: float | None) -> float:
    trained = [t.finish for t in timings if t.status == TRAINED]
    if policy == "deadline" and deadline_s is not None and any(
            t.status in (LATE, OFFLINE) for t in timings):
        return start + deadline_s  # the server waits until the deadline
    if trained:
        return max(trained)
    # nobody finished: the round lasts until the last selected client dropped out
    return max((min(t.finish, start + (deadline_s or math.inf)) for t in timings),
               default=start)
