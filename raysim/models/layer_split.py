"""Which of a model's state entries are its head and which its normalisation layers: the split
that the methods sharing part of a model use (FedRep shares the body and keeps the head,
LG-FedAvg the reverse, FedBN keeps the normalisation layers).

The head is the last ``layers`` linear or convolutional layers, counted inside the model's
declared output part: a :class:`~raysim.models.split.SplitModel`'s ``head`` (the zoo's
classifiers and every segmentation network: their 1x1 convolution to per-pixel logits), else
a model's ``classifier`` (the :class:`~raysim.models.registry.EmbeddingClassifier`\\ s, the CNN),
else the whole model (an MLP's last linear layers). Modules count in registration order, which
is the forward order for every raysim model."""

from __future__ import annotations

from torch import nn

from raysim.models.split import SplitModel

NORM_LAYERS: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm)
"""Normalisation layers (BatchNorm and InstanceNorm of any dimension, GroupNorm, LayerNorm)."""


def output_part(model: nn.Module) -> tuple[str, nn.Module]:
    """(prefix, module) of the part of ``model`` that holds its head."""
    if isinstance(model, SplitModel):
        return "head.", model.head
    classifier = getattr(model, "classifier", None)
    if isinstance(classifier, nn.Module):
        return "classifier.", classifier
    return "", model


def head_entries(model: nn.Module, layers: int = 1) -> frozenset[str]:
    """The state entries (parameters and buffers) of the model's last ``layers`` layers
    (linear or convolutional; the normalisation layers and activations with parameters after
    the first of them go with them) inside its output part (see the module docstring); counted
    over the whole model when the output part holds fewer."""
    prefix, part = output_part(model)
    leaves = _parametrised_leaves(part)
    if sum(_is_layer(m) for _, m in leaves) < layers:
        prefix, part = "", model
        leaves = _parametrised_leaves(model)
    counted = [i for i, (_, module) in enumerate(leaves) if _is_layer(module)]
    chosen = leaves[counted[-layers]:] if 0 < layers <= len(counted) else []
    return frozenset(prefix + ".".join(filter(None, (name, entry)))
                     for name, module in chosen for entry in module.state_dict())


def _is_layer(module: nn.Module) -> bool:
    """Whether a module counts as a layer: a weight matrix or kernel (linear, convolution,
    transposed convolution); normalisation layers and parametrised activations (PReLU) go
    with the layers they follow."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, nn.Parameter) and weight.ndim >= 2


def _parametrised_leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module without children that holds parameters, in order."""
    return [(name, module) for name, module in model.named_modules()
            if not list(module.children()) and any(True for _ in module.parameters(False))]


def norm_entries(model: nn.Module) -> frozenset[str]:
    """The state entries of every normalisation layer (weights, biases, running statistics)."""
    return frozenset(f"{name}.{entry}" for name, module in model.named_modules()
                     if isinstance(module, NORM_LAYERS) for entry in module.state_dict())


def describe_entries(entries: frozenset[str], limit: int = 4) -> str:
    """A short list of entry names for a refusal or a log line."""
    shown = sorted(entries)[:limit]
    more = len(entries) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")
