"""FedMD (Li & Wang, 2019): model-heterogeneous FL by logit consensus on a public set
(:mod:`raysim.algorithms.public_exchange`). The clients upload their logits on the public set;
the server averages them into the next consensus, which every client digests: ``digest_loss:
l1`` regresses the logits with the mean absolute error, as the authors' code does; ``mse``
squared error; ``kl`` distils KL(softmax(consensus / T) || softmax(logits / T)) * T^2.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from raysim.algorithms.base import register_algorithm
from raysim.algorithms.params import FedMDParams
from raysim.algorithms.public_exchange import MeanConsensus


@register_algorithm
class FedMD(MeanConsensus[FedMDParams]):
    """Digest the public consensus, revisit the private data, upload public logits."""

    params_class = FedMDParams

    # ----- client -----
    def digest_loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The digest's loss of a batch of public logits against their targets."""
        t = self.params.temperature
        if self.params.digest_loss == "l1":
            return F.l1_loss(logits, target)
        if self.params.digest_loss == "mse":
            return F.mse_loss(logits, target)
        return F.kl_div(F.log_softmax(logits / t, dim=1), F.log_softmax(target / t, dim=1),
                        reduction="batchmean", log_target=True) * t * t
