"""Per-client validation splits and best-checkpoint reporting (``evaluation.validation``,
``raysim report --checkpoint best``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import quickstart_raw

from raysim.configuration.experiment import parse_config
from raysim.data.partition import Partition
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError, RaysimError
from raysim.preparation import prepare
from raysim.results import load
from raysim.results.report import final_metrics, summary_table


def _partition() -> Partition:
    train = [np.arange(0, 10), np.arange(10, 13), np.arange(13, 14), np.arange(14, 34)]
    return Partition(train, [np.arange(2)] * 4)


def test_validation_split_holds_out_a_disjoint_seeded_share_of_every_client():
    split = _partition().split_validation(0.2, seed=3)
    assert split.validation is not None
    assert [len(v) for v in split.validation] == [2, 1, 0, 4]  # round(0.2 n), >= 1, keeps one
    assert [len(t) for t in split.train] == [8, 2, 1, 16]
    for before, train, held in zip(_partition().train, split.train, split.validation,
                                   strict=True):
        assert not np.intersect1d(train, held).size
        np.testing.assert_array_equal(np.sort(np.concatenate([train, held])), before)
    again = _partition().split_validation(0.2, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(split.validation, again.validation,
                                                    strict=True))
    other = _partition().split_validation(0.2, seed=4)
    assert not np.array_equal(split.validation[3], other.validation[3])
    index, sources = split.validation_sources()
    np.testing.assert_array_equal(sources, [0, 0, 1, 3, 3, 3, 3])
    np.testing.assert_array_equal(index, np.concatenate(split.validation))
    held_out = split.hold_out(1)  # a held-out client's validation share leaves with it
    assert held_out.validation is not None and [len(v) for v in held_out.validation] == [2, 0, 4]


def test_a_validation_split_no_client_can_spare_is_a_config_error():
    raw = quickstart_raw(partition={"scheme": "iid", "num_clients": 10, "samples_per_client": 1},
                         evaluation={"validation": 0.3})
    with pytest.raises(ConfigError, match=r"evaluation\.validation"):
        prepare(parse_config(raw), None)


def test_validation_samples_are_never_trained_on_and_every_model_is_scored_on_them(
        ray_session, tmp_path):
    evaluation = {"validation": 0.2, "every": 1}
    fedavg = run_experiment(parse_config(quickstart_raw(evaluation=evaluation,
                                                        training={"rounds": 3})),
                            output=str(tmp_path / "fedavg"), progress=False)[0]
    assert fedavg.error is None
    stored = pd.read_parquet(fedavg.run_dir / "partition.parquet")
    train = stored[stored["split"] == "train"]
    held = stored[stored["split"] == "validation"]
    expected = [max(1, round(0.2 * n)) for n in train.groupby("client").size()
                + held.groupby("client").size()]
    assert held.groupby("client").size().tolist() == expected and len(train) == 455 - len(held)
    assert not set(train["index"]) & set(held["index"])
    clients = load(fedavg.run_dir, "clients")
    assert clients.groupby("round")["num_samples"].sum().tolist() == [len(train)] * 3
    rounds = load(fedavg.run_dir)
    assert rounds["val_accuracy"].between(0.5, 1).all() and rounds["val_auc"].notna().all()

    full = run_experiment(parse_config(quickstart_raw(
        evaluation=evaluation, training={"rounds": 1},
        algorithm={"name": "centralized", "data": "full"})),
        output=str(tmp_path / "central"), progress=False)[0]
    assert full.error is None  # the whole training split less the validation samples
    assert int(load(full.run_dir, "clients")["num_samples"].iloc[0]) == len(train)

    local = run_experiment(parse_config(quickstart_raw(
        evaluation=evaluation, training={"rounds": 2}, algorithm={"name": "local"})),
        output=str(tmp_path / "local"), progress=False)[0]
    assert local.error is None  # personal models: each on its own validation share
    evals = load(local.run_dir, "client_eval")
    last = evals[evals["round"] == 1]
    assert last["val_accuracy"].notna().all()
    local_rounds = load(local.run_dir)
    assert local_rounds["val_accuracy"].iloc[-1] == pytest.approx(last["val_accuracy"].mean())
    assert local_rounds["personal_val_accuracy"].iloc[-1] == pytest.approx(
        last["val_accuracy"].mean())
    # and each on the pooled validation set, as its test accuracy is on the global test set
    assert last["pooled_val_accuracy"].notna().all()
    assert local_rounds["pooled_val_accuracy"].iloc[-1] == pytest.approx(
        last["pooled_val_accuracy"].mean())
    assert not np.allclose(last["pooled_val_accuracy"], last["val_accuracy"])


def _rounds() -> pd.DataFrame:
    """Two seeds of one run whose validation accuracy peaks before the last round."""
    rows = []
    for seed, best in ((0, 2), (1, 1)):
        for round_ in range(5):
            rows.append({"experiment": "e", "algorithm": "fedavg", "seed": seed,
                         "run": f"r{seed}", "status": "completed", "round": round_,
                         "accuracy": 0.5 + 0.1 * round_ * (seed + 1),
                         "val_accuracy": 0.9 - 0.1 * abs(round_ - best)})
    return pd.DataFrame(rows)


def test_best_checkpoint_reports_each_run_at_its_best_validation_round():
    best = final_metrics(_rounds(), "best")
    assert best["round"].tolist() == [2, 1]
    assert best["accuracy"].tolist() == pytest.approx([0.7, 0.7])
    last = final_metrics(_rounds(), "last")
    assert last["round"].tolist() == [4, 4]
    table = summary_table(_rounds(), ["accuracy"], checkpoint="best")
    assert table["accuracy_mean"].iloc[0] == pytest.approx(0.7)
    with pytest.raises(RaysimError, match=r"evaluation\.validation"):
        final_metrics(_rounds().drop(columns="val_accuracy"), "best")
