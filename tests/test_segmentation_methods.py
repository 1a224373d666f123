"""The personalised and model-heterogeneous methods on masks: FedSM's super model (its
selector routes each image to a personalized model's mask or the global model's), FedSM-extra,
MH-pFLID with the segmentation messenger and heterogeneous U-Nets, and the FCN; and the data
splits that keep runs of video frames whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import write_segmentation_sites
from inprocess import simulate
from test_segmentation import segmentation_raw

from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, PartitionConfig, SegmentationSiteConfig
from raysim.data import load_dataset, make_partition
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.messenger import InformationExchange, SegmentationMessenger
from raysim.models.params import FCNParams, UNetParams, UNetPlusPlusParams
from raysim.models.split import SplitModel
from raysim.training.evaluation import predict_proba
from raysim.vectors.weights import set_weights

TRAINING = {"rounds": 2, "batch_size": 4, "loss": "dice_ce",
            "optimizer": {"name": "adam", "lr": 0.01}}
TINY_SELECTOR = {"name": "cnn", "channels": [4, 8], "hidden": 8}
HETEROGENEOUS = [{"name": "unetpp", "features": [4, 4, 8, 8, 16, 4]},
                 {"name": "fcn", "channels": [4, 4, 8, 8, 8], "head_features": 4}]
TINY_MESSENGER = {"segmentation_messenger_widths": [4, 4, 4, 8],
                  "segmentation_messenger_decoder": 4}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("segmentation-methods")
    write_segmentation_sites(root, sites=2, images=10, size=24)
    return root


def raw_at(root: Path, size: int, **sections) -> dict:
    raw = segmentation_raw(root, training=TRAINING, **sections)
    raw["dataset"]["resize"] = size
    return raw


@pytest.mark.parametrize("params", [UNetParams(channels=(4, 8)),
                                    UNetParams(channels=(4, 8), residual_units=1),
                                    UNetPlusPlusParams(features=(4, 4, 8, 8, 16, 4)),
                                    FCNParams(channels=(4, 4, 8, 8, 8), head_features=4)])
def test_segmentation_networks_split_into_a_body_and_a_pixel_head(sites, params):
    info = load_dataset(segmentation_raw_config(sites)).info
    model = build_model(params, info)
    assert isinstance(model, SplitModel)
    x = torch.randn(2, 3, 40, 40)  # FCN's stride 32 with ceil pooling: any size works
    features = model.body(x)
    assert features.shape == (2, model.feature_channels, 40, 40)
    assert isinstance(model.head, torch.nn.Conv2d) and model.head.kernel_size == (1, 1)
    assert torch.equal(model(x), model.head(features))


def segmentation_raw_config(root: Path) -> DatasetConfig:
    return DatasetConfig(**segmentation_raw(root)["dataset"])


def test_fedsm_super_model_routes_each_image_to_one_models_mask(sites):
    raw = raw_at(sites, 16, algorithm={"name": "fedsm", "selector_model": TINY_SELECTOR,
                                       "selector_epochs": 3})
    trace = simulate(parse_config(raw))
    algorithm, runtime = trace.algorithm, trace.runtime
    models = algorithm.evaluation_models(trace.server_state)
    x = trace.dataset.test_x
    sources = np.zeros(len(x), dtype=np.int64)
    always_personal = {**models[""], "gamma": 0.0}  # every image to its top-scored client
    outputs = algorithm.predict_many(runtime, {"super": always_personal, "gm": models["gm_"]},
                                     x, sources, 4)
    masks, routes = outputs["super"]
    assert masks.shape == (len(x), 16, 16) and masks.dtype == np.uint8
    assert routes is not None and set(routes) <= {0, 1}
    for route in set(routes):  # each image's mask is its chosen personalized model's
        set_weights(runtime.model, always_personal["personal"][route])
        rows = routes == route
        expected = predict_proba(runtime.model, x[rows], runtime.info, 4, runtime.device)
        assert np.array_equal(masks[rows], expected)
    global_masks, _ = outputs["gm"]
    set_weights(runtime.model, models["gm_"])
    assert np.array_equal(global_masks, predict_proba(runtime.model, x, runtime.info, 4,
                                                      runtime.device))
    # the personalized models are not the global model: SoftPull kept them apart
    assert not np.array_equal(masks, global_masks) or any(
        not np.array_equal(models["gm_"][k], always_personal["personal"][0][k])
        for k in models["gm_"])


def test_fedsm_extra_labels_images_by_the_frozen_models_losses(sites):
    raw = raw_at(sites, 16, algorithm={"name": "fedsm", "variant": "extra", "extra_rounds": 1,
                                       "selector_model": TINY_SELECTOR})
    trace = simulate(parse_config(raw))
    last = trace.metrics[-1]
    assert set(last) == {0, 1} and all(np.isfinite(m["selector_loss"]) for m in last.values())
    assert all("train_loss" not in m for m in last.values())  # models frozen in extra rounds


def test_mhpflid_trains_heterogeneous_unets_through_the_segmentation_messenger(sites):
    raw = raw_at(sites, 32, algorithm={"name": "mhpflid", "injection_epochs": 1,
                                       **TINY_MESSENGER},
                 clients={"architectures": HETEROGENEOUS})
    trace = simulate(parse_config(raw))
    assert trace.algorithm.task_loss.kind == "dice_ce"  # both stages on the run's mask loss
    metrics = trace.metrics[-1]
    assert all(m["messenger_change"] > 0 and np.isfinite(m["distillation_loss"])
               for m in metrics.values())
    messenger = trace.server_state
    assert any(k.startswith("head.") and messenger[k].ndim == 4 for k in messenger)  # deconvs
    for client, state in trace.client_states.items():  # each client its own architecture
        model = trace.runtime.client_model(client)
        set_weights(model, state["local"])
        masks = predict_proba(model, trace.dataset.test_x[:3], trace.runtime.info, 3,
                              trace.runtime.device)
        assert masks.shape == (3, 32, 32)


def test_mhpflid_segmentation_refuses_channel_tokens(sites):
    raw = raw_at(sites, 32, algorithm={"name": "mhpflid", "tokens": "channel", **TINY_MESSENGER},
                 clients={"architectures": HETEROGENEOUS})
    with pytest.raises(ConfigError, match="tokens: spatial"):
        simulate(parse_config(raw))


@pytest.mark.parametrize("size", [32, 40])
def test_segmentation_messenger_decodes_to_the_input_size(size):
    messenger = SegmentationMessenger(3, 2, (4, 4, 4, 8), 4)
    x = torch.randn(2, 3, size, size)
    grid = messenger.feature_map(x)
    assert grid.shape == (2, 8, -(-size // 16), -(-size // 16))
    assert messenger(x).shape == (2, 2, size, size)
    for query_from in ("messenger", "local"):
        for mode in ("attention", "add"):
            exchange = InformationExchange(5, 8, query_from=query_from,  # type: ignore[arg-type]
                                           mode=mode, dense=True)  # type: ignore[arg-type]
            out = exchange(torch.randn(2, 5, size, size), grid)
            assert out.shape == grid.shape  # a map the head decodes
            local = torch.randn(2, 5, size, size)
            if mode == "attention":  # the local features reach the output
                assert not torch.allclose(exchange(local, grid), exchange(local * 3, grid))


def blocked_sites(root: Path) -> DatasetConfig:
    return DatasetConfig(name="discs", resize=16, sites=[
        SegmentationSiteConfig(name="site0", path=str(root / "site0"), split_blocks=2),
        SegmentationSiteConfig(name="site1", path=str(root / "site1"), split_blocks=2)],
        test_fraction=0.2)


def test_validation_and_site_halves_keep_runs_of_frames_whole(sites):
    dataset = load_dataset(blocked_sites(sites))
    assert dataset.train_blocks is not None and dataset.test_blocks is not None
    assert not set(dataset.train_blocks) & set(dataset.test_blocks)
    partition = make_partition(dataset.train_y, dataset.test_y,
                               PartitionConfig(scheme="sites", num_clients=4,
                                               clients_per_site=2), 2, 0,
                               dataset.train_groups, dataset.test_groups,
                               dataset.train_blocks, dataset.test_blocks)
    blocks = [set(dataset.train_blocks[share]) for share in partition.train]
    assert all(not blocks[a] & blocks[b] for a in range(4) for b in range(a + 1, 4))
    split = partition.split_validation(0.3, 0, dataset.train_blocks)
    for kept, held in zip(split.train, split.validation or [], strict=True):
        assert len(held) and not set(dataset.train_blocks[kept]) & set(
            dataset.train_blocks[held])


def test_clients_per_site_may_differ_by_site_for_an_unseen_hospital(sites):
    dataset = load_dataset(blocked_sites(sites))
    args = (dataset.train_groups, dataset.test_groups, dataset.train_blocks,
            dataset.test_blocks)
    partition = make_partition(dataset.train_y, dataset.test_y, PartitionConfig(
        scheme="sites", num_clients=3, clients_per_site=[2, 1]), 2, 0, *args)
    owners = [set(dataset.train_groups[share]) for share in partition.train]
    assert owners == [{0}, {0}, {1}]
    unseen = partition.hold_out(2)
    assert unseen.num_clients == 2 and unseen.unseen is not None
    assert set(dataset.test_groups[unseen.unseen]) == {1}
    with pytest.raises(ConfigError, match="one number per site"):
        make_partition(dataset.train_y, dataset.test_y, PartitionConfig(
            scheme="sites", num_clients=3, clients_per_site=[1, 1, 1]), 2, 0, *args)


@pytest.mark.parametrize("model", [{"name": "unet", "channels": [4, 8], "residual_units": 1},
                                   {"name": "fcn", "channels": [4, 4, 8, 8, 8],
                                    "head_features": 4}])
def test_the_vectorised_client_path_trains_segmentation_networks_as_the_loop_does(sites, model):
    """InstanceNorm (the U-Nets) and BatchNorm (the FCN) under torch.func, the Dice + CE loss
    included: one batched step over the clients gives the per-client loop's models."""
    states = []
    for vectorize in ("never", "always"):
        raw = segmentation_raw(sites, model=model, engine={"vectorize": vectorize})
        raw["dataset"]["resize"] = 32
        trace = simulate(parse_config(raw))
        assert trace.runtime.path == ("loop" if vectorize == "never" else "vectorized")
        states.append(trace.server_state)
    loop, batched = states
    for name, array in loop.items():
        if array.dtype.kind == "f":
            assert np.allclose(array, batched[name], atol=1e-5), name


def test_segmentation_networks_are_known_by_their_registration():
    from raysim.models import segmentation_models

    assert {"unet", "unetpp", "fcn"} <= set(segmentation_models())
    assert not {"convnet", "vgg", "tcn"} & set(segmentation_models())


def test_a_runs_validation_split_holds_out_whole_runs_of_frames(sites):
    """Through the run's preparation (not the partition alone): evaluation.validation takes
    whole blocks of split_blocks frames."""
    from raysim.preparation import prepare

    raw = segmentation_raw(sites, evaluation={"clients": True, "validation": 0.3})
    raw["dataset"] = blocked_sites(sites).model_dump(mode="json")
    dataset, partition = prepare(parse_config(raw), None)[0]
    assert dataset.train_blocks is not None and partition.validation is not None
    for kept, held in zip(partition.train, partition.validation, strict=True):
        assert len(held) and not set(dataset.train_blocks[kept]) & set(
            dataset.train_blocks[held])
