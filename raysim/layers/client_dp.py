"""Client-level differential privacy (``privacy:``) as one feature: the config check, the
private mean around an algorithm that declares ``mean_uploads`` (:class:`PrivateMean`; an
algorithm that releases its clients' models privatizes them itself, in local mode), Poisson
sampling of the clients at the accountant's rate, the budget in every ``rounds`` row and the
round cap of ``privacy.target_epsilon``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.configuration.schema import PrivacyConfig
from raysim.errors import ConfigError
from raysim.layers.dp_mean import PrivateMean
from raysim.layers.feature import Feature, RunSettings, algorithms_with, section_of
from raysim.privacy.sampling import poisson_sample
from raysim.rounds.round_loop import RoundCallback, RoundLoop, RoundOutcome

if TYPE_CHECKING:
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.privacy.settings import DpSettings
    from raysim.rounds.round_loop import Sampler
    from raysim.training.context import RunContext


SECTION = "privacy"


def section(config: RunSettings) -> PrivacyConfig | None:
    """The config's ``privacy:`` section (None: no DP)."""
    return section_of(config, SECTION, PrivacyConfig)


def check(config: RunSettings) -> None:
    """``privacy:`` needs an algorithm with weight uploads DP can protect, or one that
    privatizes its own releases in local mode (one paragraph naming why otherwise)."""
    from raysim.algorithms import ALGORITHMS

    privacy = section(config)
    if privacy is None:
        return
    name = getattr(config.algorithm, "name", "")
    algorithm_class = ALGORITHMS[name]
    releases = algorithm_class.supports.private_releases
    if releases is not None:
        if privacy.mode != "local":
            reason = algorithm_class.supports.central_privacy_refusal or (
                f"{releases}, so there is no sum for the server to noise")
            raise ConfigError(
                f"Invalid config field `privacy.mode` = 'central': with algorithm "
                f"`{name}`, {reason}. Set privacy.mode: local (every released "
                "model clipped and noised by its client; epsilon composes one Gaussian "
                "mechanism per release).")
        if privacy.adaptive_clip is not None:
            raise ConfigError(
                f"Invalid config field `privacy.adaptive_clip`: algorithm "
                f"`{name}` releases its clients' models in local mode, and "
                "adaptive clipping needs central noise on a count. Remove "
                "privacy.adaptive_clip.")
        if getattr(config.algorithm, "dp", None) is not None:
            raise ConfigError(
                f"Invalid combination: `algorithm.dp` and `privacy` both ask "
                f"`{name}` to clip and noise its released models. Keep "
                "`privacy` (the same mechanism, with an accountant) and remove algorithm.dp.")
        return
    kinds = algorithm_class.mean_uploads
    if len(kinds) > 1:
        counted = algorithm_class.dp_releases_per_round(config.algorithm)
        if counted < len(kinds):
            raise ConfigError(
                f"Invalid combination: algorithm `{name}` uploads {len(kinds)} means "
                f"({', '.join(kinds)}), each clipped and noised as a release of its own, but "
                f"counts {counted} DP release(s) per round, so the accountant would "
                f"understate epsilon. Declare dp_releases_per_round >= {len(kinds)} in the "
                "algorithm, or remove `privacy`.")
        if privacy.adaptive_clip is not None:
            raise ConfigError(
                f"Invalid config field `privacy.adaptive_clip`: algorithm `{name}` uploads "
                f"{len(kinds)} means, and adaptive clipping follows one update norm. Remove "
                "privacy.adaptive_clip, or give each upload a fixed clip (privacy.clip).")
    if not kinds:
        raise ConfigError(
            f"Invalid config section `privacy`: algorithm `{name}` cannot give "
            f"a client-level DP guarantee here: {algorithm_class.supports.privacy_refusal}. A privacy "
            f"setting would suggest a guarantee that is not there. Remove `privacy`, or use an "
            f"algorithm whose uploads are weight updates: {algorithms_with('mean_uploads')} "
            f"(or {algorithms_with('private_releases')} in local mode).")


@dataclass(frozen=True)
class PoissonSampler:
    """Every client independently with probability ``rate`` (a round may have none: the
    algorithm still aggregates it)."""

    seed: int
    num_clients: int
    rate: float
    skip_empty_rounds = False

    def clients(self, round_: int) -> np.ndarray:
        return poisson_sample(self.seed, round_, self.num_clients, self.rate)


class PrivacyAccounting(RoundCallback):
    """The privacy budget in every ``rounds`` row: ``epsilon`` at the run's delta after the
    round (dp-accounting, :mod:`raysim.privacy.accountant`), the noise multiplier and the
    clip; the last row of a run capped by ``privacy.target_epsilon`` says why it stopped."""

    def __init__(self, settings: DpSettings, rounds: int):
        self.settings = settings
        self.rounds = rounds
        """The configured rounds (the loop may run fewer: ``settings.rounds_allowed``)."""

    def columns(self, loop: RoundLoop, outcome: RoundOutcome) -> dict[str, Any]:
        done = outcome.round + 1
        releases = loop.algorithm.dp_releases(done)  # FedDC: only hand-over rounds release
        row: dict[str, Any] = {"epsilon": self.settings.epsilon_after(releases),
                               "dp_delta": self.settings.delta,
                               "dp_noise_multiplier": self.settings.noise_multiplier,
                               "dp_clip": float(outcome.dispatch.message.get(
                                   "dp_clip", self.settings.clip)),  # the round's clip
                               "dp_accountant": self.settings.accountant,
                               "dp_mode": self.settings.mode}
        if done == self.settings.rounds_allowed < self.rounds:
            following = self.settings.epsilon_after(done + 1)
            row["stop_reason"] = (
                f"privacy budget: epsilon after round {done} would be {following:.4g} > "
                f"privacy.target_epsilon={self.settings.target_epsilon:g} (delta "
                f"{self.settings.delta:.3g}); the run stopped after {done} of {self.rounds} "
                "rounds")
        return row


class ClientDp(Feature):
    """DP's parts in a run whose context carries resolved :class:`DpSettings`."""

    def __init__(self, context: RunContext, settings: DpSettings):
        self.context = context
        self.settings = settings

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        # an algorithm with its own DP (private releases) reads context.privacy itself
        return PrivateMean(algorithm) if algorithm.mean_uploads else algorithm

    def sampler(self) -> Sampler:
        return PoissonSampler(self.context.seed, self.context.num_clients, self.settings.rate)

    def callbacks(self, rounds: int) -> list[RoundCallback]:
        return [PrivacyAccounting(self.settings, rounds)]

    def round_cap(self) -> int:
        return self.settings.rounds_allowed

    def manifest(self) -> dict[str, Any]:
        return {"privacy": self.settings.describe()}


def settings(config: RunSettings, num_clients: int, per_round: int) -> DpSettings | None:
    """The run's DP settings resolved from ``privacy:`` (calibration, the round cap), for
    ``num_clients`` clients of which ``per_round`` are expected each round; None without."""
    from raysim.algorithms import ALGORITHMS
    from raysim.privacy.settings import resolve

    privacy = section(config)
    if privacy is None:
        return None
    releases = ALGORITHMS[getattr(config.algorithm, "name", "")].dp_releases_per_round(
        config.algorithm)
    return resolve(privacy, num_clients, per_round, config.training.rounds, releases)


def feature(context: RunContext) -> ClientDp | None:
    """DP's parts of the run, or None without ``privacy:``."""
    settings = context.features.get(SECTION)
    return None if settings is None else ClientDp(context, settings)
