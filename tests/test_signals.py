"""Signals: a folder of recordings as a dataset, whole subjects per split and per client, the
sequence models, and the methods that run on them (MH-pFLID with its 1D messenger, the
public-set baselines on a public subject, FedAvg and its kin with DP and the clock)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import write_recordings
from inprocess import simulate
from test_bad_input import run_cli

from raysim.algorithms.public_set import public_indices
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, PartitionConfig
from raysim.data import load_dataset, make_partition
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.models.params import RNNParams, SignalTransformerParams, TCNParams
from raysim.preparation import prepare
from raysim.training.vectorized import LOOP, choose_path

SIGNAL_MODELS = [{"name": "tcn", "channels": 8, "levels": 2},
                 {"name": "signal_transformer", "width": 8, "heads": 2, "layers": 1,
                  "patch": 10, "feedforward": 16},
                 {"name": "rnn", "hidden": 8}]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> Path:
    """Seven subjects x two nights of generated 1-s recordings (with a pickled header)."""
    return write_recordings(tmp_path_factory.mktemp("sleep") / "recordings", subjects=7)


def signal_raw(folder: Path, **sections) -> dict:
    raw = {"name": "signals", "dataset": {"name": "gen-sleep", "path": str(folder),
                                          "test_subjects": 3, "public_subjects": 1},
           "partition": {"scheme": "subjects", "num_clients": 3},
           "model": SIGNAL_MODELS[0],
           "algorithm": {"name": "fedavg"},
           "training": {"rounds": 2, "batch_size": 16,
                        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}},
           "seeds": [0]}
    raw.update(sections)
    return raw


def test_recordings_load_as_standardised_signals_with_whole_subjects_per_split(recordings):
    dataset = load_dataset(DatasetConfig(name="gen", path=str(recordings), test_subjects=2,
                                         public_subjects=1))
    info = dataset.info
    assert (info.kind, info.input_shape, info.num_classes, info.sampling_rate) == (
        "signal", (1, 100), 5, 100.0)
    assert dataset.train_x.dtype == np.float32 and dataset.train_x.shape[1:] == (1, 100)
    # standardised with the training split's own moments only
    assert abs(float(dataset.train_x.mean())) < 1e-4
    assert abs(float(dataset.train_x.std()) - 1) < 1e-3
    assert abs(float(dataset.test_x.mean())) > 1e-6 or abs(float(dataset.test_x.std()) - 1) > 1e-6
    assert dataset.test_groups is not None and dataset.train_groups is not None
    assert len(set(dataset.test_groups)) == 2 and len(set(dataset.train_groups)) == 4
    assert not set(dataset.test_groups) & set(dataset.train_groups)
    assert dataset.public_x is not None and len(dataset.public_x) == 80  # one subject, 2 nights
    assert len(dataset.train_y) + len(dataset.test_y) + len(dataset.public_x) == 7 * 2 * 40


def test_subjects_scheme_deals_whole_subjects_and_holds_out_validation_subjects(recordings):
    dataset = load_dataset(DatasetConfig(name="gen", path=str(recordings), test_subjects=3))
    config = PartitionConfig(scheme="subjects", num_clients=2)
    partition = make_partition(dataset.train_y, dataset.test_y, config, 5, 0,
                               dataset.train_groups, dataset.test_groups)
    train_subjects = [set(dataset.train_groups[share]) for share in partition.train]
    test_subjects = [set(dataset.test_groups[share]) for share in partition.test]
    assert not train_subjects[0] & train_subjects[1] and not test_subjects[0] & test_subjects[1]
    assert sorted(len(s) for s in train_subjects) == [2, 2]
    assert sum(len(share) for share in partition.train) == len(dataset.train_y)
    split = partition.split_validation(0.5, 0, dataset.train_groups)
    for kept, held in zip(split.train, split.validation or [], strict=True):
        assert len(held) and not set(dataset.train_groups[kept]) & set(dataset.train_groups[held])
    skewed = make_partition(dataset.train_y, dataset.test_y,
                            PartitionConfig(scheme="subjects", num_clients=2, label_skew=0.5),
                            5, 0, dataset.train_groups, dataset.test_groups)
    assert sum(len(s) for s in skewed.train) < len(dataset.train_y)
    mixes = [np.bincount(dataset.train_y[s], minlength=5) / len(s) for s in skewed.train]
    assert np.abs(mixes[0] - mixes[1]).sum() > 0.2  # the clients' class mixes differ


@pytest.mark.parametrize("params", [TCNParams(channels=8, levels=2),
                                    SignalTransformerParams(width=8, heads=2, layers=1, patch=7),
                                    RNNParams(hidden=8, cell="lstm")])
def test_sequence_models_split_into_a_body_map_and_a_head(params):
    from raysim.data.dataset import DataInfo

    info = DataInfo("s", "signal", 5, (2, 100), sampling_rate=100.0)
    model = build_model(params, info)
    x = torch.randn(3, 2, 100)
    features = model.body(x)
    assert features.ndim == 3 and features.shape[:2] == (3, model.feature_channels)
    assert model(x).shape == (3, 5)
    path, reason = choose_path(model, type("O", (), {"name": "sgd"})(), torch.device("cpu"), "auto")
    assert path == LOOP and reason  # dropout, recurrence or convolutions: said why


def test_the_transformer_is_counted_through_its_encoder_layers():
    from raysim.data.dataset import DataInfo
    from raysim.models.costs import forward_flops

    info = DataInfo("s", "signal", 5, (1, 100), sampling_rate=100.0)
    params = SignalTransformerParams(width=16, heads=2, layers=2, patch=10, feedforward=32)
    model = build_model(params, info)
    # each of the 10 tokens passes each layer's four 16x16 projections and its 16-32-16 MLP
    per_token_layer = 2 * (4 * 16 * 16 + 2 * 16 * 32)
    assert forward_flops(model, (1, 100)) >= 10 * 2 * per_token_layer
    assert torch.backends.mha.get_fastpath_enabled()  # restored after the count


def test_models_and_methods_refuse_the_wrong_kind_of_data(capsys, tmp_path, recordings):
    tabular = {**signal_raw(recordings), "dataset": {"name": "breast-cancer"},
               "partition": {"num_clients": 3}}
    for raw, needles in [
            (signal_raw(recordings, model={"name": "convnet"}), ("holds signals", "tcn")),
            (signal_raw(recordings, algorithm={"name": "fedvck"}, model={"name": "tcn"}),
             ("works on images only",)),
            (tabular, ("model for signals",))]:
        code, err = run_cli(capsys, tmp_path, raw)
        assert code == 2 and all(n in err for n in needles) and err.count("\n") == 1, err


def _write_bad(folder: Path, name: str, **arrays) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    np.savez(folder / name, **arrays)


@pytest.mark.parametrize("case, needle", [
    ("no_y", "has no `y`"), ("length", "the recordings differ"),
    ("channel", "the recordings differ"),
    ("label", "outside the 5 classes"), ("too_few_subjects", "at least one must be left")])
def test_bad_recordings_are_one_paragraph(tmp_path, case, needle):
    folder = tmp_path / "bad"
    write_recordings(folder, subjects=3, nights=1, epochs=10, header=False)
    x = np.zeros((10, 100, 1), np.float32)
    if case == "no_y":
        _write_bad(folder, "SC4091E0.npz", x=x)
    elif case == "length":
        _write_bad(folder, "SC4091E0.npz", x=np.zeros((10, 50, 1), np.float32),
                   y=np.zeros(10, np.int32), fs=np.float64(100.0))
    elif case == "channel":
        _write_bad(folder, "SC4091E0.npz", x=x, y=np.zeros(10, np.int32), fs=np.float64(100.0),
                   ch_label=np.str_("EEG Pz-Oz"))
    elif case == "label":
        _write_bad(folder, "SC4091E0.npz", x=x, y=np.full(10, 7, np.int32), fs=np.float64(100.0))
    config = DatasetConfig(name="bad", path=str(folder),
                           test_subjects=3 if case == "too_few_subjects" else 1,
                           num_classes=5 if case == "label" else None)
    with pytest.raises(ConfigError, match=needle) as raised:
        load_dataset(config)
    assert "\n" not in str(raised.value)


def test_public_set_comes_from_subjects_no_client_holds(recordings):
    config = parse_config(signal_raw(recordings, algorithm={"name": "fedmd",
                                                            "public_per_client": 10}))
    dataset, partition = prepare(config, None)[0]
    assert dataset.public_from is not None
    held = np.concatenate(partition.train)
    assert held.max() < dataset.public_from <= len(dataset.train_y) - 30
    rows = public_indices(partition.train, 10, 0, (dataset.public_from, len(dataset.train_y)))
    assert len(rows) == 30 and rows.min() >= dataset.public_from
    trace = simulate(config)
    assert np.isfinite([m["train_loss"] for m in trace.metrics[-1].values()]).all()


def test_mhpflid_runs_heterogeneous_sequence_models_with_a_1d_messenger(recordings):
    config = parse_config(signal_raw(
        recordings, clients={"architectures": SIGNAL_MODELS},
        algorithm={"name": "mhpflid", "messenger_widths": [4, 4, 8], "messenger_hidden": 8},
        training={"rounds": 2, "batch_size": 16}))
    trace = simulate(config)
    messenger = trace.algorithm.build_messenger()
    assert isinstance(messenger.body[0], torch.nn.Conv1d)
    last = trace.metrics[-1]
    assert len(last) == 3 and all(m["messenger_change"] > 0 for m in last.values())


@pytest.mark.parametrize("algorithm, extra", [
    ({"name": "fedprox", "mu": 0.01}, {}),
    ({"name": "scaffold"}, {}),
    ({"name": "ditto", "lam": 0.1}, {}),
    ({"name": "fedavg"}, {"privacy": {"noise_multiplier": 0.5, "clip": 1.0}}),
    ({"name": "fedavg"}, {"system": {"tiers": {"cpu_server": 0.5, "constrained_site": 0.5},
                                     "policy": "deadline", "deadline_s": 60.0}}),
])
def test_shared_model_methods_and_layers_train_a_signal_model(recordings, algorithm, extra):
    raw = signal_raw(recordings, algorithm=algorithm, model=SIGNAL_MODELS[1], **extra)
    trace = simulate(parse_config(raw))
    losses = [m["train_loss"] for m in trace.metrics[-1].values()]
    assert losses and np.isfinite(losses).all()
