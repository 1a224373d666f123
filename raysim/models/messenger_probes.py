"""Probes of how much messenger information MH-pFLID's transmitter lets through.

Three measurements of a transmitter (queries from the local model, keys and values from the
messenger):

- *channel permutation*: the relative change of the output when the messenger map's channels are
  permuted. An exchange that ignores which messenger channel carries which value (channel tokens:
  attention is invariant to permuting its keys) scores ~0.
- *messenger directions*: with the local map fixed, the singular values of the outputs for many
  different messenger inputs (centred). The number of directions above 1 % of the largest counts
  how many independent things the messenger can tell the client; a degenerate design (a 1x1
  messenger map under channel tokens) gives 1-2.
- *local directions*: the same with the messenger map fixed and the local input varied. With a
  single messenger token (a 1x1 map under spatial tokens) the softmax over one key is 1 and the
  output ignores the local features: 0 directions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raysim.models.messenger import InformationExchange


@dataclass(frozen=True)
class TokenProbe:
    """What the probes measured on one transmitter."""

    permutation_change: float
    """||T(l, perm(m)) - T(l, m)|| / ||T(l, m) - mean||, averaged over the messenger inputs."""
    messenger_singular_values: tuple[float, ...]
    """Singular values of the centred outputs over the messenger inputs (local map fixed)."""
    local_singular_values: tuple[float, ...]
    """Singular values of the centred outputs over the local inputs (messenger map fixed)."""
    scale: float
    """Mean norm of the outputs: singular values below 1e-5 x this are rounding noise."""

    def messenger_directions(self, threshold: float = 0.01) -> int:
        """Directions in which the messenger moves the output (singular values above
        ``threshold`` x the largest)."""
        return _directions(self.messenger_singular_values, threshold, self.scale)

    def local_directions(self, threshold: float = 0.01) -> int:
        """Directions in which the local features move the output."""
        return _directions(self.local_singular_values, threshold, self.scale)


def _directions(values: tuple[float, ...], threshold: float, scale: float) -> int:
    top = values[0] if values else 0.0
    if top <= 1e-5 * scale:  # the output does not move at all
        return 0
    return sum(1 for s in values if s > threshold * top)


@torch.no_grad()
def probe_transmitter(transmitter: InformationExchange, local_maps: Tensor,
                      messenger_maps: Tensor, seed: int = 0) -> TokenProbe:
    """Probe ``transmitter`` with N local maps (N, C_loc, H, W) and N messenger maps
    (N, D_mes, h, w) of N different inputs."""
    transmitter.eval()
    local = local_maps[:1].expand(len(messenger_maps), *local_maps.shape[1:])
    out = transmitter(local, messenger_maps)
    generator = torch.Generator().manual_seed(seed)
    permutation = torch.randperm(messenger_maps.shape[1], generator=generator)
    permuted = transmitter(local, messenger_maps[:, permutation.to(messenger_maps.device)])
    spread = (out - out.mean(dim=0, keepdim=True)).norm(dim=1).mean().clamp_min(1e-12)
    change = (permuted - out).norm(dim=1).mean() / spread
    fixed_messenger = messenger_maps[:1].expand(len(local_maps), *messenger_maps.shape[1:])
    over_local = transmitter(local_maps, fixed_messenger)
    return TokenProbe(float(change), _singular_values(out), _singular_values(over_local),
                      float(out.norm(dim=1).mean()))


def _singular_values(outputs: Tensor) -> tuple[float, ...]:
    centred = (outputs - outputs.mean(dim=0, keepdim=True)).double()
    return tuple(float(s) for s in torch.linalg.svdvals(centred))
