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

A round's plan holds its selected clients as columns (numpy arrays, one entry per client), so
that planning, sending the plan to the driver and recording it cost array operations, not a
Python object per client and round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raysim.errors import ConfigError
from raysim.seeding import numpy_rng
from raysim.system.profiles import OnlineMask, SiteProfile

TRAINED, LATE, OFFLINE, SURPLUS = "trained", "late", "offline", "surplus"
"""A selected client's outcome: its update is used; it missed the deadline; its availability
window closed before it finished; over-selection kept the first k finishers without it."""

OUTCOME_DTYPE = "<U7"
"""The outcomes' array type (the longest name, "offline"/"trained"/"surplus", has 7 letters)."""


@dataclass(frozen=True, eq=False)
class RoundPlan:
    """What the clock decided for one round (for fedbuff: one server update): its start and
    end, and one entry per selected client in each column (simulated seconds)."""

    round: int
    start: float
    end: float
    clients: np.ndarray
    """int64: the selected clients."""
    starts: np.ndarray
    """When each started (the round's start; fedbuff: when its slot freed)."""
    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray
    outcomes: np.ndarray
    """Each client's outcome (TRAINED, LATE, OFFLINE or SURPLUS)."""
    start_versions: np.ndarray
    """int64, fedbuff: the server version each client trained from (-1: the round's own)."""
    staleness_weights: np.ndarray
    """fedbuff: each trained client's weight (1 + staleness)^-exponent (1 elsewhere)."""

    @property
    def finish(self) -> np.ndarray:
        """When each client finished (start + download + compute + upload)."""
        return self.starts + self.download_s + self.compute_s + self.upload_s

    @property
    def trained(self) -> np.ndarray:
        """The clients whose updates the round uses, sorted."""
        return np.sort(self.clients[self.outcomes == TRAINED])


def round_plan(round_: int, start: float, end: float, clients: np.ndarray, starts: np.ndarray,
               times: SiteTimes, outcomes: np.ndarray, start_versions: np.ndarray | None = None,
               staleness_weights: np.ndarray | None = None) -> RoundPlan:
    """A round's plan, each client's transfer and compute times looked up in ``times``."""
    count = len(clients)
    return RoundPlan(round_, start, end, clients, starts, times.download_s[clients],
                     times.compute_s[clients], times.upload_s[clients], outcomes,
                     np.full(count, -1, dtype=np.int64) if start_versions is None
                     else start_versions,
                     np.ones(count) if staleness_weights is None else staleness_weights)


@dataclass(frozen=True)
class Workload:
    """Per-client work and message sizes the clock needs."""

    train_gflop: np.ndarray
    """Training GFLOPs of each client's round (3 x forward FLOPs x samples)."""
    down_bytes: float
    up_bytes: float


@dataclass(frozen=True)
class SiteTimes:
    """Every client's download, compute and upload seconds (the same in every round)."""

    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray

    @classmethod
    def of(cls, profiles: Sequence[SiteProfile], workload: Workload) -> SiteTimes:
        """Broadcast bytes / downlink, training GFLOPs / speed, upload bytes / uplink."""
        def column(name: str) -> np.ndarray:
            return np.array([getattr(p, name) for p in profiles], dtype=float)

        return cls(workload.down_bytes * 8 / (column("down_mbps") * 1e6),
                   np.asarray(workload.train_gflop, dtype=float) / column("speed_gflops"),
                   workload.up_bytes * 8 / (column("up_mbps") * 1e6))

    def finish(self, clients: np.ndarray | int, start: float) -> np.ndarray:
        """When each of ``clients`` finishes a round it starts at ``start``."""
        return start + self.download_s[clients] + self.compute_s[clients] + self.upload_s[
            clients]


def no_site_available(planned: int, rounds: int, time: float) -> ConfigError:
    """The error of a plan that runs out of available sites: every site's availability ended
    (windows without a period) before the run's rounds were planned."""
    return ConfigError(
        f"The simulated clock cannot plan the run: it planned {planned} of "
        f"training.rounds={rounds} rounds, and from simulated hour {time / 3600.0:.4g} on no "
        "site is ever available again: every site's availability windows have ended (windows "
        "from a trace without `period_h` happen once). Sites train only while available. Let the "
        "windows repeat (`period_h` in the trace), make them longer (`available_to_h`), "
        "add sites that are always available, or lower training.rounds.")


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
    times = SiteTimes.of(profiles, workload)
    for round_ in range(rounds):
        online = np.flatnonzero(mask.at(now))
        if not len(online):  # nobody can train: the clock jumps to the next window
            later = next_online(profiles, now)
            if math.isinf(later):
                raise no_site_available(round_, rounds, now)
            now = later
            online = np.flatnonzero(mask.at(now))
        wanted = min(clients_per_round, len(profiles))
        if policy == "overselect":
            wanted = math.ceil(wanted * (1 + over_selection))
        count = min(wanted, len(online))
        chosen = np.sort(numpy_rng(seed, "system-select", round_).choice(
            online, count, replace=False))
        finish = times.finish(chosen, now)
        outcomes = np.full(count, TRAINED, dtype=OUTCOME_DTYPE)
        offline = ~(finish <= mask.window_end(chosen, now))
        outcomes[offline] = OFFLINE
        if policy == "deadline" and deadline_s is not None:
            outcomes[~offline & (finish > now + deadline_s)] = LATE
        if policy == "overselect":
            _keep_first(outcomes, chosen, finish, min(clients_per_round, len(profiles)))
        dropped_at = np.minimum(finish, mask.window_end(chosen, now))  # offline: window's end
        end = _round_end(outcomes, np.where(offline, dropped_at, finish), now, policy,
                         deadline_s)
        plans.append(round_plan(round_, now, end, chosen, np.full(count, now), times,
                                outcomes))
        now = end
    return plans


def _keep_first(outcomes: np.ndarray, clients: np.ndarray, finish: np.ndarray,
                keep: int) -> None:
    """Over-selection: the first ``keep`` clients to finish (ties: lower id) stay trained; the
    other finishers become surplus (in place)."""
    finished = np.flatnonzero(outcomes == TRAINED)
    order = finished[np.lexsort((clients[finished], finish[finished]))]
    outcomes[order[keep:]] = SURPLUS


def _round_end(outcomes: np.ndarray, finish: np.ndarray, start: float, policy: str,
               deadline_s: float | None) -> float:
    """When the server ends a round that started at ``start``: at the deadline (deadline
    policy, when anyone is late or dropped), else when the last trained client finished, else
    (nobody finished) when the last selected client dropped out. ``finish``: each client's
    finish time, or for one that went offline the time it dropped."""
    trained = finish[outcomes == TRAINED]
    if policy == "deadline" and deadline_s is not None and bool(np.any(
            (outcomes == LATE) | (outcomes == OFFLINE))):
        return start + deadline_s  # the server waits until the deadline
    if len(trained):
        return float(trained.max())
    # nobody finished: the round lasts until the last selected client dropped out
    if not len(finish):
        return start
    return float(np.minimum(finish, start + (deadline_s or math.inf)).max())
