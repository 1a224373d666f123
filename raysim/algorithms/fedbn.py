"""FedBN (Li et al., ICLR 2021): FedAvg in which every client keeps its normalisation layers.

Clients train the whole model each round and upload every entry but those of their
BatchNorm (or InstanceNorm, GroupNorm, LayerNorm) layers; the server averages what it
receives; each client starts the next round from the average with its own normalisation
layers (affine weights and running statistics). The paper's remedy for feature shift between
sites (scanners, stains, hospitals): the local statistics absorb it. A client's model is the
round's average with its own normalisation layers; there is no one global model.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.params import FedBNParams
from raysim.algorithms.partial_sharing import PartialSharing
from raysim.configuration.schema import StrictModel
from raysim.errors import field_error
from raysim.models.layer_split import norm_entries


@register_algorithm
class FedBN(PartialSharing[FedBNParams]):
    """FedAvg of everything but the normalisation layers, which stay on their clients."""

    params_class: ClassVar[type[StrictModel]] = FedBNParams

    def private_entries(self, model: nn.Module) -> frozenset[str]:
        entries = norm_entries(model)
        if not entries:
            name = type(self.context.model).model_fields["name"].default
            raise field_error(
                "model.name", name,
                "FedBN keeps each client's normalisation layers local, and this model has "
                "none with weights or statistics (MONAI's U-Nets normalise with InstanceNorm "
                "without affine weights unless `model.norm: batch`)",
                "Set `model.norm: batch` on a U-Net or UNet++, or use a model with BatchNorm "
                "(convnet, resnet18, fcn).")
        return entries
