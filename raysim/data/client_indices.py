"""Every client's sample indices in one flat array: a partition of a million virtual clients
costs its indices and one offset per client, in every process that holds it and in every
message that carries it, instead of one numpy array object per client."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

import numpy as np


class ClientIndices(Sequence[np.ndarray]):
    """Client -> its sample indices, as read-only-by-convention views into ``flat`` between
    consecutive ``offsets`` (client c holds ``flat[offsets[c]:offsets[c + 1]]``). It pickles
    as its two arrays (Ray hands them out of its object store without a copy)."""

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray):
        self.flat = flat
        self.offsets = offsets

    @classmethod
    def of(cls, parts: Iterable[np.ndarray]) -> ClientIndices:
        """The indices of ``parts`` (one array per client, in client order; kept as they are
        when they already are a :class:`ClientIndices`)."""
        if isinstance(parts, ClientIndices):
            return parts
        arrays = [np.asarray(part) for part in parts]
        sizes = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(flat, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        count = len(self)
        position = int(index) + count if int(index) < 0 else int(index)
        if not 0 <= position < count:
            raise IndexError(f"client {index} of {count}")
        return self.flat[self.offsets[position]:self.offsets[position + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        flat, offsets = self.flat, self.offsets
        return (flat[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1))

    def sizes(self) -> np.ndarray:
        """Samples per client."""
        return np.diff(self.offsets)

    def __repr__(self) -> str:
        return f"ClientIndices({len(self)} clients, {len(self.flat)} indices)"


def client_indices(parts: Sequence[np.ndarray] | None) -> ClientIndices | None:
    """:meth:`ClientIndices.of` of ``parts``, None kept."""
    return None if parts is None else ClientIndices.of(parts)
