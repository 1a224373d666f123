"""Seeded partitions of a training set across virtual clients, plus per-client test shares.

All schemes are vectorised numpy: a Dirichlet split of 50,000 samples over 1,000 clients at
beta 0.01 takes milliseconds, because the minimum client size is repaired by moving surplus
samples once instead of redrawing until it happens to hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raysim.configuration.schema import PartitionConfig
from raysim.data.client_indices import ClientIndices, client_indices
from raysim.data.subject_partition import by_sites, by_subjects, validation_subjects
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class Partition:
    """Client -> sample indices, for the training set and the client's share of the test set
    (each held as :class:`~raysim.data.client_indices.ClientIndices`: one flat array, whatever
    the number of clients)."""

    train: Sequence[np.ndarray]
    test: Sequence[np.ndarray]
    unseen: np.ndarray | None = None
    """Test indices of a held-out client that takes no part in training (unseen-client
    experiments), else None."""
    validation: Sequence[np.ndarray] | None = None
    """Training-set indices each client holds out as its validation share (never trained on),
    or None without a validation split."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "train", ClientIndices.of(self.train))
        object.__setattr__(self, "test", ClientIndices.of(self.test))
        object.__setattr__(self, "validation", client_indices(self.validation))

    def hold_out(self, client: int) -> Partition:
        """The partition without ``client`` (the others renumbered in order); its test share
        becomes the unseen set."""
        keep = [c for c in range(self.num_clients) if c != client]
        validation = None if self.validation is None else [self.validation[c] for c in keep]
        return Partition([self.train[c] for c in keep], [self.test[c] for c in keep],
                         self.test[client], validation)

    def split_validation(self, fraction: float, seed: int,
                         groups: np.ndarray | None = None) -> Partition:
        """Each client's training share split into training and validation: a random
        ``round(fraction * n)`` of its n samples (at least one where ``fraction`` > 0 and the
        client keeps at least one to train on) become its validation share, drawn from the
        stream (seed, "validation", client), so the split does not depend on other clients.
        With ``groups`` (each training sample's subject) whole subjects are held out instead
        (:func:`raysim.data.subject_partition.validation_subjects`)."""
        if groups is not None:
            kept, held = validation_subjects(self.train, groups, fraction, seed)
            return Partition(kept, self.test, self.unseen, held)
        train, validation = [], []
        for client, indices in enumerate(self.train):
            count = min(max(1, round(fraction * len(indices))), len(indices) - 1)
            chosen = numpy_rng(seed, "validation", client=client).permutation(len(indices))
            validation.append(np.sort(indices[chosen[:max(count, 0)]]))
            train.append(np.sort(indices[chosen[max(count, 0):]]))
        return Partition(train, self.test, self.unseen, validation)

    def validation_sources(self) -> tuple[np.ndarray, np.ndarray]:
        """The pooled validation set: its training-set indices (clients in order) and the client
        that holds each one (empty arrays without a validation split)."""
        shares = self.validation or []
        if not shares:
            return np.array([], dtype=np.int64), np.array([], dtype=np.int64)
        sizes = [len(share) for share in shares]
        return (np.concatenate(shares).astype(np.int64),
                np.repeat(np.arange(len(shares), dtype=np.int64), sizes))

    @property
    def num_clients(self) -> int:
        return len(self.train)

    def sizes(self) -> np.ndarray:
        """Training samples per client."""
        assert isinstance(self.train, ClientIndices)
        return self.train.sizes()

    def to_frame(self) -> pd.DataFrame:
        """Long table with columns client, split (train, test, validation, unseen), index."""
        import pandas as pd  # not at module level: worker processes never need it

        frames = []
        splits = [("train", self.train), ("test", self.test)]
        if self.validation is not None:
            splits.append(("validation", self.validation))
        for split, parts in splits + ([("unseen", [self.unseen])] if self.unseen is not None
                                      else []):
            sizes = [len(p) for p in parts]
            frames.append(pd.DataFrame({
                "client": np.repeat(np.arange(len(parts)), sizes),
                "split": split,
                "index": np.concatenate(parts) if parts else np.array([], dtype=np.int64),
            }))
        return pd.concat(frames, ignore_index=True)

    def save(self, path: Path) -> None:
        """Write the partition as Parquet (client, split, index)."""
        self.to_frame().to_parquet(path, index=False)


def label_keys(train_labels: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """One class per sample for label-aware splits: the labels themselves, or for multi-label
    rows (N, L) the sample's dominant finding: 0 when it has no positive label, else 1 + the
    one of its positive labels that is most frequent in ``train_labels`` (ties: the lower
    label). So there are L + 1 keys, and a Dirichlet label skew over them gives each client
    its own mix of findings (and of images without one)."""
    if labels.ndim == 1:
        return labels
    frequency = train_labels.sum(axis=0)
    rank = np.empty(len(frequency), dtype=np.int64)  # 0 = the most frequent label
    rank[np.argsort(-frequency, kind="stable")] = np.arange(len(frequency))
    ranked = np.where(labels > 0, rank[None, :], len(frequency))
    best = ranked.argmin(axis=1)
    return np.where(labels.any(axis=1), best + 1, 0).astype(np.int64)


def mask_keys(masks: np.ndarray) -> np.ndarray:
    """One key per segmentation mask for label-aware splits: 1 where it holds any
    foreground, else 0."""
    return np.asarray((masks.reshape(len(masks), -1) > 0).any(axis=1), dtype=np.int64)


def key_count(labels: np.ndarray, num_classes: int) -> int:
    """How many keys :func:`label_keys` gives (``num_classes``, or L + 1 for multi-label)."""
    return num_classes + 1 if labels.ndim == 2 else num_classes


def make_partition(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    config: PartitionConfig,
    num_classes: int,
    seed: int,
    train_groups: np.ndarray | None = None,
    test_groups: np.ndarray | None = None,
    train_blocks: np.ndarray | None = None,
    test_blocks: np.ndarray | None = None,
) -> Partition:
    """Split the training set by ``config.scheme`` and give each client a test share drawn
    from its own label distribution (the test set split class by class in proportion to the
    clients' training counts of that class). Multi-label data is split by each sample's
    dominant finding (:func:`label_keys`). Scheme ``subjects`` deals whole groups
    (``train_groups``, ``test_groups``: each sample's subject) to clients instead
    (:mod:`raysim.data.subject_partition`); scheme ``sites`` makes clients of sites, splitting
    a site by whole ``train_blocks`` / ``test_blocks`` where given."""
    if train_labels.ndim == 3:  # masks: split by whether an image holds any foreground
        train_labels, test_labels = (mask_keys(train_labels), mask_keys(test_labels))
        num_classes = 2
    else:
        num_classes = key_count(train_labels, num_classes)
        train_labels, test_labels = (label_keys(train_labels, train_labels),
                                     label_keys(train_labels, test_labels))
    rng = numpy_rng(seed, "partition")
    num_samples, num_clients = len(train_labels), config.num_clients
    if num_clients > num_samples:
        raise ConfigError(
            f"Invalid config field `partition.num_clients` = {num_clients}: the training set has "
            f"only {num_samples} samples, so at most {num_samples} clients can hold one each. "
            "Lower partition.num_clients."
        )
    if config.scheme == "sites":
        return Partition(*by_sites(train_groups, test_groups, config, rng, train_blocks,
                                   test_blocks))
    if config.scheme == "subjects":
        return Partition(*by_subjects(train_groups, test_groups, train_labels, test_labels,
                                      config, num_classes, rng))
    if config.scheme == "replicate":
        every = np.arange(num_samples)
        return Partition([every] * num_clients, [np.arange(len(test_labels))] * num_clients)
    if config.scheme == "iid":
        owners = _iid(num_samples, num_clients, config.samples_per_client, rng)
    elif config.scheme == "dirichlet":
        _check_min_size(config, num_samples)
        owners = _dirichlet(train_labels, num_classes, num_clients, config.beta, rng)
        owners = _repair_min_size(owners, num_clients, config.min_size, rng)
    elif config.scheme == "shards":
        owners = _shards(train_labels, num_classes, num_clients, config.classes_per_client, rng)
    else:
        _check_min_size(config, num_samples)
        owners = _quantity(num_samples, num_clients, config.beta, config.min_size, rng)
    train = _group_by_owner(owners, num_clients)
    empty = [client for client, indices in enumerate(train) if len(indices) == 0]
    if empty:
        raise ConfigError(
            f"Partition scheme {config.scheme!r} left {len(empty)} of {num_clients} clients "
            f"without samples (e.g. client {empty[0]}). Use fewer clients, more classes per "
            "client, or partition.min_size >= 1 with scheme dirichlet/quantity."
        )
    test = _test_shares(train, train_labels, test_labels, num_classes, rng)
    return Partition(train, test)


def share_like_training(partition: Partition, train_labels: np.ndarray,
                        labels: np.ndarray, num_classes: int, offset: int, seed: int
                        ) -> list[np.ndarray]:
    """Each client's share of another split (e.g. MedMNIST's official validation split, with
    ``labels``), drawn class by class in proportion to the clients' training counts, as the
    test shares are; indices shifted by ``offset``. From the stream (seed, "official-val")."""
    keys = label_keys(train_labels, labels)
    shares = _test_shares(partition.train, label_keys(train_labels, train_labels), keys,
                          key_count(train_labels, num_classes),
                          numpy_rng(seed, "official-val"))
    return [share + offset for share in shares]


def _check_min_size(config: PartitionConfig, num_samples: int) -> None:
    if config.min_size * config.num_clients > num_samples:
        raise ConfigError(
            f"Invalid config field `partition.min_size` = {config.min_size}: "
            f"{config.num_clients} clients x {config.min_size} samples exceeds the "
            f"{num_samples} training samples. Lower partition.min_size or partition.num_clients."
        )


def _iid(num_samples: int, num_clients: int, per_client: int | None, rng: np.random.Generator
         ) -> np.ndarray:
    order = rng.permutation(num_samples)
    owners = np.full(num_samples, -1, dtype=np.int64)
    if per_client is None:
        owners[order] = np.arange(num_samples) % num_clients
        return owners
    if per_client * num_clients > num_samples:
        raise ConfigError(
            f"Invalid config field `partition.samples_per_client` = {per_client}: "
            f"{num_clients} clients x {per_client} samples drawn without replacement needs "
            f"{per_client * num_clients} samples, but the training set has {num_samples}. "
            "Lower partition.samples_per_client or partition.num_clients."
        )
    chosen = order[: per_client * num_clients]
    owners[chosen] = np.repeat(np.arange(num_clients), per_client)
    return owners


def _dirichlet(labels: np.ndarray, num_classes: int, num_clients: int, beta: float,
               rng: np.random.Generator) -> np.ndarray:
    owners = np.empty(len(labels), dtype=np.int64)
    proportions = rng.dirichlet(np.full(num_clients, beta), size=num_classes)
    for cls in range(num_classes):
        members = rng.permutation(np.flatnonzero(labels == cls))
        counts = rng.multinomial(len(members), proportions[cls])
        owners[members] = np.repeat(np.arange(num_clients), counts)
    return owners


def _repair_min_size(owners: np.ndarray, num_clients: int, min_size: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Move randomly chosen surplus samples (beyond ``min_size``) to clients below it."""
    sizes = np.bincount(owners, minlength=num_clients)
    deficit = np.maximum(min_size - sizes, 0)
    total = int(deficit.sum())
    if total == 0:
        return owners
    keys = rng.random(len(owners))
    order = np.lexsort((keys, owners))
    start = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rank = np.empty(len(owners), dtype=np.int64)
    rank[order] = np.arange(len(owners)) - np.repeat(start, sizes)
    surplus = np.flatnonzero(rank >= min_size)
    movers = rng.choice(surplus, size=total, replace=False)
    repaired = owners.copy()
    repaired[movers] = np.repeat(np.arange(num_clients), deficit)
    return repaired


def _shards(labels: np.ndarray, num_classes: int, num_clients: int, per_client: int,
            rng: np.random.Generator) -> np.ndarray:
    if per_client > num_classes:
        raise ConfigError(
            f"Invalid config field `partition.classes_per_client` = {per_client}: the dataset "
            f"has {num_classes} classes. Use a value from 1 to {num_classes}."
        )
    class_order = rng.permutation(num_classes)
    slots = (np.arange(num_clients)[:, None] * per_client + np.arange(per_client)) % num_classes
    held = class_order[slots]  # (clients, per_client), distinct within a row
    owners = np.full(len(labels), -1, dtype=np.int64)
    for cls in range(num_classes):
        holders = np.flatnonzero((held == cls).any(axis=1))
        if len(holders) == 0:
            continue
        members = rng.permutation(np.flatnonzero(labels == cls))
        owners[members] = holders[np.arange(len(members)) % len(holders)]
    return owners


def _quantity(num_samples: int, num_clients: int, beta: float, min_size: int,
              rng: np.random.Generator) -> np.ndarray:
    proportions = rng.dirichlet(np.full(num_clients, beta))
    sizes = min_size + rng.multinomial(num_samples - min_size * num_clients, proportions)
    owners = np.empty(num_samples, dtype=np.int64)
    owners[rng.permutation(num_samples)] = np.repeat(np.arange(num_clients), sizes)
    return owners


def _group_by_owner(owners: np.ndarray, num_clients: int) -> list[np.ndarray]:
    assigned = np.flatnonzero(owners >= 0)
    order = assigned[np.argsort(owners[assigned], kind="stable")]
    bounds = np.cumsum(np.bincount(owners[assigned], minlength=num_clients))[:-1]
    return [np.sort(part) for part in np.split(order, bounds)]


def _test_shares(train: Sequence[np.ndarray], train_labels: np.ndarray, test_labels: np.ndarray,
                 num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    num_clients = len(train)
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    for client, indices in enumerate(train):
        counts[client] = np.bincount(train_labels[indices], minlength=num_classes)
    owners = np.full(len(test_labels), -1, dtype=np.int64)
    for cls in range(num_classes):
        column = counts[:, cls]
        if column.sum() == 0:
            continue
        members = rng.permutation(np.flatnonzero(test_labels == cls))
        shares = rng.multinomial(len(members), column / column.sum())
        owners[members] = np.repeat(np.arange(num_clients), shares)
    return _group_by_owner(owners, num_clients)
