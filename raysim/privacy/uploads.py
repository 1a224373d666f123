"""DP on a worker: the sampled clients' weight uploads clipped (and, in local mode, noised)
before they are reduced, with each update's norm before clipping in the ``clients`` table
(``dp_<upload>_update_norm``, e.g. ``dp_model_update_norm``) and whether it was within the
clip (``dp_<upload>_within_clip``, 0 or 1: adaptive clipping's bit)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from raysim.privacy.mechanism import privatize
from raysim.privacy.settings import DpSettings
from raysim.vectors.weights import FlatWeights, Weights, on_device


def privatize_uploads(results: Sequence[tuple[int, Any]], uploads: Sequence[str],
                      reference: Callable[[str, int], Weights], message: dict[str, Any],
                      settings: DpSettings, seed: int, round_: int, device: torch.device
                      ) -> None:
    """Replace every (client, ClientResult)'s uploads named in ``uploads`` by the clipped
    (local mode: and noised) update over ``reference(kind, client)`` (the model the client
    started from, e.g. the broadcast entry of the same name), in place; a reference shared by
    several clients goes to the device once."""
    clip = float(message["dp_clip"]) if "dp_clip" in message else settings.clip  # adaptive
    on_device_once: dict[int, FlatWeights] = {}
    for kind in uploads:
        for client, result in results:
            if kind not in result.upload:
                continue
            start = reference(kind, client)
            if id(start) not in on_device_once:
                on_device_once[id(start)] = on_device(start, device)
            result.upload[kind], metrics = privatize_upload(
                result.upload[kind], on_device_once[id(start)], kind, clip, settings, seed,
                round_, client, device)
            result.metrics.update(metrics)


def privatize_upload(upload: Weights, reference: Weights, kind: str, clip: float,
                     settings: DpSettings, seed: int, round_: int, client: int,
                     device: torch.device) -> tuple[FlatWeights, dict[str, float]]:
    """One client's ``kind`` upload clipped at ``clip`` over ``reference`` (in local mode also
    noised from its own stream), and its ``clients`` columns: the update's norm before
    clipping and whether it was within the clip."""
    local_std = settings.noise_std if settings.mode == "local" else 0.0
    private, norm = privatize(upload, reference, clip, local_std, seed, round_, client, device,
                              kind)
    return private, {f"dp_{kind}_update_norm": norm,
                     f"dp_{kind}_within_clip": float(norm <= clip)}
