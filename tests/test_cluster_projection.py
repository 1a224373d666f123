"""The cluster projection's arithmetic: its compute term is the probe's round on the probe's
shape, the broadcast crosses once per node (inline: once per worker), a node sends its roots
of the reduction tree (one per node on power-of-two shapes), FedDC's relays change node with
probability 1 - 1/N, and a bad cluster is one clear paragraph."""

from __future__ import annotations

import pytest
from conftest import quickstart_raw

from raysim.cli import main
from raysim.configuration.experiment import parse_config
from raysim.estimator.cluster_projection import (
    ClusterShape,
    ProbeTraffic,
    cluster_round,
    node_roots,
    round_bytes,
)

MODEL = 4 * 2**20  # a 4 MiB float32 model: its float64 root is 8 MiB


def _traffic(**fields) -> ProbeTraffic:
    values = {"rounds": 3, "broadcast_bytes": MODEL, "sum_bytes_per_root": 2 * MODEL,
              "listed_bytes": 0.0, "state_bytes": 0.0, "moved_states": 0.0, "train_s": 2.0,
              "other_s": 0.5, "down_bytes": 64 * MODEL, "up_bytes": 64 * MODEL, "workers": 2,
              "clients": 64}
    return ProbeTraffic(**{**values, **fields})


def _config(clients: int = 64, **engine):
    return parse_config(quickstart_raw(
        partition={"scheme": "iid", "num_clients": clients},
        engine={"num_workers": 2, "cpus_per_worker": 1, **engine}))


def test_the_compute_term_is_the_probes_round_on_the_probes_shape():
    config = _config()
    projected = cluster_round(config, _traffic(), ClusterShape(1, 2, 10))
    assert projected.workers == 2
    assert projected.compute_s == pytest.approx(2.5)  # train + driver, as probed
    assert projected.broadcast_s == projected.partials_s == projected.relays_s == 0
    eight = cluster_round(config, _traffic(), ClusterShape(4, 2, 10))  # 8 workers, 8 clients each
    assert eight.compute_s == pytest.approx(2.0 * 8 / 32 + 0.5)


def test_on_power_of_two_shapes_each_node_sends_one_root_and_gets_one_broadcast():
    assert node_roots(64, 64, 4, [2, 2, 2, 2]) == [1, 1, 1, 1]
    assert node_roots(150, 64, 3, [2, 2, 2]) == [1, 3, 3]  # unaligned: a few roots
    config = _config()
    moved = round_bytes(config, _traffic(), 4, [2, 2, 2, 2])
    assert moved.broadcast_out == 3 * MODEL  # once per other node, from the object store
    assert moved.partials_in == 3 * 2 * MODEL  # one float64 root per other node
    rate = 10e9 / 8
    projected = cluster_round(config, _traffic(), ClusterShape(4, 2, 10))
    assert projected.partials_s == pytest.approx(6 * MODEL / rate)
    assert projected.allreduce_floor_s == pytest.approx(2 * MODEL * 3 / 4 / rate)
    assert projected.flower_s == pytest.approx(64 * MODEL / rate)


def test_a_small_broadcast_travels_in_every_task_and_lists_cross_in_proportion():
    config = _config()
    small = round_bytes(config, _traffic(broadcast_bytes=1000, listed_bytes=4000.0), 2, [2, 2])
    assert small.broadcast_out == 2 * 1000  # inline: one copy per worker on the other node
    assert small.partials_in == pytest.approx(2 * MODEL + 4000 / 2)  # half the clients' lists


def test_relays_change_node_with_probability_one_minus_the_nodes_share():
    config = _config()
    relays = round_bytes(config, _traffic(moved_states=64.0, state_bytes=MODEL), 4,
                         [2, 2, 2, 2])
    assert relays.relays_between == pytest.approx(64 * MODEL * 3 / 4)
    assert relays.relays_per_node == pytest.approx(64 * MODEL * 3 / 16)
    uneven = round_bytes(config, _traffic(moved_states=64.0, state_bytes=MODEL), 2, [1, 3])
    assert uneven.relays_between == pytest.approx(64 * MODEL * 2 * (1 / 4) * (3 / 4))


@pytest.mark.parametrize("arguments, needle", [
    (["--nodes", "0"], "not a count of at least 1"),
    (["--cluster-csv", "x.csv"], "needs --nodes N"),
    (["--nodes", "4", "--link-gbps", "0"], "must be positive"),
])
def test_a_bad_cluster_is_one_paragraph(capsys, tmp_path, arguments, needle):
    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")
    try:
        code = main(["estimate", str(config), *arguments])
    except SystemExit as exited:  # argparse's own check of a count
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
