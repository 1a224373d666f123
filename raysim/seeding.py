"""Random streams derived from (run seed, round, client, purpose).

Every random draw in raysim comes from a stream named by what it is for, so that the numbers of a
run do not depend on how many workers there are or in which order they finish.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

_NO_ROUND = -1
_NO_CLIENT = -1


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
    state = seed_sequence(seed, purpose, round_, client).generate_state(1, dtype=np.uint64)[0]
    generator = torch.Generator()
    generator.manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator
