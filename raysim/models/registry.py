"""Model registry: config name -> (hyperparameter class, constructor)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from torch import Tensor, nn

from raysim.configuration.schema import StrictModel
from raysim.data.dataset import DataInfo
from raysim.errors import ConfigError, field_error
from raysim.models.params import MODEL_PARAMS, PLUGIN_MODEL_PARAMS


@dataclass(frozen=True)
class ModelEntry:
    params: type[StrictModel]
    build: Callable[[StrictModel, DataInfo], nn.Module]
    segmentation: bool = False
    """True for a segmentation network (per-pixel logits), the models a mask task takes."""


MODELS: dict[str, ModelEntry] = {}


def register_model(params: type[StrictModel], *, segmentation: bool = False) -> Callable:
    """Register ``build(params, info) -> nn.Module`` under the params' ``name`` literal;
    ``segmentation``: it is a segmentation network (logits (B, classes, H, W)), the kind of
    model a segmentation dataset takes."""

    def decorator(build: Callable[[StrictModel, DataInfo], nn.Module]) -> Callable:
        name = params.model_fields["name"].default
        taken = MODELS.get(name)
        if taken is not None and _qualified(taken.build) != _qualified(build):
            raise ValueError(
                f"the model name {name!r} of {_qualified(build)} is taken by "
                f"{_qualified(taken.build)}; give the params class another `name` literal")
        MODELS[name] = ModelEntry(params, build, segmentation)
        if params not in MODEL_PARAMS:  # a plug-in's: the config schema takes it from here
            PLUGIN_MODEL_PARAMS[:] = [p for p in PLUGIN_MODEL_PARAMS
                                      if p.model_fields["name"].default != name] + [params]
        return build

    return decorator


def _qualified(function: Callable) -> str:
    return f"{function.__module__}.{function.__qualname__}"


Layer = Callable[[Tensor], Tensor]


@runtime_checkable
class EmbeddingClassifier(Protocol):
    """A classifier that exposes its representation: ``embed`` (inputs -> features) and
    ``classifier`` (features -> logits), ``classifier(embed(x))`` being its output (ConvNet,
    ResNet18): what MOON, FedGen, DESA and the condensation methods work with."""

    classifier: nn.Module

    def embed(self, x: Tensor) -> Tensor:
        """The features before the classifier."""
        ...


def require_embedding(params: StrictModel, info: DataInfo, why: str,
                      use: str = "convnet or resnet18") -> None:
    """Refuse (one paragraph naming ``model.name``) a model without an ``embed`` method and a
    ``classifier`` layer, which a method needs for the reason ``why``; ``use``: the models to
    name instead."""
    probe = build_model(params, info)
    if not isinstance(probe, EmbeddingClassifier):
        raise field_error("model.name", type(params).model_fields["name"].default,
                          f"{why}, so the model needs an `embed` method and a `classifier` "
                          f"layer on it; use {use}")


def embedding_parts(model: nn.Module) -> tuple[Layer, Layer]:
    """``model.embed`` (inputs -> features) and ``model.classifier`` (features -> logits) of a
    model that has both (ConvNet, ResNet18), as the condensation methods use them."""
    assert isinstance(model, EmbeddingClassifier), "require_embedding refused other models"
    return model.embed, model.classifier


SIGNAL_MODELS = "tcn, signal_transformer or rnn"
"""The models for signals, as a refusal names them."""
def segmentation_models() -> list[str]:
    """The registered segmentation networks (raysim's and the plug-ins'), by config name;
    imported from :mod:`raysim.models`, which registers every model module first."""
    return [name for name, entry in MODELS.items() if entry.segmentation]


def require_segmentation(model_name: str, info: DataInfo) -> None:
    """Raise a config error unless the dataset is a 2D segmentation task."""
    if not info.segmentation or info.kind != "image" or info.volumetric:
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: it is a segmentation network "
            f"(a class per pixel), and dataset {info.name!r} is a {info.task} task of "
            f"{info.kind} data. Use it on a segmentation dataset (dataset.sites), or a "
            "classification model here (convnet, cnn, resnet18, mlp, ...).")


def require_images(model_name: str, info: DataInfo) -> None:
    """Raise a config error when an image model is asked for on tabular data or signals."""
    if info.kind == "signal":
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: it is an image model, and "
            f"dataset {info.name!r} holds signals ({info.input_shape[0]} channel(s) x "
            f"{info.input_shape[1]} samples). Use a model for signals: {SIGNAL_MODELS}.")
    if info.kind != "image":
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: dataset {info.name!r} is "
            "tabular. Use model.name=mlp for tabular data."
        )


def require_signals(model_name: str, info: DataInfo) -> None:
    """Raise a config error unless the dataset holds signals (a sequence model on images or
    tabular data)."""
    if info.kind != "signal":
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: it is a model for signals "
            f"(channels x length), and dataset {info.name!r} holds {info.kind} data. Use "
            + ("model.name=mlp." if info.kind == "tabular" else
               "an image model (convnet, cnn, resnet18, ...).")
            + " Signals come from a folder of recordings as dataset.path.")


def require_planar(model_name: str, info: DataInfo) -> None:
    """Raise a config error unless the dataset holds 2D images (a 2D model on volumes)."""
    require_images(model_name, info)
    if info.volumetric:
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: it is a 2D model, and dataset "
            f"{info.name!r} holds 3D volumes ({'x'.join(map(str, info.input_shape[1:]))}). Use "
            "a 3D model: model.name=convnet3d (small, vectorisable with norm instance or none) "
            "or resnet18_3d (MedMNIST v2's 3D baseline)."
        )


def require_volumes(model_name: str, info: DataInfo) -> None:
    """Raise a config error unless the dataset holds 3D volumes (a 3D model on 2D images)."""
    require_images(model_name, info)
    if not info.volumetric:
        raise ConfigError(
            f"Invalid config field `model.name` = {model_name!r}: it is a 3D model for "
            f"volumes, and dataset {info.name!r} holds 2D images "
            f"({'x'.join(map(str, info.input_shape[1:]))}). Use a 2D model (convnet, cnn, "
            "resnet18, ...), or a MedMNIST 3D dataset (e.g. adrenalmnist3d)."
        )


def build_model(params: StrictModel, info: DataInfo) -> nn.Module:
    """Construct the model a config section describes for a dataset (through
    ``raysim.models.build_model``, which registers every model on first use)."""
    name = params.name  # type: ignore[attr-defined]
    if name not in MODELS:
        raise KeyError(f"model {name!r} is not registered: import build_model from "
                       "raysim.models, which loads every model module first")
    return MODELS[name].build(params, info)
