"""A conditional generator of latent features and its diversity loss, as FedGen's server
learns it (Zhu, Hong and Zhou, ICML 2021; the authors' ``FLAlgorithms/trainmodel/generator.py``).

``G(eps, y)``: uniform noise eps in [0, 1)^noise_dim concatenated with the one-hot label y,
one hidden layer (Linear, BatchNorm1d, ReLU), then a Linear layer to the classifier's input
width: a feature that a model's classifier layer reads as if it came from the model's
embedding of an image of class y.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeatureGenerator(nn.Module):
    """G(eps, y) -> a latent feature of ``feature_dim`` for label y (module docstring)."""

    def __init__(self, num_classes: int, feature_dim: int, noise_dim: int = 32,
                 hidden: int = 256):
        super().__init__()
        self.num_classes, self.noise_dim = num_classes, noise_dim
        self.hidden = nn.Sequential(nn.Linear(noise_dim + num_classes, hidden),
                                    nn.BatchNorm1d(hidden), nn.ReLU())
        self.representation = nn.Linear(hidden, feature_dim)

    def noise(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``count`` noise vectors from ``generator`` (CPU), on the module's device."""
        device = self.representation.weight.device
        return torch.rand((count, self.noise_dim), generator=generator).to(device)

    def forward(self, labels: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        one_hot = F.one_hot(labels.long().reshape(-1), self.num_classes).to(noise.dtype)
        return self.representation(self.hidden(torch.cat([noise, one_hot], dim=1)))  # type: ignore[no-any-return]


def diversity_loss(noise: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """The authors' ``DiversityLoss(metric='l1')``: exp(-mean_ij(d2(eps_i, eps_j) *
    d1(G_i, G_j))) with d2 the mean squared and d1 the mean absolute difference of two rows;
    smaller when different noise gives different features."""
    features = features.flatten(1)
    feature_distance = (features[None, :, :] - features[:, None, :]).abs().mean(2)
    noise_distance = (noise[None, :, :] - noise[:, None, :]).pow(2).mean(2)
    return torch.exp(-(noise_distance * feature_distance).mean())
