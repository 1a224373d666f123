"""FedDM (Xiong et al., CVPR 2023), FedVCK's "without all" baseline: every client condenses
``images_per_class`` synthetic images per class it holds by matching, against a freshly
perturbed copy of the global model at every iteration (a Gaussian direction scaled to a norm
drawn uniformly from [0, ``rho``]), the class means of the embeddings and of the logits of real
and synthetic batches (both in train mode); the server trains the global model on the union
of the current round's synthetic sets (cross-entropy). Shared loop:
:mod:`raysim.algorithms.condensed`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np
import torch

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.condensed import CondensedKnowledgeAlgorithm
from raysim.algorithms.params import FedDMParams
from raysim.algorithms.supports import Supports
from raysim.condensation.matching import split_by_class
from raysim.condensation.synthetic import images_per_class
from raysim.models.registry import embedding_parts
from raysim.seeding import torch_generator

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime


@register_algorithm
class FedDM(CondensedKnowledgeAlgorithm[FedDMParams]):
    """Perturbed-model mean matching; the server trains on the current round's union."""

    params_class = FedDMParams
    supports: ClassVar[Supports] = replace(
        CondensedKnowledgeAlgorithm.supports,
        privacy_refusal=("its clients upload condensed synthetic images, not weight updates, and no "
            "accountable mechanism for them is implemented"))

    def synthetic_sizes(self, counts: np.ndarray) -> dict[int, int]:
        return images_per_class(counts, None, self.params.images_per_class, 1)

    def matching_loss(self, runtime: ClientRuntime, model: torch.nn.Module, client: int,
                      round_: int, message: dict[str, Any]) -> Any:
        rho = self.params.rho
        base = {name: p.detach().clone() for name, p in model.named_parameters()}
        generator = torch_generator(self.context.seed, "feddm-perturbation", round_, client)
        embed, classifier = embedding_parts(model)

        def loss(real: torch.Tensor, syn: torch.Tensor, real_sizes: list[int],
                 syn_sizes: list[int]) -> torch.Tensor:
            with torch.no_grad():  # a new random perturbation of the global model
                directions = {n: torch.randn(p.shape, generator=generator) for n, p in base.items()}
                norm = torch.sqrt(cast(torch.Tensor,
                                       sum(d.pow(2).sum() for d in directions.values())))
                scale = rho * torch.rand(1, generator=generator) / norm.clamp(min=1e-12)
                for name, parameter in model.named_parameters():
                    parameter.copy_(base[name] + (scale * directions[name]).to(parameter.device))
            model.train()
            with torch.no_grad():
                real_embedding = embed(real)
                real_logits = classifier(real_embedding)
            syn_embedding = embed(syn)
            syn_logits = classifier(syn_embedding)
            total = torch.zeros((), device=syn.device)
            for parts in ((real_embedding, syn_embedding), (real_logits, syn_logits)):
                for r, s in zip(split_by_class(parts[0], real_sizes),
                                split_by_class(parts[1], syn_sizes), strict=True):
                    total = total + (r.mean(0) - s.mean(0)).pow(2).sum()
            return total

        return loss
