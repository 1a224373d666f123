"""Update compression (``compression:``) as one feature: each client sends its model update
(the upload over the broadcast entry of the same name, for every upload the method declares in
``mean_uploads``) compressed, and the server decompresses it before the method's own mean.

Two compressors, each with optional error feedback (Seide et al. 2014; Karimireddy et al.
2019, EF-SGD: the part of a client's update that compression dropped is kept on the client and
added to its next update):

- ``topk``: the ``fraction`` of the update's coordinates with the largest magnitude (Aji and
  Heafield 2017; Lin et al. 2018), sent as int32 indices and float32 values;
- ``int8``: every float32 entry of the update scaled by its largest magnitude and rounded to
  8 bits, one float32 scale per entry (deterministic rounding; QSGD, Alistarh et al. 2017,
  rounds stochastically).

What leaves a client is counted at its compressed size in the ``communication`` table
(``bytes_up``); entries that are not float32 (e.g. BatchNorm's step counters) travel as they
are. The layer is the outermost one, so the method and the other features see decompressed
models. Not with ``privacy:`` (the residual carried by error feedback is released in later
rounds, which DP's per-round clipping does not bound) nor FedBuff (its buffered update rebases
uploads itself).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.configuration.schema import CompressionConfig, SystemConfig
from raysim.errors import ConfigError
from raysim.layers.feature import Feature, RunSettings, algorithms_with, section_of
from raysim.layers.wrapped import Wrapped
from raysim.state_codec import persistable
from raysim.vectors.weights import is_flat_dtype

if TYPE_CHECKING:
    from raysim.algorithms.base import ClientResult
    from raysim.algorithms.contract import RunAlgorithm
    from raysim.training.context import RunContext
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import Weights


SECTION = "compression"


def section(config: RunSettings) -> CompressionConfig | None:
    """The config's ``compression:`` section (None: uploads travel as they are)."""
    return section_of(config, SECTION, CompressionConfig)


@dataclass(frozen=True)
class CompressedUpdate:
    """One upload as it travels: the compressed update of its float32 entries over ``base``
    (the broadcast entry, which the server holds: not counted), and the other entries as they
    are. ``indices`` (topk) or ``scales`` (int8, one per float32 entry) with ``values``."""

    base: Weights
    layout: tuple[tuple[str, tuple[int, ...]], ...]
    values: np.ndarray
    indices: np.ndarray | None
    scales: np.ndarray | None
    dense: dict[str, np.ndarray]

    @property
    def wire_bytes(self) -> int:
        """Bytes on the wire: the compressed values with their indices or scales, and the
        entries sent as they are."""
        extra = sum(int(a.nbytes) for a in (self.indices, self.scales) if a is not None)
        return int(self.values.nbytes) + extra + sum(int(a.nbytes) for a in self.dense.values())


@persistable
@dataclass
class CompressedClientState:
    """A client's state under error feedback: the method's own state and, per upload, what
    compression has not sent yet (a float32 vector over the upload's float32 entries)."""

    inner: Any
    residual: dict[str, np.ndarray]


def _flat_entries(weights: Weights) -> tuple[tuple[tuple[str, tuple[int, ...]], ...],
                                             dict[str, np.ndarray]]:
    """The float32 entries' layout (in the weights' order) and the other entries."""
    layout = tuple((name, tuple(np.shape(weights[name]))) for name in weights
                   if is_flat_dtype(np.asarray(weights[name]).dtype))
    flat = {name for name, _ in layout}
    return layout, {name: np.asarray(weights[name]) for name in weights if name not in flat}


def compress(settings: CompressionConfig, upload: Weights, base: Weights,
             residual: np.ndarray | None) -> tuple[CompressedUpdate, np.ndarray]:
    """``upload``'s update over ``base`` (plus ``residual``, error feedback's carry),
    compressed; and what compression dropped (the next residual)."""
    layout, dense = _flat_entries(upload)
    update = np.concatenate([
        np.asarray(upload[name], dtype=np.float32).ravel()
        - np.asarray(base[name], dtype=np.float32).ravel() for name, _ in layout]) \
        if layout else np.zeros(0, np.float32)
    if residual is not None:
        update = update + residual
    if settings.method == "topk":
        k = max(1, math.ceil(settings.fraction * update.size)) if update.size else 0
        indices = np.sort(np.argpartition(-np.abs(update), k - 1)[:k]) if k else \
            np.zeros(0, np.int64)
        values = update[indices]
        sent = np.zeros_like(update)
        sent[indices] = values
        compressed = CompressedUpdate(base, layout, values, indices.astype(np.int32), None,
                                      dense)
    else:
        sizes = [math.prod(shape) for _, shape in layout]
        bounds = np.cumsum([0, *sizes])
        scales = np.array([np.abs(update[a:b]).max(initial=0.0) / 127.0
                           for a, b in itertools.pairwise(bounds)], np.float32)
        per_coordinate = np.repeat(scales, sizes)
        safe = np.where(per_coordinate > 0, per_coordinate, 1.0)
        values = np.clip(np.rint(update / safe), -127, 127).astype(np.int8)
        sent = values.astype(np.float32) * per_coordinate
        compressed = CompressedUpdate(base, layout, values, None, scales, dense)
    return compressed, update - sent


def decompress(update: CompressedUpdate) -> dict[str, np.ndarray]:
    """The model the server reads from an upload: its base plus the sent update (float32),
    and the entries that travelled as they are."""
    total = sum(math.prod(shape) for _, shape in update.layout)
    sent = np.zeros(total, np.float32)
    if update.indices is not None:
        sent[update.indices] = update.values
    else:
        assert update.scales is not None
        sizes = [math.prod(shape) for _, shape in update.layout]
        sent = update.values.astype(np.float32) * np.repeat(update.scales, sizes)
    model: dict[str, np.ndarray] = {}
    offset = 0
    for name, shape in update.layout:
        size = math.prod(shape)
        model[name] = (np.asarray(update.base[name], dtype=np.float32)
                       + sent[offset:offset + size].reshape(shape))
        offset += size
    return {**model, **update.dense}


class Compressed(Wrapped):
    """The wrapped algorithm with its declared uploads compressed on the clients and
    decompressed before its ``reduce`` (and its membership attack)."""

    def __init__(self, inner: RunAlgorithm, settings: CompressionConfig):
        super().__init__(inner)
        self.settings = settings

    def inner_client_state(self, state: Any) -> Any:
        return state.inner if isinstance(state, CompressedClientState) else state

    def local_updates(self, runtime: ClientRuntime, clients: Sequence[int], round_: int,
                      message: dict[str, Any], states: Sequence[Any]) -> list[ClientResult]:
        inner_states = [self.inner_client_state(state) for state in states]
        results = self.inner.local_updates(runtime, clients, round_, message, inner_states)
        for result, state, inner_state in zip(results, states, inner_states, strict=True):
            carried = state.residual if isinstance(state, CompressedClientState) else {}
            residuals: dict[str, np.ndarray] = {}
            for kind in self.inner.mean_uploads:
                feedback = carried.get(kind) if self.settings.error_feedback else None
                result.upload[kind], residuals[kind] = compress(
                    self.settings, result.upload[kind], message[kind], feedback)
            if self.settings.error_feedback:
                result.state = CompressedClientState(
                    inner_state if result.state is None else result.state, residuals)
        return results

    def _decompressed(self, result: ClientResult) -> ClientResult:
        upload = {kind: decompress(payload) if isinstance(payload, CompressedUpdate)
                  else payload for kind, payload in result.upload.items()}
        return dataclasses.replace(result, upload=upload)

    def reduce(self, results: Sequence[tuple[int, ClientResult]]) -> Any:
        return self.inner.reduce([(client, self._decompressed(result))
                                  for client, result in results])

    def membership_scores(self, runtime: ClientRuntime, client: int, upload: dict[str, Any],
                          x: np.ndarray, y: np.ndarray) -> np.ndarray | None:
        upload = {kind: decompress(payload) if isinstance(payload, CompressedUpdate)
                  else payload for kind, payload in upload.items()}
        return self.inner.membership_scores(runtime, client, upload, x, y)


class UpdateCompression(Feature):
    """Compression's part in a run: its layer, and its settings in the manifest."""

    def __init__(self, settings: CompressionConfig):
        self.settings = settings

    def wrap(self, algorithm: RunAlgorithm) -> RunAlgorithm:
        return Compressed(algorithm, self.settings)

    def manifest(self) -> dict[str, Any]:
        return {"compression": self.settings.model_dump()}


def check(config: RunSettings) -> None:
    """``compression:`` needs a method whose uploads are models the server averages, and
    neither DP nor FedBuff (one paragraph naming why otherwise)."""
    from raysim.algorithms import ALGORITHMS

    if section(config) is None:
        return
    name = getattr(config.algorithm, "name", "")
    if not ALGORITHMS[name].mean_uploads:
        raise ConfigError(
            f"Invalid config section `compression`: algorithm `{name}` does not upload "
            "models for the server to average (it declares no mean_uploads), so there is no "
            "model update to compress. Remove `compression`, or use "
            f"{algorithms_with('mean_uploads')}.")
    if config.section("privacy") is not None:
        raise ConfigError(
            "Invalid combination: `compression` and `privacy`. Error feedback releases in "
            "later rounds what compression held back, which DP's per-round clipping does not "
            "bound. Remove one of them.")
    system = section_of(config, "system", SystemConfig)
    if system is not None and system.policy == "fedbuff":
        raise ConfigError(
            "Invalid combination: `compression` and `system.policy` = 'fedbuff'. FedBuff "
            "rebases each buffered upload onto the model its client started from, and a "
            "compressed upload is an update over the round's broadcast. Use system.policy "
            "sync, deadline or overselect, or remove `compression`.")


def settings(config: RunSettings, num_clients: int, per_round: int) -> CompressionConfig | None:
    """The run's compression settings (None without ``compression:``)."""
    return section(config)


def feature(context: RunContext) -> UpdateCompression | None:
    """Compression's part of the run, or None without ``compression:``."""
    compression = context.features.get(SECTION)
    return None if compression is None else UpdateCompression(compression)
