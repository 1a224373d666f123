"""Federated algorithms, one per file, registered by config name.

The registry (``ALGORITHMS``) and the base classes load on first access, importing every
algorithm module and torch; their config parameters live torch-free in
:mod:`raysim.algorithms.params`, so that loading a config does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysim.algorithms.base import ALGORITHMS, Algorithm, ClientResult, RunContext

MODULES = ("centralized", "fedavg", "feddc", "feddf", "feddm", "fedmd", "fedprox", "fedsm",
           "fedvck", "local_only", "mhpflid")
"""The modules that register an algorithm."""

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "RunContext"]


def __getattr__(name: str) -> Any:
    """Load the registry on first use of one of ``__all__``."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    base = importlib.import_module(f"{__name__}.base")
    for exported in __all__:
        globals()[exported] = getattr(base, exported)
    return globals()[name]
