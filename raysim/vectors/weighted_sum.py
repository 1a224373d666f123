"""Reusable aggregation operators over :data:`~raysim.vectors.weights.Weights`.

Aggregation is split into a per-group ``reduce`` (clients of one fixed group, in client order)
and ``merge`` of partials along a fixed binary tree over the groups (the workers merge the
subtrees they hold, the driver the rest: :mod:`raysim.vectors.reduction_tree`), so the result
does not depend on how many workers there are.

:class:`WeightedSum` works in torch on the device the uploads are on (a flat float64 vector;
every merge adds in place); it crosses the object store as numpy.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from raysim.vectors import blocked_sum
from raysim.vectors.weights import (
    FlatWeights,
    Layout,
    Weights,
    as_tensor,
    is_flat_dtype,
    layout_of,
    to_host,
)

Entries = tuple[tuple[str, tuple[int, ...], str], ...]
"""(name, shape, numpy dtype name) of every entry of a WeightedSum's vector, in vector order:
the float32 entries first (the order of a FlatWeights vector), then the others."""


def _entries(model: Weights) -> Entries:
    floats = [(name, shape, "float32") for name, shape in layout_of(model)]
    others = model.extras.items() if isinstance(model, FlatWeights) else [
        (n, v) for n, v in model.items() if not is_flat_dtype(v.dtype)]
    return tuple(floats + [(n, tuple(v.shape), str(np.dtype(v.dtype))) for n, v in others])


@functools.lru_cache(maxsize=64)
def _spans(entries: Entries) -> tuple[tuple[int, int], ...]:
    """[start, stop) of every entry in the vector."""
    spans, position = [], 0
    for _, shape, _ in entries:
        size = math.prod(shape)
        spans.append((position, position + size))
        position += size
    return tuple(spans)


@functools.lru_cache(maxsize=64)
def _float_count(entries: Entries) -> int:
    """Values of the float32 entries (the vector's leading block)."""
    floats = [span for span, entry in zip(_spans(entries), entries, strict=True)
              if entry[2] == "float32"]
    return floats[-1][1] if floats else 0


def _device(model: Weights) -> torch.device:
    if isinstance(model, FlatWeights) and isinstance(model.vector, torch.Tensor):
        return model.vector.device
    return torch.device("cpu")


class WeightedSum:
    """A float64 weighted sum of models and the total weight (the partial of a weighted
    mean), as one flat vector on the device of its models.

    Sums and merges are deferred (:mod:`raysim.vectors.blocked_sum`): ``of`` and ``merge``
    record what to add, and the first read of :attr:`vector` (the mean, pickling for the object
    store, :meth:`settle`) computes it block by block, with the same float operations per
    coordinate as adding whole vectors. The models must not change until then: a worker
    settles its partials before the round's states move on."""

    __slots__ = ("_pending", "_target", "_vector", "device", "entries", "length", "owned",
                 "total_weight")

    def __init__(self, vector: torch.Tensor, total_weight: float, entries: Entries,
                 owned: bool = True):
        self._vector: torch.Tensor | None = vector
        self._pending: blocked_sum.Expression | None = None
        self._target: torch.Tensor | None = None
        self.length, self.device = int(vector.numel()), vector.device
        self.total_weight = total_weight
        self.entries = entries
        self.owned = owned
        """False for a vector read from the object store (read-only): a merge into it computes
        a new vector."""

    @classmethod
    def of(cls, models: Sequence[Weights], weights: Sequence[float]) -> WeightedSum:
        """Sum ``weights[i] * models[i]`` in the given order (computed when first read)."""
        if not models:
            raise ValueError("WeightedSum.of needs at least one model")
        entries = _entries(models[0])
        float_layout = layout_of(models[0])
        spans = _spans(entries)
        pieces = [[(as_tensor(source).reshape(-1), start, stop)
                   for source, (start, stop) in _pieces(model, entries, float_layout)]
                  for model in models]
        total = cls.__new__(cls)
        total._vector, total.owned = None, True
        total._target = None
        total._pending = blocked_sum.Terms(pieces, [float(w) for w in weights])
        total.length, total.device = spans[-1][1] if spans else 0, _device(models[0])
        total.total_weight, total.entries = float(sum(weights)), entries
        return total

    @property
    def vector(self) -> torch.Tensor:
        """The float64 sum (computed on first read)."""
        if self._vector is None:
            assert self._pending is not None
            self._vector = blocked_sum.evaluate(self._pending, self.length, self.device,
                                                self._target)
            self._pending, self._target, self.owned = None, None, True
        return self._vector

    def settle(self) -> WeightedSum:
        """Compute the sum now (its models may change afterwards)."""
        _ = self.vector
        return self

    def _expression(self) -> blocked_sum.Expression:
        return self._pending if self._pending is not None else blocked_sum.Dense(self.vector)

    def merge(self, other: WeightedSum) -> WeightedSum:
        """Add ``other`` into this partial (self first) and return it. A computed sum of its
        own is added into in place (no new vector); a read-only one from the object store is
        not written to."""
        if other.entries != self.entries:
            raise ValueError("cannot merge weighted sums of different models")
        if self._vector is not None and self.owned:
            self._target = self._vector
        self._pending = blocked_sum.Merge(self._expression(), other._expression())
        self._vector = None
        self.total_weight += other.total_weight
        return self

    @property
    def float_count(self) -> int:
        """Values of the float entries (the vector's leading block; noise goes there)."""
        return _float_count(self.entries)

    def mean(self) -> dict[str, np.ndarray]:
        """The weighted mean cast back to each entry's dtype (integers rounded), as numpy."""
        host32, extras = self._mean_parts()
        result: dict[str, np.ndarray] = {}
        for (name, shape, dtype), (start, stop) in zip(self.entries, _spans(self.entries),
                                                      strict=True):
            result[name] = host32[start:stop].reshape(shape) if dtype == "float32" \
                else extras[name]
        return result

    def mean_flat(self) -> FlatWeights:
        """:meth:`mean` as a host :class:`FlatWeights` (the float32 vector as computed, with no
        per-entry arrays): what travels, is kept and is summed again in one piece."""
        host32, extras = self._mean_parts()
        layout = tuple((name, shape) for name, shape, dtype in self.entries
                       if dtype == "float32")
        return FlatWeights(host32, layout, extras)

    def _mean_parts(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The mean's float32 vector (host numpy) and its other entries by name."""
        vector, floats = self.vector, _float_count(self.entries)
        # divided in float64 and rounded to float32 as it is stored: no float64 mean vector
        # (a fresh one every round, page-faulted in on the driver where memory is slow)
        mean32 = torch.empty(floats, dtype=torch.float32, device=vector.device)

        def divide(start: int, stop: int) -> None:
            torch.div(vector[start:stop], self.total_weight, out=mean32[start:stop])

        blocked_sum.for_each_range(floats, vector.device, divide)
        host32 = to_host(mean32)
        extras: dict[str, np.ndarray] = {}
        if len(self.entries) and self.length > floats:
            rest = to_host(vector[floats:] / self.total_weight)
            for (name, shape, dtype), (start, stop) in zip(self.entries, _spans(self.entries),
                                                          strict=True):
                if dtype != "float32":
                    values = rest[start - floats:stop - floats]
                    if np.issubdtype(np.dtype(dtype), np.integer):
                        values = np.rint(values)
                    extras[name] = values.astype(dtype).reshape(shape)
        return host32, extras

    @property
    def sums(self) -> dict[str, np.ndarray]:
        """The float64 sums by entry (host numpy)."""
        host = to_host(self.vector)
        return {name: host[start:stop].reshape(shape) for (name, shape, _), (start, stop)
                in zip(self.entries, _spans(self.entries), strict=True)}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_weighted_sum_from_host, (to_host(self.vector), self.total_weight, self.entries))


def _weighted_sum_from_host(vector: np.ndarray, total_weight: float, entries: Entries
                            ) -> WeightedSum:
    """Unpickle a WeightedSum: a CPU tensor on the (possibly read-only) object-store array,
    copied only if something merges into it (so torch's warning about tensors on read-only
    arrays does not apply)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(vector)
    return WeightedSum(tensor, total_weight, entries, owned=vector.flags.writeable)


def _pieces(model: Weights, entries: Entries, float_layout: Layout
            ) -> list[tuple[np.ndarray | torch.Tensor, tuple[int, int]]]:
    """The (values, span) pieces in which ``model`` is added to a sum's vector: a FlatWeights
    of the sum's layout gives its whole float32 vector as one piece."""
    spans = _spans(entries)
    if isinstance(model, FlatWeights) and model.layout == float_layout:
        return [(model.vector, (0, _float_count(entries)))] + [
            (model.extras[name], span) for (name, _, dtype), span in
            zip(entries, spans, strict=True) if dtype != "float32"]
    return [(model[name], span) for (name, _, _), span in zip(entries, spans, strict=True)]


def mean_partial(models: Sequence[Weights], sample_counts: Sequence[float],
                 weighted: bool) -> WeightedSum:
    """The partial of a mean weighted by sample counts (``weighted``) or unweighted."""
    return WeightedSum.of(models, sample_counts if weighted else [1.0] * len(models))


def weighted_mean(partials: Sequence[WeightedSum]) -> dict[str, np.ndarray]:
    """Merge partial sums in order and return the weighted mean (the partials are consumed:
    the first one accumulates the others in place)."""
    if not partials:
        raise ValueError("weighted_mean needs at least one partial sum")
    total = partials[0]
    for partial in partials[1:]:
        total = total.merge(partial)
    return total.mean()


def merge_partials(left: Any, right: Any) -> Any:
    """The merge of two partials of adjacent client ranges (``left`` first), for the
    reduction tree: weighted sums add (in place into ``left``), lists concatenate, dicts merge
    key by key (a key on one side only is kept), numbers add, None is the identity."""
    if left is None:
        return right
    if right is None:
        return left
    if isinstance(left, WeightedSum) and isinstance(right, WeightedSum):
        return left.merge(right)
    if isinstance(left, list) and isinstance(right, list):
        return left + right
    if isinstance(left, Mapping) and isinstance(right, Mapping) and not isinstance(
            left, FlatWeights):
        merged = dict(left)
        for key, value in right.items():
            merged[key] = merge_partials(merged[key], value) if key in merged else value
        return merged
    if isinstance(left, (int, float)) and isinstance(right, (int, float)):
        return left + right
    raise TypeError(f"partials of types {type(left).__name__} and {type(right).__name__} "
                    "cannot be merged; the algorithm must override Algorithm.merge")


def settle(partial: Any) -> None:
    """Compute every deferred :class:`WeightedSum` inside ``partial`` (nested in mappings,
    lists, tuples or objects with a ``partial`` attribute) now, so the models it adds may
    change afterwards."""
    if isinstance(partial, WeightedSum):
        partial.settle()
    elif isinstance(partial, Mapping) and not isinstance(partial, FlatWeights):
        for value in partial.values():
            settle(value)
    elif isinstance(partial, (list, tuple)):
        for value in partial:
            settle(value)
    elif hasattr(partial, "partial"):
        settle(partial.partial)


def sample_weight(num_samples: int, weighted: bool) -> float:
    """A client's weight in a mean of uploads: its sample count where the mean is ``weighted``,
    else 1 (one vote each)."""
    return float(num_samples) if weighted else 1.0
