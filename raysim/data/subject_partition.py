"""``partition.scheme: subjects``: each client holds whole subjects (groups) of the training and
of the test split, so no subject's samples sit on two clients, and a subject is in the test
split only if the dataset put all of it there (:mod:`raysim.data.recordings`).

Subjects are dealt to clients so that their sample counts come out as even as whole subjects
allow: in a seeded order, largest first, each to the client that holds the fewest samples so
far. ``label_skew`` then draws each client's class mix from Dirichlet(label_skew) and keeps the
largest subset of its samples (training and test share alike) with that mix; the rest are held
by no client.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raysim.configuration.schema import PartitionConfig
from raysim.errors import ConfigError
from raysim.seeding import numpy_rng


def deal_subjects(groups: np.ndarray, num_clients: int, rng: np.random.Generator, split: str
                  ) -> list[np.ndarray]:
    """The sample indices of each client's subjects (sorted), subjects dealt as the module
    docstring says; one paragraph when there are fewer subjects than clients."""
    subjects, sizes = np.unique(groups, return_counts=True)
    if len(subjects) < num_clients:
        raise ConfigError(
            f"Invalid config field `partition.num_clients` = {num_clients}: scheme 'subjects' "
            f"gives each client whole subjects, and the {split} split holds {len(subjects)} "
            f"subject(s). Use at most {len(subjects)} clients"
            + (", or more test subjects (dataset.test_subjects)" if split == "test" else "")
            + ".")
    order = rng.permutation(len(subjects))
    order = order[np.argsort(-sizes[order], kind="stable")]
    held = np.zeros(num_clients, dtype=np.int64)
    owner_of = np.empty(len(subjects), dtype=np.int64)
    for subject in order:
        client = int(np.argmin(held))
        owner_of[subject] = client
        held[client] += sizes[subject]
    owners = owner_of[np.searchsorted(subjects, groups)]
    return [np.flatnonzero(owners == client) for client in range(num_clients)]


def skew_labels(shares: list[np.ndarray], labels: np.ndarray, mixes: np.ndarray,
                rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's largest subset whose class mix is its row of ``mixes``: ``n * p_k`` samples
    of class k (floored), ``n`` as large as the client's counts allow (classes it lacks
    dropped from the mix)."""
    kept = []
    for share, mix in zip(shares, mixes, strict=True):
        counts = np.bincount(labels[share], minlength=len(mix))
        present = (counts > 0) & (mix > 0)
        if not present.any():
            kept.append(share[:0])
            continue
        weights = np.where(present, mix, 0.0) / mix[present].sum()
        total = float(np.min(counts[present] / weights[present]))
        take = np.floor(total * weights + 1e-9).astype(np.int64)
        chosen = [rng.permutation(share[labels[share] == k])[:take[k]]
                  for k in range(len(mix)) if take[k]]
        kept.append(np.sort(np.concatenate(chosen)) if chosen else share[:0])
    return kept


def by_subjects(train_groups: np.ndarray | None, test_groups: np.ndarray | None,
                train_labels: np.ndarray, test_labels: np.ndarray, config: PartitionConfig,
                num_classes: int, rng: np.random.Generator
                ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The training and test shares of ``partition.scheme: subjects``."""
    if train_groups is None or test_groups is None:
        raise ConfigError(
            "Invalid config field `partition.scheme` = 'subjects': the dataset does not say "
            "which subject each sample comes from. Scheme 'subjects' needs a dataset that does "
            "(a folder of recordings as dataset.path); use another scheme (iid, dirichlet, ...) "
            "for this one.")
    train = deal_subjects(train_groups, config.num_clients, rng, "training")
    test = deal_subjects(test_groups, config.num_clients, rng, "test")
    if config.label_skew is not None:
        mixes = rng.dirichlet(np.full(num_classes, config.label_skew), size=config.num_clients)
        train = skew_labels(train, train_labels, mixes, rng)
        test = skew_labels(test, test_labels, mixes, rng)
        empty = [c for c, share in enumerate(train) if len(share) == 0]
        if empty:
            raise ConfigError(
                f"Invalid config field `partition.label_skew` = {config.label_skew}: client "
                f"{empty[0]}'s drawn class mix leaves it no training sample. Use a larger "
                "label_skew (milder skew) or another seed.")
    return train, test


def validation_subjects(train: Sequence[np.ndarray], groups: np.ndarray, fraction: float,
                        seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Each client's training share split by whole subjects: ``round(fraction * s)`` of its s
    subjects (at least one where ``fraction`` > 0, and at least one left to train on) become
    its validation share, drawn from the stream (seed, "validation", client)."""
    kept, held = [], []
    for client, indices in enumerate(train):
        subjects = np.unique(groups[indices])
        count = min(max(1, round(fraction * len(subjects))), len(subjects) - 1)
        chosen = numpy_rng(seed, "validation", client=client).permutation(subjects)[:count]
        out = np.isin(groups[indices], chosen)
        held.append(indices[out])
        kept.append(indices[~out])
    return kept, held


def by_sites(train_groups: np.ndarray | None, test_groups: np.ndarray | None,
             config: PartitionConfig, rng: np.random.Generator,
             train_blocks: np.ndarray | None = None, test_blocks: np.ndarray | None = None
             ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The training and test shares of ``partition.scheme: sites``: site s's k_s clients
    (``clients_per_site``, in site order) each hold one part of its training images and the
    same part of its test images (parts are equal splits of a seeded permutation of the site's
    images, or of its blocks of consecutive images where ``*_blocks`` are given)."""
    if train_groups is None or test_groups is None:
        raise ConfigError(
            "Invalid config field `partition.scheme` = 'sites': the dataset does not say which "
            "site each sample comes from. Scheme 'sites' needs a multi-site dataset "
            "(dataset.sites); use another scheme (iid, dirichlet, ...) for this one.")
    sites = int(max(train_groups.max(initial=-1), test_groups.max(initial=-1))) + 1
    configured = config.clients_per_site
    counts = [configured] * sites if isinstance(configured, int) else list(configured)
    if len(counts) != sites:
        raise ConfigError(
            f"Invalid config field `partition.clients_per_site` = {configured}: the dataset "
            f"has {sites} sites and the list names {len(counts)}. Give one number per site, "
            "in the order of dataset.sites, or one number for all.")
    if config.num_clients != sum(counts):
        raise ConfigError(
            f"Invalid config field `partition.num_clients` = {config.num_clients}: scheme "
            f"'sites' makes {configured} client(s) of each of the dataset's {sites} sites "
            f"(partition.clients_per_site), {sum(counts)} in all. Set "
            f"partition.num_clients: {sum(counts)}, or change clients_per_site.")

    def parts(groups: np.ndarray, blocks: np.ndarray | None) -> list[np.ndarray]:
        shares: list[np.ndarray] = []
        for site, per_site in enumerate(counts):
            members = np.flatnonzero(groups == site)
            if blocks is None or per_site == 1:
                members = rng.permutation(members)
                shares.extend(np.sort(part) for part in np.array_split(members, per_site))
                continue
            runs = rng.permutation(np.unique(blocks[members]))
            shares.extend(members[np.isin(blocks[members], part)]
                          for part in np.array_split(runs, per_site))
        return shares

    train, test = parts(train_groups, train_blocks), parts(test_groups, test_blocks)
    empty = [c for c, share in enumerate(train) if len(share) == 0]
    if empty:
        raise ConfigError(
            f"Invalid config field `partition.clients_per_site` = {configured}: client "
            f"{empty[0]} is left without training images (its site has fewer images or runs "
            "of images than clients). Lower clients_per_site.")
    return train, test
