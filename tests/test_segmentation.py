"""Segmentation: multi-site folders of images and masks as a dataset, sites as clients, MONAI's
networks, losses and metrics, and the shared-model methods on masks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fixtures import write_segmentation_sites
from inprocess import simulate
from PIL import Image
from test_bad_input import run_cli

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, PartitionConfig, SegmentationSiteConfig
from raysim.data import load_dataset, make_partition, subset_keys
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.params import UNetParams, UNetPlusPlusParams
from raysim.preparation import run_context
from raysim.results import load
from raysim.rounds.final_models import read_final_models
from raysim.training.evaluation import predict_proba, segmentation_metrics, segmentation_scores
from raysim.training.losses import loss_function, training_loss
from raysim.vectors.weights import set_weights

TINY_UNET = {"name": "unet", "channels": [4, 8]}


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("segmentation")
    write_segmentation_sites(root, sites=2, images=10, size=24)
    return root


def sites_config(root: Path, **options) -> DatasetConfig:
    return DatasetConfig(name="discs", sites=[
        SegmentationSiteConfig(name="site0", path=str(root / "site0")),
        SegmentationSiteConfig(name="site1", path=str(root / "site1"), split_blocks=5)],
        resize=16, **options)


def segmentation_raw(root: Path, **sections) -> dict:
    raw = {"name": "seg", "dataset": sites_config(root).model_dump(mode="json"),
           "partition": {"scheme": "sites", "num_clients": 2},
           "model": TINY_UNET, "algorithm": {"name": "fedavg"},
           "training": {"rounds": 2, "batch_size": 4, "loss": "dice_ce",
                        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}},
           "evaluation": {"clients": True}, "seeds": [0]}
    raw.update(sections)
    return raw


def test_sites_load_as_resized_masks_with_whole_blocks_in_the_test_split(sites):
    dataset = load_dataset(sites_config(sites))
    info = dataset.info
    assert (info.task, info.num_classes, info.input_shape) == ("segmentation", 2, (3, 16, 16))
    assert dataset.train_x.shape[1:] == (16, 16, 3) and dataset.train_y.shape[1:] == (16, 16)
    assert dataset.train_y.dtype == np.uint8 and set(np.unique(dataset.train_y)) == {0, 1}
    assert dataset.test_groups is not None
    assert sorted(set(dataset.test_groups)) == [0, 1]
    # site1's 10 images in blocks of 5: its test split is one whole block
    site1_test = int((dataset.test_groups == 1).sum())
    assert site1_test == 5
    again = load_dataset(sites_config(sites))  # from the cache: the same arrays
    assert np.array_equal(again.train_x, dataset.train_x)
    assert np.array_equal(again.test_y, dataset.test_y)


def test_the_split_layout_and_inverted_masks_are_read(tmp_path, sites):
    folder = tmp_path / "prostate_like"
    for split in ("train", "test"):
        for kind, source in (("image", "images"), ("mask", "masks")):
            (folder / split / kind).mkdir(parents=True)
            for index in range(2):
                name = f"{index + (2 if split == 'test' else 0):03d}.png"
                picture = Image.open(sites / "site0" / source / name)
                if kind == "mask":
                    picture = Image.fromarray(255 - np.asarray(picture))
                picture.save(folder / split / kind / name)
    config = DatasetConfig(name="p", sites=[SegmentationSiteConfig(
        name="p", path=str(folder), invert=True)], resize=16)
    dataset = load_dataset(config)
    assert len(dataset.train_y) == 2 and len(dataset.test_y) == 2
    plain = load_dataset(sites_config(sites, test_fraction=0.5))
    assert 0 < dataset.train_y.mean() < 0.5 and 0 < plain.train_y.mean() < 0.5


@pytest.mark.parametrize("case, needle", [
    ("unpaired", "without a partner"), ("size", "must have the same size"),
    ("indices", "not a class"), ("missing", "no folder at"), ("layout", "none of the layouts")])
def test_bad_sites_are_one_paragraph(tmp_path, sites, case, needle):
    folder = tmp_path / "site"
    shutil.copytree(sites / "site0", folder)
    site = {"name": "s", "path": str(folder)}
    if case == "unpaired":
        (folder / "masks" / "000.png").unlink()
    elif case == "size":
        Image.new("L", (5, 5)).save(folder / "masks" / "000.png")
    elif case == "indices":
        site["mask"] = "indices"
    elif case == "missing":
        site["path"] = str(tmp_path / "nowhere")
    else:
        shutil.rmtree(folder / "masks")
    with pytest.raises(ConfigError, match=needle) as raised:
        load_dataset(DatasetConfig(name="bad", sites=[SegmentationSiteConfig(**site)],
                                   resize=16, num_classes=2))
    assert "\n" not in str(raised.value)
    if case == "unpaired":  # the site may leave such files out instead
        dataset = load_dataset(DatasetConfig(name="ok", sites=[SegmentationSiteConfig(
            **site, unpaired="skip")], resize=16))
        assert len(dataset.train_y) + len(dataset.test_y) == 9


def test_sites_scheme_makes_clients_of_sites_with_their_own_test_shares(sites):
    dataset = load_dataset(sites_config(sites))
    config = PartitionConfig(scheme="sites", num_clients=4, clients_per_site=2)
    partition = make_partition(dataset.train_y, dataset.test_y, config, 2, 0,
                               dataset.train_groups, dataset.test_groups)
    assert dataset.train_groups is not None and dataset.test_groups is not None
    for client in range(4):
        assert set(dataset.train_groups[partition.train[client]]) == {client // 2}
        assert set(dataset.test_groups[partition.test[client]]) == {client // 2}
    with pytest.raises(ConfigError, match="num_clients: 4"):
        make_partition(dataset.train_y, dataset.test_y,
                       PartitionConfig(scheme="sites", num_clients=3, clients_per_site=2), 2, 0,
                       dataset.train_groups, dataset.test_groups)


def test_dice_iou_and_hd95_follow_their_definitions():
    truth = np.zeros((3, 8, 8), np.uint8)
    truth[:, 2:6, 2:6] = 1  # 16 pixels
    predicted = truth.copy()
    predicted[1] = 0  # nothing found
    predicted[2, 2:6, 2:8] = 1  # 24 pixels, 16 of them right
    scores = segmentation_scores(truth, predicted)
    assert np.allclose(scores["dice"], [1.0, 0.0, 2 * 16 / (16 + 24)])
    assert np.allclose(scores["iou"], [1.0, 0.0, 16 / 24])
    assert scores["hd95"][0] == 0 and np.isnan(scores["hd95"][1]) and scores["hd95"][2] == 2
    assert np.allclose(scores["accuracy"], [1.0, 1 - 16 / 64, 1 - 8 / 64])
    # a class absent from an image's truth and prediction does not count for it: the same
    # scores when a third class appears elsewhere in the batch
    extra_truth, extra_guess = np.concatenate([truth, np.full((1, 8, 8), 2, np.uint8)]), \
        np.concatenate([predicted, np.full((1, 8, 8), 2, np.uint8)])
    with_third = segmentation_scores(extra_truth, extra_guess)
    assert np.allclose(with_third["dice"], [1.0, 0.0, 2 * 16 / (16 + 24), 1.0])
    empty = np.zeros((1, 8, 8), np.uint8)
    assert segmentation_scores(empty, empty)["dice"][0] == 1.0  # nothing there, nothing found


def test_dice_losses_score_the_overlap_not_the_pixel_likelihood(sites):
    info = load_dataset(sites_config(sites)).info
    masks = torch.zeros(2, 8, 8, dtype=torch.uint8)
    masks[:, 2:6, 2:6] = 1
    right = torch.nn.functional.one_hot(masks.long(), 2).permute(0, 3, 1, 2).float() * 40 - 20
    dice = loss_function(training_loss("dice", info))
    assert float(dice(right, masks)) < 0.01  # perfect overlap
    assert 0.95 < float(dice(-right, masks)) <= 1.0  # none: 1 - Dice, not a cross-entropy of 40
    cross_entropy = loss_function(training_loss("cross_entropy", info))
    assert float(cross_entropy(-right, masks)) > 30
    both = loss_function(training_loss("dice_ce", info))
    assert abs(float(both(-right, masks)) - float(dice(-right, masks))
               - float(cross_entropy(-right, masks))) < 1e-3


@pytest.mark.parametrize("params", [UNetParams(channels=(4, 8), residual_units=1),
                                    UNetPlusPlusParams(features=(4, 4, 8, 8, 16, 4))])
def test_monai_networks_give_per_pixel_logits(sites, params):
    info = load_dataset(sites_config(sites)).info
    model = build_model(params, info)
    logits = model(torch.randn(2, 3, 32, 32))  # UNet++ halves 4 times: 32 px leaves a 2x2 map
    assert logits.shape == (2, 2, 32, 32)
    masks = torch.randint(0, 2, (2, 32, 32), dtype=torch.uint8)
    for loss in ("cross_entropy", "dice", "dice_ce"):
        value = loss_function(training_loss(loss, info))(logits, masks)
        assert value.ndim == 0 and torch.isfinite(value)


def test_wrong_methods_models_and_losses_are_refused(capsys, tmp_path, sites):
    for raw, needle in [
            (segmentation_raw(sites, algorithm={"name": "feddf"}), "does not take segmentation"),
            (segmentation_raw(sites, model={"name": "convnet"}), "segmentation network"),
            (segmentation_raw(sites, algorithm={"name": "local"},
                              evaluation={"fine_tune_epochs": 1}), "cannot be fine-tuned"),
            ({**segmentation_raw(sites), "dataset": {"name": "breast-cancer"},
              "partition": {"num_clients": 2}}, "it is for segmentation")]:
        code, err = run_cli(capsys, tmp_path, raw)
        assert code == 2 and needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize("algorithm, extra", [
    ({"name": "fedavg"}, {}), ({"name": "fedprox", "mu": 0.01}, {}), ({"name": "scaffold"}, {}),
    ({"name": "ditto", "lam": 0.1}, {}), ({"name": "local"}, {}), ({"name": "centralized"}, {}),
    ({"name": "apfl"}, {}), ({"name": "fedrep", "head_epochs": 1}, {}),
    ({"name": "lg_fedavg"}, {}),
    ({"name": "fedbn"}, {"model": {"name": "unet", "channels": [4, 8], "norm": "batch"}}),
    ({"name": "fedavg"}, {"privacy": {"noise_multiplier": 0.5, "clip": 1.0}}),
    ({"name": "fedavg"}, {"server_optimizer": {"name": "adam", "lr": 0.01}}),
    ({"name": "fedavg"}, {"system": {"tiers": {"cpu_server": 0.5, "constrained_site": 0.5},
                                     "policy": "deadline", "deadline_s": 60.0}})])
def test_shared_model_methods_and_layers_train_on_masks(sites, algorithm, extra):
    trace = simulate(parse_config(segmentation_raw(sites, algorithm=algorithm, **extra)))
    losses = [m["train_loss"] for m in trace.metrics[-1].values()]
    assert losses and np.isfinite(losses).all()


def test_a_run_scores_dice_per_round_and_per_client_and_real_masks_beat_chance(
        ray_session, tmp_path, sites):
    training = {"rounds": 3, "batch_size": 4, "loss": "dice_ce",
                "optimizer": {"name": "adam", "lr": 0.01}}
    evaluation = {"clients": True, "keep_models": True}
    outcomes = [run_experiment(parse_config(segmentation_raw(
        sites, algorithm={"name": name}, training=training,
        evaluation={**evaluation, "fine_tune_epochs": tune})),
        output=str(tmp_path / name), progress=False)[0]
        for name, tune in (("fedavg", 1), ("local", 0), ("lg_fedavg", 0))]
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
        rounds = load(outcome.run_dir, "rounds")
        final = rounds.dropna(subset=["dice"]).iloc[-1]
        column = "own_dice" if "own_dice" in rounds else "personal_dice"
        assert 0 <= final["dice"] <= 1 and 0 <= final[column] <= 1
        assert final["iou"] <= final["dice"] + 1e-9  # IoU <= Dice for every image
        clients = load(outcome.run_dir, "client_eval")
        assert {"own_dice", "own_iou", "own_hd95"} <= set(clients.columns) or \
            {"main_own_dice"} <= set(clients.columns)
    # the discs are learnable: the global model beats predicting background everywhere (Dice 0)
    fedavg = load(outcomes[0].run_dir, "rounds").dropna(subset=["dice"])
    # +FT: after the last round every client's fine-tuned model, beside the global model's
    tuned = load(outcomes[0].run_dir, "client_eval")
    last = tuned[tuned["round"] == 2].set_index("client")
    assert sorted(last.index) == [0, 1] and last["ft_own_dice"].between(0, 1).all()
    assert (last["ft_own_dice"] != last["main_own_dice"]).any()
    assert "ft_own_dice" not in tuned[tuned["round"] < 2].dropna(axis=1, how="all")
    assert fedavg["ft_own_dice"].iloc[-1] == pytest.approx(last["ft_own_dice"].mean())
    assert fedavg["dice"].iloc[-1] > 0.3
    # the kept final models give the last round's scores again
    final = read_final_models(outcomes[0].run_dir)
    assert final.rounds == 3
    dataset = load_dataset(sites_config(sites))
    model = build_model(parse_config(segmentation_raw(sites)).model, dataset.info)
    set_weights(model, final.server_state)
    masks = predict_proba(model, dataset.test_x, dataset.info, 8, torch.device("cpu"))
    assert abs(segmentation_metrics(dataset.test_y, masks)["dice"] - fedavg["dice"].iloc[-1]) \
        < 1e-9
    local = read_final_models(outcomes[1].run_dir)
    assert sorted(local.client_states) == [0, 1]  # every client's own model
    # a personal model built on the server's (LG-FedAvg: the round's global head with the
    # client's own layers) scores as the run's workers composed it
    kept = read_final_models(outcomes[2].run_dir)
    config = parse_config(segmentation_raw(sites, algorithm={"name": "lg_fedavg"}))
    algorithm = ALGORITHMS["lg_fedavg"](config.algorithm, run_context(config, dataset, 0, 2))
    personal = algorithm.compose_personal(kept.client_states[0],
                                          algorithm.personal_base(kept.server_state))
    set_weights(model, personal)
    share = pd.read_parquet(Path(outcomes[2].run_dir) / "partition.parquet")
    rows = load(outcomes[2].run_dir, "client_eval")
    scored = rows[(rows["round"] == 2) & (rows["client"] == 0)]["own_dice"].iloc[0]
    test_share = share[(share["split"] == "test") & (share["client"] == 0)]["index"].to_numpy()
    masks = predict_proba(model, dataset.test_x[test_share], dataset.info, 8, torch.device("cpu"))
    assert abs(segmentation_metrics(dataset.test_y[test_share], masks)["dice"] - scored) < 1e-6


def test_a_training_subset_of_sites_keeps_each_sites_share_and_its_blocks(sites):
    whole = load_dataset(sites_config(sites))
    subset = load_dataset(sites_config(sites, train_subset=6))
    assert len(subset.train_x) == len(subset.train_y) == len(subset.train_blocks) == 6
    share = np.bincount(whole.train_groups) * 6 / len(whole.train_groups)
    assert np.abs(np.bincount(subset.train_groups, minlength=2) - share).max() <= 1  # each site
    kept = [int(np.flatnonzero((whole.train_x == x).all(axis=(1, 2, 3)))[0])
            for x in subset.train_x]
    assert whole.train_blocks[kept].tolist() == subset.train_blocks.tolist()
    strata = subset_keys(whole)  # the draw's strata: foreground or not, within each site
    per_site = [set(strata[whole.train_groups == site].tolist()) for site in (0, 1)]
    assert len(per_site[0]) == len(per_site[1]) == 1 and per_site[0] != per_site[1]
