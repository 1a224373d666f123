"""LC-Fed: the site-conditioned channel selection, the head calibration from the sites' heads,
what stays on each client, and the two stages (the second trains the calibration alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import write_segmentation_sites
from inprocess import check_contract, simulate
from test_segmentation import segmentation_raw

from raysim.algorithms.lcfed import contrastive_site_term
from raysim.configuration.experiment import parse_config
from raysim.errors import ConfigError
from raysim.models.local_calibration import HeadCalibration, SiteChannelSelection

NETWORK = {"name": "lcfed_unet", "channels": [4, 8], "sites": 2}
TRAINING = {"rounds": 3, "batch_size": 4, "loss": "dice_ce",
            "optimizer": {"name": "adam", "lr": 0.01}}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lcfed")
    write_segmentation_sites(root, sites=2, images=10, size=24)
    return root


def _trace(root, rounds=3, **algorithm):
    raw = segmentation_raw(root, model=NETWORK, training={**TRAINING, "rounds": rounds},
                           algorithm={"name": "lcfed", "head_steps": 2, **algorithm})
    raw["dataset"]["resize"] = 16
    return simulate(parse_config(raw))


def _shared(trace):
    return trace.algorithm.shared_part(trace.server_state["model"])


def test_each_client_keeps_its_head_calibration_and_site(sites):
    trace = _trace(sites, calibration_rounds=1)
    for client, state in trace.client_states.items():
        site = next(v for k, v in state.items() if k.endswith(".site")
                    and not k.startswith("calibration."))
        np.testing.assert_array_equal(site, np.eye(2, dtype=np.float32)[client])
        assert float(state["calibrating"]) == 1  # the last round was the second stage
        assert "head.weight" in state and "calibration.calibrate.weight" in state
    shared = _shared(trace)
    assert not any(k.startswith(("head.", "calibration.")) for k in shared)
    assert any(".gate." in k for k in shared)  # the channel selection is averaged


def test_the_second_stage_trains_the_calibration_alone(sites):
    """Two first-stage rounds and one calibration round leave the U-Net and the heads where two
    first-stage rounds put them; only the calibration moved, with the heads of the round's
    start."""
    staged = _trace(sites, rounds=3, calibration_rounds=1)
    first = _trace(sites, rounds=2)
    for name, value in _shared(first).items():
        np.testing.assert_array_equal(_shared(staged)[name], value)
    for client in (0, 1):
        before, after = first.client_states[client], staged.client_states[client]
        np.testing.assert_array_equal(after["head.weight"], before["head.weight"])
        assert not np.array_equal(after["calibration.calibrate.weight"],
                                  before["calibration.calibrate.weight"])
        heads = first.server_state["heads"]
        np.testing.assert_array_equal(after["calibration.peer_weight"], heads)


def test_the_contrastive_term_moves_the_shared_channel_selection(sites):
    plain = _shared(_trace(sites, rounds=2))
    contrasted = _shared(_trace(sites, rounds=2, contrast_weight=1.0))
    gates = [k for k in plain if ".gate." in k]
    assert any(not np.array_equal(plain[k], contrasted[k]) for k in gates)


def test_the_contrastive_term_rewards_sites_whose_gates_differ():
    torch.manual_seed(0)
    selection = SiteChannelSelection(8, 3).train()
    selection.site[0] = 1
    selection(torch.randn(2, 8, 4, 4))
    term = contrastive_site_term(selection, 0)
    assert term.item() < 0 and term.requires_grad


def test_heads_that_agree_leave_no_region_to_calibrate():
    calibration = HeadCalibration(features=4, classes=2, sites=3, kernel=3, sigma=1.0)
    calibration.site[1] = 1
    calibration.peer_weight.copy_(torch.randn(1, 2, 4).expand(3, -1, -1))
    features = torch.randn(2, 4, 8, 8)
    assert calibration.disagreement(features).sum() == 0
    calibration.peer_weight[2] += torch.randn(2, 4)
    assert calibration.disagreement(features).sum() > 0


def test_lcfed_needs_its_network_with_a_site_per_client(sites):
    for model, needle in (({"name": "unet", "channels": [4, 8]}, "lcfed_unet"),
                          ({**NETWORK, "sites": 3}, "model.sites")):
        raw = segmentation_raw(sites, model=model, algorithm={"name": "lcfed"})
        with pytest.raises(ConfigError, match=needle):
            simulate(parse_config(raw))


def test_lcfed_keeps_the_algorithm_contract(sites):
    """Fresh objects every round, states through a checkpoint file and other groupings give
    the same results (the contract test of every method, on masks)."""
    raw = segmentation_raw(sites, model=NETWORK, training=TRAINING,
                           algorithm={"name": "lcfed", "head_steps": 2, "contrast_weight": 0.1,
                                      "calibration_rounds": 1})
    raw["dataset"]["resize"] = 16
    check_contract(parse_config(raw))
