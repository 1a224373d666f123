"""Model registry: config name -> (hyperparameter class, constructor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from torch import Tensor, nn

from raysim.data.dataset import DataInfo
from raysim.errors import ConfigError
from raysim.schema import StrictModel


@dataclass(frozen=True)
class ModelEntry:
    params: type[StrictModel]
    build: Callable[[StrictModel, DataInfo], nn.Module]


MODELS: dict[str, ModelEntry] = {}


def register_model(params: type[StrictModel]) -> Callable:
    """Register ``build(params, info) -> nn.Module`` under the params' ``name`` literal."""

    def decorator(build: Callable[[StrictModel, DataInfo], nn.Module]) -> Callable:
        name = params.model_fields["name"].default
        MODELS[name] = ModelEntry(params, build)
        return build

    return decorator


Layer = Callable[[Tensor], Tensor]


def embedding_parts(model: nn.Module) -> tuple[Layer, Layer]:
    """``model.embed`` (inputs -> features) and ``model.classifier`` (features -> logits) of a
    model that has both (ConvNet, ResNet18), as the condensation methods use them."""
    return cast(Layer, model.embed), cast(Layer, model.classifier)


def require_images(model_name: str, info: DataInfo) -> None:
    """Raise a config error when an image model is asked for on tabular data."""
    if info.kind != "image":
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: dataset {info.name!r} is "
            "tabular. Use model.name=mlp for tabular data."
        )


def build_model(params: StrictModel, info: DataInfo) -> nn.Module:
    """Construct the model a config section describes for a dataset."""
    name = params.name  # type: ignore[attr-defined]
    if name not in MODELS:  # a model module not imported yet: load the whole registry
        import raysim.models

        raysim.models.MODELS  # noqa: B018  (the access registers every model)
    return MODELS[name].build(params, info)
