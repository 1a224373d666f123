"""The whole MedMNIST family: multi-label ChestMNIST, the 3D subsets, scores as the
medmnist package computes them, and the official validation split. Generated fixtures in the
MedMNIST layout; the real AdrenalMNIST3D files are used where present."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import REAL_MEDMNIST
from fixtures import write_medmnist_npz, write_multilabel_npz, write_volume_npz
from inprocess import simulate

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, PartitionConfig
from raysim.data import load_dataset
from raysim.data.partition import label_keys, make_partition
from raysim.errors import ConfigError
from raysim.preparation import prepare
from raysim.training.evaluation import classification_metrics, label_aucs, share_metrics


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = tmp_path_factory.mktemp("family")
    write_multilabel_npz(path, n_train=300, n_test=150)
    write_volume_npz(path, n_train=60, n_test=30)
    write_medmnist_npz(path, "pneumoniamnist", n_train=90, n_test=30)
    return path


def _raw(root, flag: str, **sections) -> dict:
    volumes = flag.endswith("3d")
    raw = {
        "name": f"family-{flag}",
        "dataset": {"name": flag, "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": 3},
        "model": ({"name": "convnet3d", "width": 4, "depth": 2} if volumes
                  else {"name": "convnet", "width": 8, "depth": 2}),
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 3, "batch_size": 16, "optimizer": {"name": "adam", "lr": 0.003}},
        "seeds": [0],
    }
    raw.update(sections)
    return raw


def _test_scores(trace) -> np.ndarray:
    """The final global model's predictions on the test set."""
    models = trace.algorithm.evaluation_models(trace.server_state)
    x = trace.dataset.test_x
    probabilities, _ = trace.algorithm.predict(trace.runtime, models[next(iter(models))], x,
                                               np.zeros(len(x), dtype=np.int64), 64)
    return probabilities


# ----- scores as MedMNIST computes them -----
TASKS = [("binary-class", 2, False), ("multi-class", 8, False),
         ("ordinal-regression", 5, False), ("multi-label, binary-class", 14, True)]


@pytest.mark.parametrize("task, width, multi_label", TASKS, ids=[t[0] for t in TASKS])
def test_accuracy_and_auc_equal_the_medmnist_evaluator_on_random_predictions(task, width,
                                                                             multi_label):
    import medmnist.evaluator as official

    rng = np.random.default_rng(len(task))
    for _ in range(3):
        if multi_label:
            labels = (rng.random((200, width)) < 0.3).astype(np.int64)
            scores = rng.random((200, width))
        else:
            labels = rng.integers(0, width, 200)
            scores = rng.dirichlet(np.ones(width), 200)
        ours = classification_metrics(labels, scores)
        assert ours["accuracy"] == pytest.approx(official.getACC(labels, scores, task), abs=1e-12)
        assert ours["auc"] == pytest.approx(official.getAUC(labels, scores, task), abs=1e-12)


def test_multilabel_scores_of_a_trained_model_equal_the_evaluator_and_are_per_label(root):
    import medmnist.evaluator as official

    trace = simulate(parse_config(_raw(root, "chestmnist")))
    scores, labels = _test_scores(trace), trace.dataset.test_y
    assert scores.shape == labels.shape == (150, 14)
    assert ((scores > 0) & (scores < 1)).all()  # sigmoid per label, not a softmax row
    assert not np.allclose(scores.sum(axis=1), 1.0)
    ours = classification_metrics(labels, scores)
    task = "multi-label, binary-class"
    assert ours["accuracy"] == pytest.approx(official.getACC(labels, scores, task), abs=1e-12)
    assert ours["auc"] == pytest.approx(official.getAUC(labels, scores, task), abs=1e-12)
    # learning happened on every label (the fixture draws each at its own place)
    per_label = label_aucs(labels, scores)
    assert ours["auc"] > 0.85 and np.nanmin(per_label) > 0.6
    assert ours["auc"] == pytest.approx(np.mean(per_label))


def test_auc_of_a_share_missing_a_class_averages_the_defined_classes():
    labels = np.array([0, 0, 1, 1, 1])  # class 2 absent: medmnist's AUC is undefined
    scores = np.array([[.8, .1, .1], [.6, .2, .2], [.2, .7, .1], [.3, .4, .3], [.1, .3, .6]])
    aucs = label_aucs(labels, scores)
    assert math.isnan(aucs[2]) and np.isfinite(aucs[:2]).all()
    assert classification_metrics(labels, scores)["auc"] == pytest.approx(np.mean(aucs[:2]))


def test_multilabel_share_metrics_equal_the_metrics_of_each_share():
    rng = np.random.default_rng(0)
    labels, scores = (rng.random((90, 14)) < 0.3).astype(np.int64), rng.random((90, 14))
    shares = [np.arange(0, 25), np.arange(25, 90)]
    vectorised = share_metrics(scores, labels, shares)
    for client, share in enumerate(shares):
        single = classification_metrics(labels[share], scores[share])
        for metric in ("accuracy", "macro_f1", "loss"):
            assert vectorised[metric][client] == pytest.approx(single[metric])


# ----- multi-label data -----
def test_chestmnist_layout_loads_as_label_rows_with_the_official_validation_split(root):
    dataset = load_dataset(DatasetConfig(name="chestmnist", root=str(root), download=False,
                                         verify_checksum=False))
    assert dataset.info.task == "multi-label" and dataset.info.num_classes == 14
    assert dataset.train_y.shape == (300, 14) and dataset.val_y is not None
    assert dataset.val_y.shape == (75, 14) and dataset.info.label_names[13] == "hernia"


def test_multilabel_label_skew_splits_by_each_images_dominant_finding():
    labels = np.array([[0, 0, 0], [1, 1, 0], [0, 1, 1], [0, 0, 1], [1, 0, 1]])
    # training frequency: label 0: 2, label 1: 2, label 2: 3 -> rank 2, 0, 1 (ties: lower label)
    assert label_keys(labels, labels).tolist() == [0, 1, 3, 3, 3]
    rng = np.random.default_rng(0)
    train = (rng.random((3000, 14)) < np.linspace(0.3, 0.02, 14)).astype(np.int64)
    test = (rng.random((1000, 14)) < np.linspace(0.3, 0.02, 14)).astype(np.int64)
    settings = PartitionConfig(scheme="dirichlet", num_clients=5, beta=0.1, min_size=10)
    partition = make_partition(train, test, settings, 14, seed=0)
    keys, test_keys = label_keys(train, train), label_keys(train, test)
    counts = np.array([np.bincount(keys[share], minlength=15) for share in partition.train])
    mixes = counts / counts.sum(axis=1, keepdims=True)
    held_by_largest = counts.max(axis=0) / np.maximum(counts.sum(axis=0), 1)
    assert held_by_largest.mean() > 0.6  # label skew: each finding mostly at one client
    # (iid: about 1/5 each)
    for client in range(5):  # test shares follow each client's own mix of findings
        test_mix = np.bincount(test_keys[partition.test[client]], minlength=15)
        assert np.corrcoef(test_mix, mixes[client])[0, 1] > 0.8


def test_multilabel_runs_train_with_per_label_binary_cross_entropy(root):
    from raysim.data.dataset import DataInfo
    from raysim.training.losses import loss_function, training_loss

    chest = DataInfo("chestmnist", "image", 14, (1, 28, 28), task="multi-label")
    loss = loss_function(training_loss("cross_entropy", chest))
    logits, targets = torch.randn(6, 14), (torch.rand(6, 14) < 0.3).long()
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets.float())
    assert torch.allclose(loss(logits, targets), expected)
    trace = simulate(parse_config(_raw(root, "chestmnist", training={
        "rounds": 1, "batch_size": 300, "local_epochs": 1,
        "optimizer": {"name": "sgd", "lr": 1e-12}})))
    x, y = trace.runtime.client_data(0)
    with torch.no_grad():
        trace.runtime.model.eval()
        start = torch.nn.functional.binary_cross_entropy_with_logits(
            trace.runtime.model(x), y.float())
    assert trace.metrics[0][0]["train_loss"] == pytest.approx(float(start), rel=1e-4)


# ----- which methods take which data -----
def _family_configs(root) -> list[tuple[str, str, dict]]:
    from algorithm_configs import CONFIGS

    cases = []
    for name in sorted(CONFIGS):  # raysim's methods (a test's plug-ins are not among them)
        for flag in ("chestmnist", "adrenalmnist3d"):
            extra = {k: v for k, v in CONFIGS[name].items() if k not in ("model", "clients")}
            extra.setdefault("algorithm", {"name": name})
            if "clients" in CONFIGS[name]:  # heterogeneous methods: every client the same model
                extra["clients"] = {"architectures": [_raw(root, flag)["model"]] * 2,
                                    "assign": "cycle"}
            raw = _raw(root, flag, **extra)
            raw["training"] = {**raw["training"], "rounds": 2}
            cases.append((name, flag, raw))
    return cases


def test_every_method_supports_multilabel_and_3d_data_or_refuses_with_its_reason(root):
    must_support = {"fedavg", "fedprox", "local", "centralized", "feddc", "fedsm"}
    supported = set()
    for name, flag, raw in _family_configs(root):
        algorithm_class = ALGORITHMS[name]
        refusal = (algorithm_class.supports.multi_label_refusal if flag == "chestmnist"
                   else algorithm_class.supports.volume_refusal)
        config = parse_config(raw)
        if refusal is not None:
            with pytest.raises(ConfigError, match="does not support") as error:
                prepare(config, None)
            assert refusal in str(error.value) and "\n" not in str(error.value)
            continue
        trace = simulate(config)
        scores = _test_scores(trace) if trace.algorithm.evaluation_models(
            trace.server_state) else None
        assert scores is None or np.isfinite(scores).all(), (name, flag)
        losses = [m["train_loss"] for m in trace.metrics[-1].values() if "train_loss" in m]
        assert losses and np.isfinite(losses).all(), (name, flag)
        supported.add((name, flag))
    for name in must_support:
        assert {(name, "chestmnist"), (name, "adrenalmnist3d")} <= supported, name


def test_hinge_loss_on_multilabel_data_is_refused(root):
    config = parse_config(_raw(root, "chestmnist", training={"rounds": 1, "loss": "hinge"}))
    with pytest.raises(ConfigError, match="binary cross-entropy of each label"):
        prepare(config, None)


# ----- 3D volumes -----
def test_3d_models_take_volumes_and_the_batchnorm_free_convnet_is_vectorisable():
    from raysim.configuration.schema import OptimizerConfig
    from raysim.data.dataset import DataInfo
    from raysim.models import build_model
    from raysim.models.costs import forward_flops
    from raysim.models.params import ConvNet3DParams, ResNet18_3DParams
    from raysim.training.vectorized import LOOP, VECTORIZED, choose_path

    info = DataInfo("v", "image", 3, (1, 28, 28, 28))
    volumes = torch.randn(2, 1, 28, 28, 28)
    convnet = build_model(ConvNet3DParams(width=8, depth=3, norm="none"), info)
    assert convnet(volumes).shape == (2, 3)
    # 3 x conv3x3x3 + 1 linear: 2 * (28^3 * 27 * 1 * 8 + 14^3 * 27 * 8 * 8 + 7^3 * 27 * 8 * 8
    # + 8 * 3^3 * 3) multiply-adds as FLOPs
    convolutions = 28 ** 3 * 27 * 8 + 14 ** 3 * 27 * 64 + 7 ** 3 * 27 * 64
    assert forward_flops(convnet, info.input_shape) == 2 * (convolutions + 8 * 27 * 3)
    sgd, cpu = OptimizerConfig(name="sgd", lr=0.1), torch.device("cpu")
    assert choose_path(convnet, sgd, cpu, "always")[0] == VECTORIZED
    batch = build_model(ConvNet3DParams(width=8, norm="batch"), info)
    assert choose_path(batch, sgd, cpu, "auto")[0] == LOOP  # BatchNorm: batched on request
    assert choose_path(batch, sgd, cpu, "always")[0] == VECTORIZED
    resnet = build_model(ResNet18_3DParams(), info)
    assert resnet(volumes).shape == (2, 3)
    assert isinstance(resnet.stem[0], torch.nn.Conv3d) and resnet.stem[0].stride == (1, 1, 1)


def test_3d_volumes_learn_and_the_vectorised_path_matches_the_loop(root):
    raw = _raw(root, "adrenalmnist3d", training={"rounds": 3, "batch_size": 16,
                                                 "optimizer": {"name": "sgd", "lr": 0.05}})
    loop = simulate(parse_config({**raw, "engine": {"vectorize": "never"}}))
    batched = simulate(parse_config({**raw, "engine": {"vectorize": "always"}}))
    a, b = _test_scores(loop), _test_scores(batched)
    np.testing.assert_allclose(a, b, atol=2e-4)
    metrics = classification_metrics(loop.dataset.test_y, a)
    assert metrics["auc"] > 0.9  # the fixture's cube position gives the class away


def test_site_shift_on_volumes_blurs_in_3d_and_differs_per_client(root):
    from raysim.data.site_shift import SiteAppearance

    volume = np.zeros((1, 9, 9, 9), dtype=np.uint8)
    volume[0, 4, 4, 4] = 255
    blurred = SiteAppearance(1.0, 0.0, 1.0, 1.0, 0.0, ()).apply(volume, None, volumetric=True)
    assert blurred[0, 3, 4, 4] > 0 and blurred[0, 5, 4, 4] > 0  # spread along depth too
    assert blurred[0, 4, 4, 4] < 255
    config = parse_config(_raw(root, "adrenalmnist3d", partition={
        "scheme": "iid", "num_clients": 3, "site_shift": {"strength": 1.0}}))
    shifted, partition = prepare(config, None)[0]
    original = load_dataset(config.dataset)
    changes = [np.abs(shifted.train_x[s].astype(int) - original.train_x[s]).mean()
               for s in partition.train]
    assert min(changes) > 1 and len({round(c, 3) for c in changes}) == 3


# ----- the official validation split -----
def test_official_validation_split_is_medmnists_val_split_among_the_clients(root):
    config = parse_config(_raw(root, "chestmnist", evaluation={"validation": "official"},
                               partition={"scheme": "dirichlet", "num_clients": 3,
                                          "beta": 0.5, "min_size": 5}))
    dataset, partition = prepare(config, None)[0]
    original = load_dataset(config.dataset)
    assert original.val_y is not None
    held, _ = partition.validation_sources()
    n_train = len(original.train_y)
    assert sorted(held.tolist()) == list(range(n_train, n_train + len(original.val_y)))
    assert not set(held.tolist()) & set(np.concatenate(partition.train).tolist())
    np.testing.assert_array_equal(dataset.train_x[n_train:], original.val_x)
    np.testing.assert_array_equal(dataset.train_y[n_train:], original.val_y)
    train_keys = label_keys(original.train_y, original.train_y)
    for client in range(3):  # each client's validation share follows its training mix
        mix = np.bincount(train_keys[partition.train[client]], minlength=15)
        val_mix = np.bincount(label_keys(original.train_y, dataset.train_y)[
            partition.validation[client]], minlength=15)
        assert np.corrcoef(mix, val_mix)[0, 1] > 0.7


def test_a_medmnist_file_without_a_val_split_loads_and_refuses_the_official_one(tmp_path):
    path = write_multilabel_npz(tmp_path, n_train=40, n_test=20)
    arrays = {k: v for k, v in np.load(path).items() if not k.startswith("val_")}
    np.savez(path, **arrays)
    dataset = load_dataset(DatasetConfig(name="chestmnist", root=str(tmp_path), download=False,
                                         verify_checksum=False))
    assert dataset.val_x is None and dataset.train_y.shape == (40, 14)
    with pytest.raises(ConfigError, match="no official validation split"):
        prepare(parse_config(_raw(tmp_path, "chestmnist",
                                  evaluation={"validation": "official"})), None)


def test_official_validation_without_a_val_split_is_refused():
    raw = _raw(None, "chestmnist", evaluation={"validation": "official"})
    raw["dataset"] = {"name": "breast-cancer"}
    raw["model"] = {"name": "mlp"}
    with pytest.raises(ConfigError, match="no official validation split"):
        prepare(parse_config(raw), None)


def test_official_validation_reaches_the_rounds_table_with_per_label_aucs(root, tmp_path):
    import pandas as pd
    import yaml

    from raysim.cli import main

    raw = _raw(root, "chestmnist", evaluation={"validation": "official"},
               engine={"num_workers": 1, "cpus_per_worker": 1}, output=str(tmp_path))
    raw["training"]["rounds"] = 2
    config = tmp_path / "chest.yaml"
    config.write_text(yaml.safe_dump(raw))
    assert main(["run", str(config), "--no-progress"]) == 0
    rounds = pd.read_parquet(next(tmp_path.glob("family-chestmnist-*/seed_0/rounds")))
    assert {"val_auc", "val_accuracy", "auc_atelectasis", "auc_hernia"} <= set(rounds.columns)
    last = rounds.iloc[-1]
    labels = [f"auc_{name}" for name in load_dataset(DatasetConfig(
        name="chestmnist", root=str(root), download=False,
        verify_checksum=False)).info.label_names]
    assert last["auc"] == pytest.approx(last[labels].mean())
    assert 0.5 < last["val_auc"] <= 1.0


# ----- real data -----
REAL_3D = REAL_MEDMNIST / "adrenalmnist3d.npz"
REAL_AUC_MARGIN = 0.62
"""Probe (FedAvg, 3D ConvNet width 16, 4 iid clients, Adam 1e-3, batch 32, 3 rounds, seed 0,
real AdrenalMNIST3D at 28 px): test AUC 0.70 after round 2, 0.75 after round 4 (chance 0.5)."""


@pytest.mark.skipif(not REAL_3D.exists(), reason="real AdrenalMNIST3D not present")
def test_fedavg_learns_real_adrenalmnist3d_with_the_3d_convnet():
    raw = _raw(REAL_MEDMNIST, "adrenalmnist3d",
               partition={"scheme": "iid", "num_clients": 4},
               model={"name": "convnet3d"},
               training={"rounds": 3, "batch_size": 32,
                         "optimizer": {"name": "adam", "lr": 0.001}})
    raw["dataset"]["verify_checksum"] = True
    trace = simulate(parse_config(raw))
    metrics = classification_metrics(trace.dataset.test_y, _test_scores(trace))
    assert metrics["auc"] > REAL_AUC_MARGIN


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_npz_members_are_read_as_numpy_reads_them_in_either_memory_order(tmp_path, version):
    import zipfile

    from numpy.lib import format as npy_format

    from raysim.data.medmnist_io import _read_npz
    from raysim.errors import DataError

    rng = np.random.default_rng(0)
    arrays = {"train_images": rng.integers(0, 256, (7, 5, 5, 3), dtype=np.uint8),
              "train_labels": rng.integers(0, 4, (7, 1)),
              "test_images": np.asfortranarray(rng.integers(0, 256, (3, 5, 5, 3), dtype=np.uint8)),
              "test_labels": np.asfortranarray(rng.integers(0, 2, (3, 4)).astype(np.uint8))}
    path = tmp_path / "made.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w") as member:
                npy_format.write_array(member, array, version=version)
    read = _read_npz(path)
    for key, array in arrays.items():
        assert read[key].dtype == array.dtype and read[key].shape == array.shape
        assert np.array_equal(read[key], array), key
    objects = tmp_path / "objects.npz"
    np.savez(objects, **{**arrays, "train_images": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(DataError, match="cannot be read"):
        _read_npz(objects)
