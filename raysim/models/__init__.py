"""Plain-torch models, constructed by name from a registry.

The registry (``MODELS``, ``build_model``, ``register_model``) loads on first access, importing
every model module and torch; the models' config parameters live torch-free in
:mod:`raysim.models.params`, so that loading a config does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raysim.models.registry import MODELS, build_model, register_model

MODULES = ("cnn", "convnet", "mlp", "resnet", "zoo")
"""The modules (and the zoo package) that register a model."""

__all__ = ["MODELS", "build_model", "register_model"]


def __getattr__(name: str) -> Any:
    """Load the registry on first use of one of ``__all__``."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    for module in MODULES:
        importlib.import_module(f"{__name__}.{module}")
    registry = importlib.import_module(f"{__name__}.registry")
    for exported in __all__:
        globals()[exported] = getattr(registry, exported)
    return globals()[name]
