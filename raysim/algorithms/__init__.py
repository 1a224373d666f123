"""Federated algorithms, one per file, registered by config name."""

from __future__ import annotations

from raysim.algorithms import (  # noqa: F401  (registration)
    centralized,
    fedavg,
    feddc,
    feddf,
    feddm,
    fedmd,
    fedprox,
    fedsm,
    fedvck,
    local_only,
    mhpflid,
)
from raysim.algorithms.base import ALGORITHMS, Algorithm, ClientResult, RunContext

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "RunContext"]
