"""The privacy budget of a run from Google's dp-accounting (RDP or PLD): every round is a
Poisson-subsampled Gaussian mechanism (rate q, noise multiplier z), composed over rounds."""

from __future__ import annotations

from typing import Any

ACCOUNTANTS = {"rdp": "dp_accounting.rdp.RdpAccountant",
               "pld": "dp_accounting.pld.PLDAccountant"}
"""The accountant behind each ``privacy.accountant`` (named in the manifest)."""


def default_delta(num_clients: int) -> float:
    """delta = 1 / N^1.1 for N clients (below 1/N, as client-level DP needs)."""
    return 1.0 / num_clients**1.1


def _dp_accounting() -> Any:
    import logging

    try:
        import dp_accounting
    except ImportError as error:  # pragma: no cover - a dependency
        raise RuntimeError("privacy needs Google's dp-accounting: pip install dp-accounting"
                           ) from error
    # its RDP accountant warns through absl about every fractional order it skips (hundreds of
    # lines per call; the epsilon is still the minimum over the orders that converge)
    logging.getLogger("absl").setLevel(logging.ERROR)
    return dp_accounting


def round_event(rate: float, noise_multiplier: float, rounds: int) -> Any:
    """``rounds`` compositions of a Poisson-sampled Gaussian mechanism."""
    dp = _dp_accounting()
    single = dp.GaussianDpEvent(noise_multiplier)
    if rate < 1:
        single = dp.PoissonSampledDpEvent(rate, single)
    return dp.SelfComposedDpEvent(single, rounds)


def new_accountant(kind: str) -> Any:
    """A fresh dp-accounting accountant of ``kind`` ("rdp" or "pld")."""
    dp = _dp_accounting()
    return dp.rdp.RdpAccountant() if kind == "rdp" else dp.pld.PLDAccountant()


def epsilon(kind: str, rate: float, noise_multiplier: float, rounds: int, delta: float
            ) -> float:
    """epsilon at ``delta`` after ``rounds`` rounds (inf without noise, 0 after none)."""
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return float("inf")
    accountant = new_accountant(kind)
    accountant.compose(round_event(rate, noise_multiplier, rounds))
    return float(accountant.get_epsilon(delta))


def calibrate(kind: str, rate: float, rounds: int, target_epsilon: float, delta: float
              ) -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` rounds is at most
    ``target_epsilon`` (dp-accounting's calibrate_dp_mechanism)."""
    dp = _dp_accounting()
    return float(dp.calibrate_dp_mechanism(
        lambda: new_accountant(kind), lambda z: round_event(rate, z, rounds), target_epsilon,
        delta))
