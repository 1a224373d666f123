"""The Gaussian mechanism on a client's weight update: the update (the trained model minus
the broadcast) clipped to L2 norm <= clip, and Gaussian noise of std ``noise_multiplier`` x
clip, drawn from a named stream so that any worker draws the same values."""

from __future__ import annotations

import torch

from raysim.seeding import torch_generator
from raysim.vectors.weights import FlatWeights, Weights, on_device


def gaussian_noise(size: int, std: float, seed: int, purpose: str, round_: int,
                   client: int = -1) -> torch.Tensor:
    """``size`` float64 N(0, std^2) values from the stream (seed, purpose, round, client),
    drawn on the CPU (the same values on every device)."""
    generator = torch_generator(seed, purpose, round_, client)
    return torch.randn(size, generator=generator, dtype=torch.float64) * std


def clip_update(model: Weights, reference: Weights, clip: float, device: torch.device
                ) -> tuple[FlatWeights, float]:
    """``model`` with its update over ``reference`` scaled to L2 norm <= ``clip``, and the
    update's norm before clipping. An update within the bound is returned unchanged (the same
    values, not reference + update recomputed)."""
    trained, start = on_device(model, device), on_device(reference, device)
    vector = torch.as_tensor(trained.vector)
    update = vector.double() - torch.as_tensor(start.vector).double()
    norm = float(torch.linalg.vector_norm(update))
    if norm <= clip:
        return trained, norm
    clipped = torch.as_tensor(start.vector).double() + update * (clip / norm)
    return FlatWeights(clipped.to(vector.dtype), trained.layout, trained.extras), norm


def noise_purpose(kind: str) -> str:
    """The stream of a client's local noise on its ``kind`` upload: ``dp-noise`` for the model,
    ``dp-noise-<kind>`` for the others (two uploads never draw the same values)."""
    return "dp-noise" if kind == "model" else f"dp-noise-{kind}"


def add_noise(model: FlatWeights, std: float, seed: int, round_: int, client: int,
              kind: str = "model") -> FlatWeights:
    """``model`` plus N(0, std^2) on every float entry, from the client's stream (seed,
    :func:`noise_purpose` of ``kind``, round, client); unchanged when ``std`` is 0."""
    if std == 0:
        return model
    vector = torch.as_tensor(model.vector)
    noise = gaussian_noise(vector.numel(), std, seed, noise_purpose(kind), round_, client)
    noisy = (vector.double() + noise.to(vector.device)).to(vector.dtype)
    return FlatWeights(noisy, model.layout, model.extras)


def privatize(model: Weights, reference: Weights, clip: float, noise_std: float, seed: int,
              round_: int, client: int, device: torch.device, kind: str = "model"
              ) -> tuple[FlatWeights, float]:
    """A client's ``kind`` upload under DP: clipped update, plus its own noise when
    ``noise_std`` > 0 (local mode); returns it and the update's norm before clipping."""
    clipped, norm = clip_update(model, reference, clip, device)
    return add_noise(clipped, noise_std, seed, round_, client, kind), norm
