"""Plain-torch models, constructed by name from a registry.

The registry (``MODELS``, ``build_model``, ``register_model``) loads on first access, importing
every model module and torch; the models' config parameters live torch-free in
:mod:`raysim.models.params`, so that loading a config does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from raysim.lazy import lazy_exports

if TYPE_CHECKING:
    from raysim.models.registry import MODELS, build_model, register_model, segmentation_models

MODULES = ("cnn", "convnet", "convnet3d", "mlp", "resnet", "resnet3d", "segmentation", "sequence", "zoo")
"""The modules (and the zoo package) that register a model."""

__all__ = ["MODELS", "build_model", "register_model", "segmentation_models"]


__getattr__ = lazy_exports(__name__, MODULES, "registry", __all__)
