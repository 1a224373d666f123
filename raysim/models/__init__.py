"""Plain-torch models, constructed by name from a registry."""

from __future__ import annotations

from raysim.models import cnn, convnet, mlp, resnet, zoo  # noqa: F401  (registration)
from raysim.models.registry import MODELS, build_model, register_model

__all__ = ["MODELS", "build_model", "register_model"]
