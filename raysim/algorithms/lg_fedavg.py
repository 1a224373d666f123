"""LG-FedAvg (Liang et al. 2020, "Think locally, act globally"): every client keeps a local
representation and the server averages only the last layers (the global head).

Each round a client trains its whole model (its own representation with the round's global
layers) for the run's local work and uploads the global layers; the server averages them.
``global_layers`` says how many of the model's last layers with parameters are global (the
layer split of :mod:`raysim.models.layer_split`: a U-Net's 1x1 head, a classifier's last
linear layers). A client's model is its own representation with the round's global layers.
"""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.params import LGFedAvgParams
from raysim.algorithms.partial_sharing import PartialSharing
from raysim.configuration.schema import StrictModel
from raysim.models.layer_split import head_entries


@register_algorithm
class LGFedAvg(PartialSharing[LGFedAvgParams]):
    """FedAvg of the last ``global_layers`` layers; the layers before them stay local."""

    params_class: ClassVar[type[StrictModel]] = LGFedAvgParams

    def private_entries(self, model: nn.Module) -> frozenset[str]:
        head = head_entries(model, self.params.global_layers)
        return frozenset(model.state_dict()) - head
