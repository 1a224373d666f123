"""The shared shape of data-centric methods (FedDM, FedVCK): clients condense their data into
small synthetic image sets against the frozen global model and upload them; the server trains
the global model on the synthetic sets it keeps.

Client: synthetic images per class (warm-started across rounds, resident on the worker as the
client's state), condensed by :func:`raysim.condensation.matching.condense` with the subclass's
matching loss; uploaded as uint8 (one byte per pixel) with their labels. Server: a buffer of
the synthetic sets of the last ``kept_rounds()`` rounds; every round continues training the
global model on their union (SGD, ``server_*`` settings), plus the subclass's extra loss.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch

from raysim.algorithms.base import Algorithm, ClientResult, RunContext
from raysim.algorithms.params import CondensationParams
from raysim.algorithms.supports import Supports
from raysim.condensation.matching import MatchingSettings, RealData, condense
from raysim.condensation.synthetic import (
    ServerTraining,
    noise_images,
    to_uint8,
    train_on_synthetic,
)
from raysim.models import build_model
from raysim.models.registry import require_embedding
from raysim.seeding import numpy_rng, torch_generator
from raysim.training.membership import nearest_synthetic_scores
from raysim.training.memory_format import place
from raysim.vectors.weights import Weights, get_weights, set_weights

if TYPE_CHECKING:
    from raysim.training.runtime import ClientRuntime

CondensedParamsT = TypeVar("CondensedParamsT", bound=CondensationParams)


class CondensedKnowledgeAlgorithm(Algorithm[CondensedParamsT, dict[str, Any]]):
    """Base class: subclasses define the synthetic set sizes, the matching loss and extras."""

    supports: ClassVar[Supports] = Supports(
        asynchronous_refusal=("its server trains on the synthetic sets of one synchronous round, each "
            "condensed against the same broadcast model"),
        multi_label_refusal=("it condenses each class of a client's data into its own synthetic images "
            "(per-class distribution matching), and a multi-label image belongs to several classes at once"),
        volume_refusal=("its condensation augments synthetic images with 2D differentiable siamese "
            "augmentation (crop, flip, rotate, scale) that is not defined for volumes"),
        needs_images=("it condenses each client's data into synthetic images matched in a ConvNet's "
            "embedding space"))

    def __init__(self, params: CondensedParamsT, context: RunContext):
        super().__init__(params, context)
        require_embedding(context.model, context.info, "condensation matches embeddings",
                          "convnet (with norm: batch for FedVCK's latent constraint) or resnet18")

    # ----- hooks -----
    def synthetic_sizes(self, counts: np.ndarray) -> dict[int, int]:
        """class -> synthetic images for a client with these class counts."""
        raise NotImplementedError

    def matching_loss(self, runtime: ClientRuntime, model: torch.nn.Module, client: int,
                      round_: int, message: dict[str, Any]) -> Any:
        """The :data:`~raysim.condensation.matching.MatchLoss` of one client's condensation."""
        raise NotImplementedError

    def sampling(self, runtime: ClientRuntime, model: torch.nn.Module, message: dict[str, Any],
                 client: int, real: RealData) -> tuple[RealData, dict[str, Any]]:
        """Sampling probabilities and extra uploads (default: uniform, nothing)."""
        return real, {}

    def kept_rounds(self) -> int:
        """How many rounds of synthetic sets the server trains on."""
        return 1

    def sends_previous_model(self) -> bool:
        """Whether clients need the previous round's global model too (default: no)."""
        return False

    def server_extra(self, state: dict[str, Any], uploads: list[dict[str, Any]],
                     round_: int) -> tuple[Any, torch.nn.Module | None]:
        """(extra loss, the module holding its trainable parameters) for the server's training
        this round (default: none)."""
        return None, None

    def matching_settings(self) -> MatchingSettings:
        p = self.params
        return MatchingSettings(p.iterations, p.image_lr, p.momentum, p.real_per_class,
                                augmentation=tuple(p.augmentation.operations),
                                augmentation_mode=p.augmentation.mode)

    def server_settings(self) -> ServerTraining:
        p = self.params
        augmentation = tuple(p.augmentation.operations) if p.augmentation.server else ()
        return ServerTraining(p.server_epochs, p.server_lr, p.server_momentum,
                              p.server_weight_decay, p.server_batch_size,
                              lr_decay=p.server_lr_decay, augmentation=augmentation)

    # ----- server -----
    def init_server_state(self, initial_weights: Weights) -> dict[str, Any]:
        return {"model": initial_weights, "previous": None, "buffer": []}

    def broadcast(self, state: dict[str, Any], round_: int) -> dict[str, Any]:
        message = {"model": state["model"]}
        if state["previous"] is not None and self.sends_previous_model():
            message["previous"] = state["previous"]
        return message

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> list[dict[str, Any]]:
        return [{"client": client, **result.upload} for client, result in results]

    def aggregate(self, state: dict[str, Any], partials: Sequence[list[dict[str, Any]]],
                  round_: int) -> dict[str, Any]:
        uploads = [u for partial in partials for u in partial if len(u["synthetic"])]
        buffer = [*state["buffer"], *[(round_, u["synthetic"], u["labels"]) for u in uploads]]
        buffer = [entry for entry in buffer if entry[0] > round_ - self.kept_rounds()]
        state = {**state, "buffer": buffer}
        if not buffer:
            return state
        model = place(build_model(self.context.model, self.context.info), torch.device("cpu"),
                      self.context.memory_format)
        set_weights(model, state["model"])
        extra_loss, extra_module = self.server_extra(state, uploads, round_)
        train_on_synthetic(model, np.concatenate([b[1] for b in buffer]),
                           np.concatenate([b[2] for b in buffer]), self.context.info,
                           self.server_settings(),
                           torch_generator(self.context.seed, "server-train", round_),
                           extra_loss, extra_module)
        return {**state, "previous": state["model"], "model": get_weights(model)}

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        """The nearest-synthetic-image attack on the uploaded synthetic set."""
        if "synthetic" not in upload:
            return None
        return nearest_synthetic_scores(runtime, upload["synthetic"], upload["labels"], x, y)

    def global_weights(self, state: dict[str, Any]) -> Weights:
        return state["model"]

    # ----- client -----
    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        return [self._condense_client(runtime, c, round_, message, s)
                for c, s in zip(clients, states, strict=True)]

    def _condense_client(self, runtime: ClientRuntime, client: int, round_: int,
                         message: dict[str, Any], state: Any) -> ClientResult:
        started = time.perf_counter()
        info, seed = runtime.info, self.context.seed
        indices = runtime.client_indices[client]
        labels = runtime.train_y[indices]
        counts = np.bincount(labels, minlength=info.num_classes)
        sizes = self.synthetic_sizes(counts)
        model = runtime.model
        set_weights(model, message["model"])
        model.requires_grad_(False)
        real = RealData(runtime.train_x, {c: indices[labels == c] for c in sizes})
        real, extra_uploads = self.sampling(runtime, model, message, client, real)
        if state is None:
            state = noise_images(sizes, info.input_shape,
                                 torch_generator(seed, "synthetic-init", client=client))
        synthetic = {c: torch.tensor(state[c], device=runtime.device, requires_grad=True)
                     for c in sorted(sizes)}
        loss = float("nan")
        if synthetic:
            settings = self.matching_settings()
            loss = condense(synthetic, real, info, settings,
                            self.matching_loss(runtime, model, client, round_, message),
                            numpy_rng(seed, "condense-batches", round_, client),
                            numpy_rng(seed, "augment", round_, client).integers(
                                0, 2**62, size=settings.iterations))
        model.requires_grad_(True)
        images = (torch.cat([synthetic[c] for c in sorted(synthetic)]) if synthetic
                  else torch.zeros((0, *info.input_shape)))
        upload = {"synthetic": to_uint8(images, info),
                  "labels": np.repeat(sorted(synthetic), [sizes[c] for c in sorted(synthetic)])
                  .astype(np.uint8), **extra_uploads}
        new_state = {c: t.detach().cpu().numpy() for c, t in synthetic.items()}
        return ClientResult(upload, new_state, {
            "matching_loss": loss, "synthetic_images": float(len(images)),
            "condense_seconds": time.perf_counter() - started}, len(indices))
