"""FedBN, LG-FedAvg and FedRep: the server averages only the layers a method shares, each
client keeps the others, and a client's model is the round's shared layers with its own."""

from __future__ import annotations

import numpy as np
import pytest
from algorithm_configs import contract_raw
from inprocess import simulate

from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.layer_split import head_entries, norm_entries


def _trace(root, name, **algorithm):
    raw = contract_raw(root, name)
    raw["algorithm"] = {**raw["algorithm"], **algorithm}
    return simulate(parse_config(raw))


def _model_of(trace):
    return build_model(trace.algorithm.context.model, trace.algorithm.context.info)


def _differ(states, name) -> bool:
    return not all(np.array_equal(states[0][name], s[name]) for s in states[1:])


@pytest.mark.parametrize(("name", "private"), [
    ("fedbn", lambda model: norm_entries(model)),
    ("fedrep", lambda model: head_entries(model)),
    ("lg_fedavg", lambda model: frozenset(model.state_dict()) - head_entries(model))])
def test_clients_keep_their_private_layers_and_upload_only_the_shared_ones(data_root, name,
                                                                            private):
    trace = _trace(data_root, name)
    model = _model_of(trace)
    kept = private(model)
    states = [trace.client_states[c] for c in sorted(trace.client_states)]
    assert kept and all(set(state) == kept for state in states)
    assert any(_differ(states, entry) for entry in kept)  # trained apart on each client
    broadcast = trace.algorithm.broadcast(trace.server_state, 0)["model"]
    assert set(broadcast) == set(model.state_dict()) - kept
    # the shared part moved from the initial model; the server's private part never trained
    initial = trace.runtime.client_initial_weights(0)
    assert any(not np.array_equal(broadcast[k], initial[k]) for k in broadcast)
    assert all(np.array_equal(trace.server_state[k], initial[k]) for k in kept)
    # bytes up: the shared entries only, from each of the round's three clients
    up = [r["bytes"] for r in trace.rows["communication"]
          if r["round"] == 0 and r["direction"] == "up" and r["message_type"] == "model"]
    assert up == [3 * sum(np.asarray(broadcast[k]).nbytes for k in broadcast)]
    personal = trace.algorithm.compose_personal(states[1], trace.algorithm.personal_base(
        trace.server_state))
    for entry in model.state_dict():
        expected = states[1][entry] if entry in kept else broadcast[entry]
        np.testing.assert_array_equal(personal[entry], expected)


def test_fedbn_refuses_a_model_without_normalisation_layers(data_root):
    raw = contract_raw(data_root, "fedbn")
    raw["model"] = {"name": "mlp", "hidden": [8]}
    with pytest.raises(ConfigError, match=r"model\.norm: batch"):
        simulate(parse_config(raw))


def test_fedreps_head_phase_shapes_the_representation_it_uploads(data_root):
    """The representation is trained on the head of the round's head phase: more head epochs
    give another representation (were the head phase skipped, both would be equal)."""
    one = _trace(data_root, "fedrep", head_epochs=1).server_state
    three = _trace(data_root, "fedrep", head_epochs=3).server_state
    body = [k for k in one if k not in head_entries(build_model(
        parse_config(contract_raw(data_root, "fedrep")).model, _info(data_root)))]
    assert any(not np.array_equal(one[k], three[k]) for k in body)


def _info(root):
    from raysim.preparation import prepare

    config = parse_config(contract_raw(root, "fedrep"))
    dataset, _ = prepare(config, None)[0]
    return dataset.info


def test_lg_fedavgs_global_layers_are_the_only_averaged_ones(data_root):
    """With more global layers, more of the server's model is trained; the local layers of the
    server never move."""
    trace = _trace(data_root, "lg_fedavg", global_layers=2)
    model = _model_of(trace)
    initial = trace.runtime.client_initial_weights(0)
    moved = {k for k in model.state_dict()
             if not np.array_equal(trace.server_state[k], initial[k])}
    assert moved and moved <= head_entries(model, 2)
    assert moved - head_entries(model, 1)  # the second-to-last layer is averaged too


def test_the_membership_audit_finds_no_whole_model_in_a_partial_upload(data_root):
    """An upload of the shared layers alone is not a model the loss attack can run: the
    audit skips it (the private layers never leave the client)."""
    trace = _trace(data_root, "fedbn")
    upload = {"model": trace.algorithm.broadcast(trace.server_state, 0)["model"]}
    x, y = trace.dataset.test_x[:4], trace.dataset.test_y[:4]
    assert trace.algorithm.membership_scores(trace.runtime, 0, upload, x, y) is None
