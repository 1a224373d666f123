"""Sites' system profiles: training speed, bandwidth and availability, from built-in tiers,
seeded log-normal distributions or a trace file (``system:``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raysim.configuration.schema import AvailabilityConfig, SystemConfig
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng

HOUR = 3600.0


@dataclass(frozen=True)
class Availability:
    """When a site can train: ``windows`` of (start, end) seconds, repeated every ``period``
    seconds (None: the windows are absolute; no windows at all: always available)."""

    windows: tuple[tuple[float, float], ...] = ()
    period: float | None = None

    @property
    def always(self) -> bool:
        return not self.windows

    def window_at(self, time: float) -> tuple[float, float] | None:
        """The (start, end) of the window holding ``time``, or None when unavailable."""
        if self.always:
            return (time, math.inf)
        cycles: tuple[float, ...] = (0.0,)
        if self.period is not None:  # windows of the last period may reach into this one
            shift = math.floor(time / self.period) * self.period
            cycles = (shift - self.period, shift)
        for cycle in cycles:
            for start, end in self.windows:
                if start + cycle <= time < end + cycle:
                    return (start + cycle, end + cycle)
        return None

    def next_start(self, time: float) -> float:
        """The first moment at or after ``time`` when the site is available (inf: never)."""
        if self.window_at(time) is not None:
            return time
        starts = []
        for start, _ in self.windows:
            if self.period is None:
                if start >= time:
                    starts.append(start)
            else:
                cycles = math.ceil((time - start) / self.period)
                starts.append(start + cycles * self.period)
        return min(starts, default=math.inf)


@dataclass(frozen=True)
class SiteProfile:
    """One site's system: sustained training GFLOP/s, downlink and uplink Mbit/s, and when it
    can train."""

    speed_gflops: float
    down_mbps: float
    up_mbps: float
    availability: Availability = Availability()
    tier: str = ""


class OnlineMask:
    """Which sites are available at a time, for all of them at once (vectorised for sites
    that are always available or have one periodic window; others are asked one by one)."""

    CACHE_MARGIN_S = 1e-6
    """A cached mask is reused only this far (simulated seconds) before its next change."""

    def __init__(self, profiles: list[SiteProfile]):
        count = len(profiles)
        self.always = np.array([p.availability.always for p in profiles], dtype=bool)
        simple = [not p.availability.always and p.availability.period is not None
                  and len(p.availability.windows) == 1 for p in profiles]
        self.periodic = np.array(simple, dtype=bool)
        self.start = np.zeros(count)
        self.end = np.zeros(count)
        self.period = np.ones(count)
        for client in np.flatnonzero(self.periodic):
            availability = profiles[client].availability
            (start, end), = availability.windows
            self.start[client], self.end[client] = start, end
            self.period[client] = float(availability.period)  # type: ignore[arg-type]
        self.length = self.end - self.start
        self.others = [c for c in range(count) if not self.always[c] and not simple[c]]
        self.profiles = profiles
        self._cached: tuple[float, float, np.ndarray] | None = None  # (from, until, mask)

    def at(self, time: float) -> np.ndarray:
        """A boolean array: True for the sites available at ``time`` (do not modify it: a
        mask is reused until the next window opens or closes)."""
        if self._cached is not None and self._cached[0] <= time < self._cached[1]:
            return self._cached[2]
        online = self.always.copy()
        phase = np.mod(time - self.start, self.period)
        online |= self.periodic & (phase < self.length)
        for client in self.others:
            online[client] = self.profiles[client].availability.window_at(time) is not None
        if not self.others:  # the next change of a periodic window, less a margin
            change = np.where(phase < self.length, self.length - phase, self.period - phase)
            until = time + float(change[self.periodic].min(initial=math.inf))
            self._cached = (time, until - self.CACHE_MARGIN_S, online)
        return online

    def window_end(self, clients: np.ndarray, time: float) -> np.ndarray:
        """For each of ``clients``: the end of its window holding ``time`` (inf: always
        available; -inf: unavailable at ``time``), as :meth:`Availability.window_at`."""
        ends = np.where(self.always[clients], math.inf, -math.inf)
        periodic = clients[self.periodic[clients]]
        if len(periodic):
            period = self.period[periodic]
            shift = np.floor(time / period) * period
            found = np.full(len(periodic), -math.inf)
            for cycle in (shift - period, shift):  # the first window holding ``time`` wins
                start, end = self.start[periodic] + cycle, self.end[periodic] + cycle
                hit = np.isneginf(found) & (start <= time) & (time < end)
                found[hit] = end[hit]
            ends[self.periodic[clients]] = found
        for position in np.flatnonzero(~self.always[clients] & ~self.periodic[clients]):
            window = self.profiles[int(clients[position])].availability.window_at(time)
            ends[position] = -math.inf if window is None else window[1]
        return ends


@dataclass(frozen=True)
class Tier:
    """A built-in kind of site (numbers and their derivation in docs/system-heterogeneity.md)."""

    speed_gflops: float
    down_mbps: float
    up_mbps: float
    availability: AvailabilityConfig


TIERS: dict[str, Tier] = {
    # NVIDIA RTX A4000 (19.2 TFLOP/s FP32 peak, spec sheet) at about a quarter of peak for
    # small-batch training; a hospital's 1 Gbit/s link
    "workstation_gpu": Tier(5000.0, 1000.0, 1000.0, AvailabilityConfig()),
    # a two-socket CPU server (about 2 TFLOP/s FP32 peak with AVX-512) at 15 % for training
    # small convolutional models; 100 Mbit/s both ways
    "cpu_server": Tier(300.0, 100.0, 100.0, AvailabilityConfig()),
    # a desktop-class CPU (about 300 GFLOP/s peak) at 10 %, behind a 20/5 Mbit/s line, free for
    # training 8 hours a night
    "constrained_site": Tier(30.0, 20.0, 5.0, AvailabilityConfig(period_h=24.0, window_h=8.0)),
}


def periodic(config: AvailabilityConfig | None, seed: int, client: int) -> Availability:
    """A site's availability: always, or one window of ``window_h`` hours every ``period_h``
    hours at an offset drawn from the stream (seed, "system-availability", client)."""
    if config is None or config.period_h is None:
        return Availability()
    period, window = config.period_h * HOUR, config.window_h * HOUR
    offset = float(numpy_rng(seed, "system-availability", client=client).uniform(0, period))
    return Availability(((offset, offset + window),), period)


def site_profiles(config: SystemConfig, num_clients: int, seed: int) -> list[SiteProfile]:
    """Every client's profile (tiers assigned by a seeded draw with the configured shares)."""
    if config.tiers is not None:
        return _from_tiers(config.tiers, num_clients, seed)
    if config.distribution is not None:
        rng = numpy_rng(seed, "system-profiles")
        draws = {}
        for name in ("speed_gflops", "down_mbps", "up_mbps"):
            law = getattr(config.distribution, name)
            draws[name] = law.median * np.exp(law.sigma * rng.standard_normal(num_clients))
        return [SiteProfile(float(draws["speed_gflops"][c]), float(draws["down_mbps"][c]),
                            float(draws["up_mbps"][c]), periodic(config.availability, seed, c))
                for c in range(num_clients)]
    assert config.trace is not None
    return read_trace(Path(config.trace), num_clients)


def check_profiles(config: SystemConfig, num_clients: int) -> None:
    """Raise :class:`ConfigError` for tiers that do not exist or a trace that does not fit
    the clients (what :func:`site_profiles` would refuse, without drawing the profiles)."""
    if config.tiers is not None:
        check_tiers(config.tiers)
    elif config.trace is not None:
        read_trace(Path(config.trace), num_clients)


def check_tiers(shares: dict[str, float]) -> None:
    """Raise :class:`ConfigError` unless ``shares`` names built-in tiers with usable shares."""
    unknown = sorted(set(shares) - set(TIERS))
    if unknown or not shares or min(shares.values()) < 0 or sum(shares.values()) <= 0:
        raise ConfigError(
            f"Invalid config field `system.tiers` = {shares}: give each tier's share of the "
            f"sites (non-negative, not all zero); the tiers are {', '.join(TIERS)}"
            + (f", not {', '.join(unknown)}" if unknown else "") + ".")


def _from_tiers(shares: dict[str, float], num_clients: int, seed: int) -> list[SiteProfile]:
    check_tiers(shares)
    names = sorted(shares)
    weights = np.array([shares[n] for n in names], dtype=float)
    counts = np.floor(weights / weights.sum() * num_clients).astype(int)
    remainders = weights / weights.sum() * num_clients - counts
    counts[np.argsort(-remainders, kind="stable")[:num_clients - counts.sum()]] += 1
    labels = np.repeat(np.arange(len(names)), counts)
    labels = labels[numpy_rng(seed, "system-tiers").permutation(num_clients)]
    profiles = []
    for client, index in enumerate(labels):
        tier = TIERS[names[index]]
        profiles.append(SiteProfile(tier.speed_gflops, tier.down_mbps, tier.up_mbps,
                                    periodic(tier.availability, seed, client), names[index]))
    return profiles


TRACE_COLUMNS = ("client", "speed_gflops", "down_mbps", "up_mbps")


def read_trace(path: Path, num_clients: int) -> list[SiteProfile]:
    """Profiles from a CSV or Parquet trace: one row per client, or one row per availability
    window (``available_from_h``, ``available_to_h``: hours from the start, repeating every
    ``period_h`` hours where that column is set; ``python -m raysim.system.fedscale`` writes
    one from FedScale's device traces)."""
    import pandas as pd

    if not path.is_file():
        raise ConfigError(f"Invalid config field `system.trace` = {str(path)!r}: no such file. "
                          "Give a CSV or Parquet file with columns "
                          f"{', '.join(TRACE_COLUMNS)} (and optionally available_from_h, "
                          "available_to_h).")
    frame = pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)
    missing = [c for c in TRACE_COLUMNS if c not in frame.columns]
    clients = set(frame["client"].tolist()) if "client" in frame.columns else set()
    if missing or clients != set(range(num_clients)):
        problem = (f"it lacks the columns {', '.join(missing)}" if missing else
                   f"its clients are not exactly 0-{num_clients - 1}")
        raise ConfigError(f"Invalid system trace {path}: {problem}. A trace has one row per "
                          f"client (or per availability window) with columns "
                          f"{', '.join(TRACE_COLUMNS)}, for partition.num_clients = "
                          f"{num_clients} clients.")
    profiles = []
    for client in range(num_clients):
        rows = frame[frame["client"] == client]
        first = rows.iloc[0]
        windows: tuple[tuple[float, float], ...] = ()
        if "available_from_h" in rows.columns and rows["available_from_h"].notna().any():
            windows = tuple(sorted((float(a) * HOUR, float(b) * HOUR) for a, b in zip(
                rows["available_from_h"], rows["available_to_h"], strict=True)))
        period = None  # windows repeating every period_h hours (FedScale's behaviour traces)
        if "period_h" in rows.columns and rows["period_h"].notna().any():
            period = float(rows["period_h"].iloc[0]) * HOUR
        profiles.append(SiteProfile(float(first["speed_gflops"]), float(first["down_mbps"]),
                                    float(first["up_mbps"]), Availability(windows, period)))
    return profiles
