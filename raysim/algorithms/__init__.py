"""Federated algorithms, one per file, registered by config name.

The registry (``ALGORITHMS``) and the base classes load on first access, importing every
algorithm module and torch; their config parameters live torch-free in
:mod:`raysim.algorithms.params`, so that loading a config does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysim.lazy import lazy_exports

if TYPE_CHECKING:
    from raysim.algorithms.base import ALGORITHMS, Algorithm, ClientResult, RunContext

MODULES = ("apfl", "centralized", "desa", "dfrd", "ditto", "dspfl", "fedavg", "fedbn", "feddc",
           "feddf", "feddm", "fedgan", "fedgen", "fedmd", "fedmix", "fedprox", "fedrep", "fedsm",
           "fedvck", "ktpfl", "lcfed", "lg_fedavg", "local_only", "mhpflid", "moon", "scaffold")
"""The modules that register an algorithm."""

__all__ = ["ALGORITHMS", "Algorithm", "ClientResult", "RunContext"]


__getattr__ = lazy_exports(__name__, MODULES, "base", __all__)
