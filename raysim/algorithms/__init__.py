"""Federated algorithms, one per file, registered by config name."""

from __future__ import annotations

from raysim.algorithms import centralized, fedavg, feddc, fedprox, fedsm, local_only  # noqa: F401
from raysim.algorithms.base import ALGORITHMS, Algorithm, ClientResult, RunContext

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "RunContext"]
