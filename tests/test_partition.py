"""Partition invariants: disjoint, sizes add up, skew follows beta, infeasible ones fail."""

from __future__ import annotations

import numpy as np
import pytest

from raysim.configuration.schema import PartitionConfig
from raysim.data.partition import make_partition
from raysim.errors import ConfigError

RNG = np.random.default_rng(0)
TRAIN_Y = RNG.integers(0, 10, 20_000)
TEST_Y = RNG.integers(0, 10, 4_000)


def partition(**options):
    return make_partition(TRAIN_Y, TEST_Y, PartitionConfig(**options), 10, seed=3)


@pytest.mark.parametrize("options", [
    {"scheme": "iid", "num_clients": 37},
    {"scheme": "iid", "num_clients": 150, "samples_per_client": 8},
    {"scheme": "dirichlet", "num_clients": 50, "beta": 0.1, "min_size": 5},
    {"scheme": "shards", "num_clients": 40, "classes_per_client": 2},
    {"scheme": "quantity", "num_clients": 30, "beta": 0.5, "min_size": 3},
])
def test_no_sample_twice_and_sizes_add_up(options):
    result = partition(**options)
    train = np.concatenate(result.train)
    assert len(np.unique(train)) == len(train)
    test = np.concatenate(result.test)
    assert len(np.unique(test)) == len(test) == len(TEST_Y)
    if options.get("samples_per_client"):
        assert (result.sizes() == options["samples_per_client"]).all()
    elif options["scheme"] != "shards" or options["num_clients"] * 2 >= 10:
        assert result.sizes().sum() == len(TRAIN_Y)
    assert result.sizes().min() >= options.get("min_size", 1)


def test_same_seed_same_partition_other_seed_differs():
    config = PartitionConfig(scheme="dirichlet", num_clients=20, beta=0.3)
    first = make_partition(TRAIN_Y, TEST_Y, config, 10, seed=1)
    again = make_partition(TRAIN_Y, TEST_Y, config, 10, seed=1)
    other = make_partition(TRAIN_Y, TEST_Y, config, 10, seed=2)
    assert all((a == b).all() for a, b in zip(first.train, again.train, strict=True))
    assert any(len(a) != len(b) or (a != b).any()
               for a, b in zip(first.train, other.train, strict=True))


def _mean_label_entropy(result) -> float:
    entropies = []
    for indices in result.train:
        counts = np.bincount(TRAIN_Y[indices], minlength=10)
        p = counts[counts > 0] / counts.sum()
        entropies.append(-(p * np.log(p)).sum())
    return float(np.mean(entropies))


def test_label_skew_grows_as_beta_falls():
    entropy = [_mean_label_entropy(partition(scheme="dirichlet", num_clients=30, beta=beta,
                                             min_size=10)) for beta in (100.0, 1.0, 0.1, 0.01)]
    assert entropy == sorted(entropy, reverse=True)
    assert entropy[0] > 2.2 and entropy[-1] < 1.0


def test_dirichlet_thousand_clients_tiny_beta_respects_min_size():
    result = partition(scheme="dirichlet", num_clients=1000, beta=0.01, min_size=10)
    assert result.sizes().min() >= 10
    assert result.sizes().sum() == len(TRAIN_Y)


def test_shards_give_each_client_its_classes():
    result = partition(scheme="shards", num_clients=25, classes_per_client=3)
    for indices in result.train:
        assert len(np.unique(TRAIN_Y[indices])) == 3


def test_test_shares_follow_client_label_distribution():
    result = partition(scheme="shards", num_clients=10, classes_per_client=2)
    for train, test in zip(result.train, result.test, strict=True):
        assert set(np.unique(TEST_Y[test])) <= set(np.unique(TRAIN_Y[train]))
        assert len(test) > 0


@pytest.mark.parametrize("options, field", [
    ({"scheme": "iid", "num_clients": 30_000}, "partition.num_clients"),
    ({"scheme": "iid", "num_clients": 100, "samples_per_client": 500}, "samples_per_client"),
    ({"scheme": "dirichlet", "num_clients": 100, "min_size": 300}, "partition.min_size"),
    ({"scheme": "shards", "num_clients": 10, "classes_per_client": 11}, "classes_per_client"),
])
def test_impossible_partitions_are_config_errors(options, field):
    with pytest.raises(ConfigError, match=field):
        partition(**options)
