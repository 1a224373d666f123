"""An example plug-in: a method, a model and a dataset of a researcher's own, outside raysim.

    raysim run experiments/plugins/fedtrim.yaml          # the config names `plugins: [fedtrim]`
    raysim run CONFIG --plugin fedtrim --set algorithm.name=fedtrim   # any config

- ``fedtrim``: FedAvg whose server takes the coordinate-wise beta-trimmed mean of the clients'
  models instead of their weighted mean (Yin et al., "Byzantine-Robust Distributed Learning:
  Towards Optimal Statistical Rates", ICML 2018): per coordinate, the beta share of largest
  and of smallest values is dropped and the rest averaged (``scipy.stats.trim_mean``).
- ``bilinear``: a model whose logits are a low-rank bilinear form of the flattened input.
- ``moons``: scikit-learn's two interleaving half circles with label noise (tabular, 2
  classes), split 80/20.

Everything here uses raysim's public registration API only; docs/plugins.md walks through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from pydantic import Field
from torch import nn

from raysim.algorithms.base import ClientResult, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.supports import Supports
from raysim.configuration.schema import DatasetConfig, StrictModel
from raysim.data.dataset import ArrayDataset, DataInfo
from raysim.data.registry import arrays_dataset, register_dataset
from raysim.models.registry import register_model
from raysim.vectors.weights import Weights


class FedTrimParams(StrictModel):
    """The trimmed-mean server's parameters."""

    name: Literal["fedtrim"] = "fedtrim"
    beta: float = Field(0.1, ge=0, lt=0.5, description="share trimmed from each end, per "
                        "coordinate (0: the plain unweighted mean)")


@register_algorithm
class FedTrim(FedAvg[FedTrimParams]):
    """FedAvg with the coordinate-wise beta-trimmed mean of the clients' models."""

    params_class: ClassVar[type[StrictModel]] = FedTrimParams
    mean_uploads: ClassVar[tuple[str, ...]] = ()  # not a mean: DP and FedBuff refuse it
    supports: ClassVar[Supports] = replace(
        FedAvg.supports,
        server_optimizers=False,
        privacy_refusal=("its server takes a trimmed mean of the clients' models, not a sum whose "
            "sensitivity to one client clipping bounds"),
        asynchronous_refusal="its trimmed mean ranks every coordinate across the models of one round")

    def client_weight(self, num_samples: int) -> float:
        return 1.0

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return [r.upload["model"] for _, r in results]  # every model: the server trims

    def aggregate(self, state: Weights, partials: Sequence[Any], round_: int) -> Weights:
        from scipy.stats import trim_mean

        models = [model for partial in partials for model in partial]
        if not models:
            return state
        return {key: trim_mean(np.stack([np.asarray(model[key]) for model in models]),
                               self.params.beta, axis=0).astype(np.asarray(models[0][key]).dtype)
                for key in models[0]}


class BilinearParams(StrictModel):
    """A low-rank bilinear classifier."""

    name: Literal["bilinear"] = "bilinear"
    rank: int = Field(4, ge=1, description="rank of the bilinear form")


class Bilinear(nn.Module):
    """logits = classifier((U x) * (V x)): a rank-``rank`` quadratic form per class."""

    def __init__(self, features: int, classes: int, rank: int):
        super().__init__()
        self.left, self.right = nn.Linear(features, rank), nn.Linear(features, rank)
        self.classifier = nn.Linear(rank, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        return self.classifier(self.left(x) * self.right(x))


@register_model(BilinearParams)
def build_bilinear(params: BilinearParams, info: DataInfo) -> nn.Module:
    """A bilinear classifier of the dataset's flattened inputs."""
    return Bilinear(int(np.prod(info.input_shape)), info.num_classes, params.rank)


@register_dataset("moons")
def load_moons(config: DatasetConfig, data_root: str | None) -> ArrayDataset:
    """2,000 points of two interleaving half circles (noise 0.25), standardised, 80/20."""
    from sklearn.datasets import make_moons
    from sklearn.model_selection import train_test_split

    points, labels = make_moons(2000, noise=0.25, random_state=0)
    points = (points - points.mean(axis=0)) / points.std(axis=0)
    x_train, x_test, y_train, y_test = train_test_split(
        points.astype(np.float32), labels, test_size=0.2, random_state=0, stratify=labels)
    return arrays_dataset("moons", {"train_images": x_train, "train_labels": y_train,
                                    "test_images": x_test, "test_labels": y_test})
