"""Random streams derived from (run seed, round, client, purpose).

Every random draw in raysim comes from a stream named by what it is for, so that the numbers of a
run do not depend on how many workers there are or in which order they finish.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

_NO_ROUND = -1
_NO_CLIENT = -1


@functools.lru_cache(maxsize=256)
def _purpose_key(purpose: str) -> int:
    digest = hashlib.blake2b(purpose.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def seed_sequence(
    seed: int, purpose: str, round_: int = _NO_ROUND, client: int = _NO_CLIENT
) -> np.random.SeedSequence:
    """The seed sequence of one named stream; equal arguments give equal streams."""
    return np.random.SeedSequence(
        [seed & 0xFFFFFFFF, _purpose_key(purpose), round_ + 1, client + 1]
    )


def numpy_rng(
    seed: int, purpose: str, round_: int = _NO_ROUND, client: int = _NO_CLIENT
) -> np.random.Generator:
    """A numpy generator for the stream (seed, purpose, round, client)."""
    return np.random.default_rng(seed_sequence(seed, purpose, round_, client))


def torch_generator(
    seed: int, purpose: str, round_: int = _NO_ROUND, client: int = _NO_CLIENT
) -> torch.Generator:
    """A CPU torch generator for the stream (seed, purpose, round, client)."""
    import torch  # lazily: configs use this module without torch

    state = seed_sequence(seed, purpose, round_, client).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator()
    generator.manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = values + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


@functools.lru_cache(maxsize=64)
def _stream_base(seed: int, purpose: str, round_: int) -> int:
    """The 64-bit base of the per-client keys of (seed, purpose, round) (cached: every client
    of a round shares it)."""
    return int(seed_sequence(seed, purpose, round_).generate_state(1, dtype=np.uint64)[0])


def client_keys(seed: int, purpose: str, round_: int, clients: np.ndarray, count: int) -> np.ndarray:
    """``count`` pseudo-random uint64 keys per client, shape (len(clients), count).

    Row ``i`` depends only on (seed, purpose, round, clients[i]): each client has its own
    stream, and the keys of thousands of clients come from one vectorised computation.
    """
    base = _stream_base(seed, purpose, round_)
    per_client = _splitmix64(np.uint64(base) ^ _splitmix64(np.asarray(clients, dtype=np.uint64)))
    counters = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return _splitmix64(_splitmix64(per_client)[:, None] + counters[None, :] * _GOLDEN)
