"""DS-pFL: distillation-based semi-supervised FL (DS-FL, Itahara et al., IEEE TMC 2023) with
every client keeping its own model, as MH-pFLID's comparison runs it. Clients upload their soft
labels (softmax outputs) on the public set (:mod:`raysim.algorithms.public_exchange`); the
server averages them and sharpens the average by *entropy reduction aggregation* (ERA):
softmax(mean soft labels / T) with T = ``era_temperature`` (the paper's 0.1), so that the
labels of samples the clients disagree on, under non-IID data, do not stay ambiguous. Every
client then distils towards the global soft labels with the soft cross-entropy
-sum_k y_k log softmax(z)_k before it revisits its private data. Every round uses the whole
public set (carved once from the clients' data), where DS-FL draws a fresh subset of its open
set each round (docs/methods.md's deviation table).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.params import DSpFLParams
from raysim.algorithms.public_exchange import MeanConsensus


def entropy_reduction(soft_labels: np.ndarray, temperature: float | None) -> np.ndarray:
    """ERA: softmax(soft_labels / temperature) per sample (None: the labels as they are, the
    paper's simple averaging)."""
    if temperature is None:
        return soft_labels
    from scipy.special import softmax  # (scipy loads where a server aggregates, not at import)

    return softmax(soft_labels / temperature, axis=1)


@register_algorithm
class DSpFL(MeanConsensus[DSpFLParams]):
    """Soft labels on the public set, averaged and sharpened by ERA, distilled by every
    client into its own model."""

    params_class = DSpFLParams

    def consensus(self, mean: np.ndarray) -> np.ndarray:
        sharpened = entropy_reduction(np.asarray(mean, dtype=np.float64),
                                      self.params.era_temperature)
        return sharpened.astype(np.float32)

    # ----- client -----
    def public_outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits, dim=1)

    def digest_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()
