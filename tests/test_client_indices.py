"""A partition's clients as one flat array of indices: the same indices as one array per
client, and a cost per client of an offset, not of an array object."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from raysim.configuration.schema import PartitionConfig
from raysim.data.client_indices import ClientIndices
from raysim.data.partition import Partition, make_partition


def test_the_flat_indices_are_each_clients_array_in_order():
    parts = [np.array([3, 1]), np.array([], dtype=np.int64), np.array([7]), np.array([0, 2, 5])]
    indices = ClientIndices.of(parts)
    assert len(indices) == 4
    for client, part in enumerate(parts):
        np.testing.assert_array_equal(indices[client], part)
    np.testing.assert_array_equal(indices[-1], parts[-1])
    assert [list(p) for p in indices] == [list(p) for p in parts]
    assert [list(p) for p in indices[1:3]] == [[], [7]]
    np.testing.assert_array_equal(indices.sizes(), [2, 0, 1, 3])
    with pytest.raises(IndexError):
        indices[4]
    assert ClientIndices.of(indices) is indices


def test_a_partition_holds_its_shares_flat_and_keeps_its_numbers():
    labels = np.random.default_rng(0).integers(0, 3, 400)
    config = PartitionConfig(scheme="dirichlet", num_clients=20, beta=0.5, min_size=2)
    partition = make_partition(labels, labels[:100], config, 3, 0)
    assert isinstance(partition.train, ClientIndices)
    assert isinstance(partition.test, ClientIndices)
    listed = Partition([np.array(p) for p in partition.train], [np.array(p) for p in
                                                                partition.test])
    assert partition.sizes().tolist() == [len(p) for p in listed.train]
    held = partition.split_validation(0.25, 0)
    assert isinstance(held.validation, ClientIndices)
    assert sorted(np.concatenate([*held.train, *held.validation]).tolist()) == \
        sorted(np.concatenate(list(partition.train)).tolist())


def test_a_hundred_thousand_clients_pickle_as_their_indices_and_offsets():
    clients = 100_000
    labels = np.zeros(clients * 4, dtype=np.int64)
    config = PartitionConfig(scheme="iid", num_clients=clients, samples_per_client=4)
    partition = make_partition(labels, labels[:1000], config, 2, 0)
    indices_bytes = 8 * (clients * 4 + 1000) + 2 * 8 * (clients + 1)
    assert len(pickle.dumps(partition, protocol=5)) < 1.05 * indices_bytes + 10_000
