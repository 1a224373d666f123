"""Update compression as a feature (``compression:``): top-k and 8-bit updates, error feedback
carried in the client states, the compressed bytes in the communication table, the refusals,
and the contract (fresh objects, state files) under the layer."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import check_contract, simulate

from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import CompressionConfig
from raysim.errors import ConfigError
from raysim.layers.compression import CompressedClientState, compress, decompress

BASE = {"w": np.zeros((2, 3), np.float32), "steps": np.array(4, np.int64)}


def _upload(values) -> dict[str, np.ndarray]:
    return {"w": np.asarray(values, np.float32).reshape(2, 3), "steps": np.array(5, np.int64)}


def test_topk_sends_the_largest_coordinates_and_keeps_the_rest_as_residual():
    update = [0.1, -3.0, 0.2, 2.0, -0.05, 0.3]
    sent, residual = compress(CompressionConfig(method="topk", fraction=0.33), _upload(update),
                              BASE, None)
    assert sent.indices is not None and sent.indices.tolist() == [1, 3]
    model = decompress(sent)
    np.testing.assert_array_equal(model["w"].ravel(), [0, -3.0, 0, 2.0, 0, 0])
    np.testing.assert_array_equal(model["steps"], 5)  # (not float32: travels as it is)
    np.testing.assert_allclose(residual, [0.1, 0, 0.2, 0, -0.05, 0.3])
    dense_bytes = 6 * 4 + 8
    assert sent.wire_bytes == 2 * (4 + 4) + 8 < dense_bytes


def test_int8_rounds_every_coordinate_within_half_a_step():
    update = np.linspace(-1.0, 0.7, 6)
    sent, residual = compress(CompressionConfig(method="int8"), _upload(update), BASE, None)
    step = 1.0 / 127
    assert np.abs(residual).max() <= step / 2 + 1e-7
    np.testing.assert_allclose(decompress(sent)["w"].ravel(), update, atol=step / 2 + 1e-7)
    assert sent.wire_bytes == 6 + 4 + 8  # one byte each, one scale, the int64 entry


def test_error_feedback_sends_over_the_rounds_everything_the_clients_computed():
    """Sum of what was sent plus the last residual equals the sum of the true updates; without
    the carried residual the small coordinates are never sent."""
    settings = CompressionConfig(method="topk", fraction=0.2)
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=6).astype(np.float32) * [5, 1, 1, 1, 1, 0.1]
               for _ in range(8)]
    residual = None
    total_sent = np.zeros(6)
    for update in updates:
        sent, residual = compress(settings, _upload(update), BASE, residual)
        total_sent += decompress(sent)["w"].ravel()
    np.testing.assert_allclose(total_sent + residual, np.sum(updates, axis=0), atol=1e-5)
    assert np.count_nonzero(total_sent) > 1  # the carried parts win a turn


@pytest.fixture(scope="module")
def fedavg_raw(data_root):
    return contract_raw(data_root, "fedavg")


def _bytes_up(trace) -> float:
    return sum(row["bytes"] for row in trace.rows["communication"]
               if row["direction"] == "up" and row["message_type"] == "model")


def test_compressed_uploads_are_counted_at_their_size_and_the_model_still_learns(fedavg_raw):
    plain = simulate(parse_config(fedavg_raw))
    topk = simulate(parse_config({**fedavg_raw,
                                  "compression": {"method": "topk", "fraction": 0.1}}))
    ratio = _bytes_up(topk) / _bytes_up(plain)
    assert 0.15 < ratio < 0.25  # 10 % of the coordinates, an int32 index each
    int8 = simulate(parse_config({**fedavg_raw, "compression": {"method": "int8"}}))
    assert 0.24 < _bytes_up(int8) / _bytes_up(plain) < 0.3
    assert topk.manifest == {"compression": {"method": "topk", "fraction": 0.1,
                                             "error_feedback": True}}
    states = topk.client_states.values()
    assert states and all(isinstance(s, CompressedClientState) and s.residual["model"].any()
                          for s in states)
    start = simulate(parse_config({**fedavg_raw, "training": {**fedavg_raw["training"],
                                                                "rounds": 1}}))
    moved = [not np.allclose(topk.server_state[k], start.server_state[k]) for k in
             topk.server_state]
    assert any(moved)


def test_everything_sent_without_feedback_is_fedavg(fedavg_raw):
    """(Under SGD: Adam's normalisation blows float32 rounding of base + update up.)"""
    sgd = {**fedavg_raw, "training": {**fedavg_raw["training"],
                                      "optimizer": {"name": "sgd", "lr": 0.05}}}
    plain = simulate(parse_config(sgd))
    whole = simulate(parse_config({**sgd, "compression": {
        "method": "topk", "fraction": 1.0, "error_feedback": False}}))
    for key in plain.server_state:
        np.testing.assert_allclose(whole.server_state[key], plain.server_state[key],
                                   rtol=1e-5, atol=1e-6)
    assert not whole.client_states  # no residual to keep


def test_error_feedback_changes_the_run(fedavg_raw):
    def final(feedback: bool):
        return simulate(parse_config({**fedavg_raw, "compression": {
            "method": "topk", "fraction": 0.05, "error_feedback": feedback}})).server_state
    with_feedback, without = final(True), final(False)
    assert any(not np.allclose(with_feedback[k], without[k]) for k in with_feedback)


def test_the_contract_holds_under_compression(fedavg_raw):
    check_contract(parse_config({**fedavg_raw, "compression": {"method": "topk",
                                                               "fraction": 0.2}}))


@pytest.mark.parametrize(("sections", "words"), [
    ({"algorithm": {"name": "scaffold"}}, "declares no mean_uploads"),
    ({"privacy": {"clip": 1.0, "noise_multiplier": 1.0}}, "`compression` and `privacy`"),
    ({"system": {"tiers": {"cpu_server": 1.0}, "policy": "fedbuff", "buffer_size": 2}},
     "fedbuff"),
])
def test_combinations_compression_cannot_serve_are_refused_with_a_paragraph(
        fedavg_raw, sections, words):
    from raysim.preparation import prepare

    raw = {**fedavg_raw, "compression": {"method": "topk"}, **sections}
    with pytest.raises(ConfigError, match=words):
        prepare(parse_config(raw), None)
