"""A run's differential-privacy settings, resolved before the run: the sampling rate, delta,
the noise multiplier (calibrated to ``target_epsilon`` when unset) and the rounds the budget
allows."""

from __future__ import annotations

from dataclasses import dataclass

from raysim.privacy.accountant import ACCOUNTANTS, calibrate, default_delta, epsilon
from raysim.schema import PrivacyConfig


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

    @property
    def expected_clients(self) -> float:
        """The expected number of sampled clients (the private mean's denominator)."""
        return self.rate * self.num_clients

    @property
    def noise_std(self) -> float:
        """Std of the Gaussian noise on a sum of clipped updates."""
        return self.noise_multiplier * self.clip

    def epsilon_after(self, rounds: int) -> float:
        """epsilon at ``delta`` after ``rounds`` rounds."""
        return epsilon(self.accountant, self.rate, self.noise_multiplier, rounds, self.delta)

    def describe(self) -> dict[str, object]:
        """The settings for the run's manifest (with the accountant's library class)."""
        return {"clip": self.clip, "noise_multiplier": self.noise_multiplier,
                "mode": self.mode, "delta": self.delta, "sampling": "poisson",
                "sampling_rate": self.rate, "accountant": ACCOUNTANTS[self.accountant],
                "target_epsilon": self.target_epsilon, "calibrated": self.calibrated,
                "rounds_allowed": self.rounds_allowed}


def resolve(config: PrivacyConfig, num_clients: int, clients_per_round: int, rounds: int
            ) -> DpSettings:
    """The run's settings from the config section (calibration and the round cap here)."""
    rate = min(1.0, clients_per_round / num_clients)
    delta = config.delta if config.delta is not None else default_delta(num_clients)
    calibrated = config.noise_multiplier is None
    if calibrated:
        assert config.target_epsilon is not None  # the schema requires one of the two
        noise = calibrate(config.accountant, rate, rounds, config.target_epsilon, delta)
    else:
        noise = float(config.noise_multiplier)  # type: ignore[arg-type]
    allowed = rounds
    if config.target_epsilon is not None and not calibrated:
        target = config.target_epsilon
        low, high = 0, rounds  # epsilon grows with the rounds: the last round within target
        while low < high:
            middle = (low + high + 1) // 2
            if epsilon(config.accountant, rate, noise, middle, delta) <= target:
                low = middle
            else:
                high = middle - 1
        allowed = low
    return DpSettings(config.clip, noise, config.mode, delta, rate, num_clients,
                      config.accountant, allowed, config.target_epsilon, calibrated)
