"""FedProx (Li et al. 2020): FedAvg with a proximal term mu/2 ||w - w_global||^2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from pydantic import Field
from torch import nn

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.engine.weights import Weights
from raysim.schema import StrictModel


class FedProxParams(StrictModel):
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal term weight")
    weighted: bool = True


def proximal_term(model: nn.Module, anchor: Weights, mu: float) -> Callable[[], torch.Tensor]:
    """``() -> mu/2 * sum ||p - anchor_p||^2`` over the model's trainable parameters."""
    device = next(model.parameters()).device
    pairs = [(param, torch.as_tensor(anchor[name], device=device))
             for name, param in model.named_parameters() if param.requires_grad]

    def term() -> torch.Tensor:
        return 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in pairs)

    return term


@register_algorithm
class FedProx(FedAvg):
    """FedAvg whose clients minimise the local loss plus the proximal term."""

    params_class = FedProxParams

    def regularizer(self, model: nn.Module, global_weights: Weights
                    ) -> Callable[[], torch.Tensor] | None:
        if self.params.mu == 0:
            return None
        return proximal_term(model, global_weights, self.params.mu)
