"""A run's differential-privacy settings, resolved before the run: the sampling rate, delta,
the noise multiplier (calibrated to ``target_epsilon`` when unset) and the rounds the budget
allows."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raysim.configuration.schema import PrivacyConfig
from raysim.errors import ConfigError
from raysim.privacy.accountant import ACCOUNTANTS, calibrate, default_delta, epsilon


@dataclass(frozen=True)
class AdaptiveClip:
    """Adaptive clipping (Andrew et al. 2021, Algorithm 1 with geometric updates)."""

    target_quantile: float
    learning_rate: float
    count_noise_std: float
    """Std of the Gaussian noise on the sum of the within-clip bits."""
    update_noise_multiplier: float
    """The updates' noise multiplier z_delta = (z^-2 - (2 count_noise_std)^-2)^-1/2: the two
    Gaussian mechanisms (updates with sensitivity clip, bits centred at 1/2 with sensitivity
    1/2) compose to one of noise multiplier z, which the accountant tracks."""

    def next_clip(self, clip: float, within: float, sampled: float, expected: float,
                  noise: float) -> float:
        """The clip after a round in which ``within`` of the ``sampled`` clients' updates were
        within ``clip``. The server sees the sum of the bits centred at 1/2 (b - 1/2: one
        client changes it by at most 1/2, the sensitivity the noise split assumes) plus
        ``noise`` drawn at std ``count_noise_std``, and estimates the share as 1/2 + that sum
        over the expected number of sampled clients (a fixed denominator, as for the mean)."""
        share = 0.5 + (within - sampled / 2 + noise) / expected
        return clip * math.exp(-self.learning_rate * (share - self.target_quantile))


@dataclass(frozen=True)
class DpSettings:
    """What the workers, the server and the accountant of one run use."""

    clip: float
    noise_multiplier: float
    mode: str
    """"central" (the server noises the sum) or "local" (every client its update)."""
    delta: float
    rate: float
    """Poisson sampling rate: clients_per_round / num_clients."""
    num_clients: int
    accountant: str
    rounds_allowed: int
    """Rounds the run may take: all, or the last before epsilon would exceed the target."""
    target_epsilon: float | None = None
    calibrated: bool = False
    """True when the noise multiplier was calibrated to ``target_epsilon``."""
    adaptive: AdaptiveClip | None = None
    """Adaptive clipping; ``clip`` is then the first round's clip."""

    @property
    def expected_clients(self) -> float:
        """The expected number of sampled clients (the private mean's denominator)."""
        return self.rate * self.num_clients

    @property
    def noise_std(self) -> float:
        """Std of the Gaussian noise on a sum of clipped updates (at the first clip)."""
        return self.noise_std_at(self.clip)

    def noise_std_at(self, clip: float) -> float:
        """Std of the noise on a sum of updates clipped at ``clip`` (with adaptive clipping,
        the updates' share of the noise multiplier)."""
        multiplier = (self.noise_multiplier if self.adaptive is None
                      else self.adaptive.update_noise_multiplier)
        return multiplier * clip if multiplier > 0 else 0.0  # (no noise at an infinite clip)

    def epsilon_after(self, rounds: int) -> float:
        """epsilon at ``delta`` after ``rounds`` rounds."""
        return epsilon(self.accountant, self.rate, self.noise_multiplier, rounds, self.delta)

    def describe(self) -> dict[str, object]:
        """The settings for the run's manifest (with the accountant's library class)."""
        return {"clip": self.clip, "noise_multiplier": self.noise_multiplier,
                "mode": self.mode, "delta": self.delta, "sampling": "poisson",
                "sampling_rate": self.rate, "accountant": ACCOUNTANTS[self.accountant],
                "target_epsilon": self.target_epsilon, "calibrated": self.calibrated,
                "rounds_allowed": self.rounds_allowed,
                "adaptive_clip": None if self.adaptive is None else {
                    "target_quantile": self.adaptive.target_quantile,
                    "learning_rate": self.adaptive.learning_rate,
                    "count_noise_std": self.adaptive.count_noise_std,
                    "update_noise_multiplier": self.adaptive.update_noise_multiplier}}


def resolve(config: PrivacyConfig, num_clients: int, clients_per_round: int, rounds: int,
            releases_per_round: int = 1) -> DpSettings:
    """The run's settings from the config section (calibration and the round cap here;
    ``releases_per_round``: the most Gaussian mechanisms a client's round composes, counted
    for every round by the calibration and the cap)."""
    rate = min(1.0, clients_per_round / num_clients)
    delta = config.delta if config.delta is not None else default_delta(num_clients)
    calibrated = config.noise_multiplier is None
    if calibrated:
        assert config.target_epsilon is not None  # the schema requires one of the two
        noise = calibrate(config.accountant, rate, rounds * releases_per_round,
                          config.target_epsilon, delta)
    else:
        noise = float(config.noise_multiplier)  # type: ignore[arg-type]
    allowed = rounds
    if config.target_epsilon is not None and not calibrated:
        target = config.target_epsilon
        low, high = 0, rounds  # epsilon grows with the rounds: the last round within target
        while low < high:
            middle = (low + high + 1) // 2
            if epsilon(config.accountant, rate, noise, middle * releases_per_round,
                       delta) <= target:
                low = middle
            else:
                high = middle - 1
        allowed = low
    adaptive = None
    if config.adaptive_clip is not None:
        adaptive = _adaptive(config, noise, rate * num_clients)
    return DpSettings(config.clip, noise, config.mode, delta, rate, num_clients,
                      config.accountant, allowed, config.target_epsilon, calibrated, adaptive)


def _adaptive(config: PrivacyConfig, noise: float, expected: float) -> AdaptiveClip:
    """The adaptive-clipping settings, with the updates' share of the noise multiplier."""
    assert config.adaptive_clip is not None
    settings = config.adaptive_clip
    if config.mode != "central":
        raise ConfigError(
            "Invalid config field `privacy.adaptive_clip`: adaptive clipping (Andrew et al. "
            "2021) is defined for central DP, where the server noises the sum of the updates "
            "and the count of clients within the clip; with privacy.mode: local every client "
            "noises its own update. Set privacy.mode: central, or remove privacy.adaptive_clip.")
    count_std = (settings.count_noise_std if settings.count_noise_std is not None
                 else expected / 20)
    if noise == 0:
        return AdaptiveClip(settings.target_quantile, settings.learning_rate, count_std, 0.0)
    if 2 * count_std <= noise:
        raise ConfigError(
            f"Invalid config field `privacy.adaptive_clip.count_noise_std` = {count_std:.4g}: "
            f"the count's noise multiplier 2 x {count_std:.4g} must exceed the run's noise "
            f"multiplier {noise:.4g}, whose budget the count shares with the updates (z_delta "
            f"= (z^-2 - (2 sigma_b)^-2)^-1/2). Raise count_noise_std above {noise / 2:.4g} "
            "(the paper uses expected clients / 20), or use more clients per round.")
    update = (noise ** -2 - (2 * count_std) ** -2) ** -0.5
    return AdaptiveClip(settings.target_quantile, settings.learning_rate, count_std, update)
