"""FedSM: SoftPull, site shift, held-out clients, super-model routing, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import REAL_MEDMNIST
from fixtures import write_medmnist_npz
from test_bad_input import run_cli

from raysim.algorithms import ALGORITHMS
from raysim.algorithms.fedsm import soft_pull
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, PartitionConfig, SiteShiftConfig
from raysim.data import load_dataset, make_partition
from raysim.data.site_shift import apply_site_shift, site_appearance
from raysim.engine.runner import run_experiment
from raysim.errors import ConfigError
from raysim.preparation import prepare, run_context
from raysim.results import load
from raysim.results.report import _original_id, _route_label, report, selection_table


def fedsm_raw(root, **algorithm) -> dict:
    return {
        "name": "fedsm-test",
        "dataset": {"name": "retinamnist", "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": 3, "site_shift": {"strength": 1.0}},
        "model": {"name": "convnet", "width": 8, "depth": 2},
        "algorithm": {"name": "fedsm", "gamma": 0.5, "gamma_sweep": [0.0, 1.0], **algorithm},
        "training": {"rounds": 3, "batch_size": 32, "optimizer": {"name": "adam", "lr": 0.003}},
        "evaluation": {"every": 1},
        "seeds": [0],
        "engine": {"num_workers": 1, "cpus_per_worker": 1},
    }


@pytest.fixture
def retina_fixture(tmp_path):
    root = tmp_path / "data"
    write_medmnist_npz(root, "retinamnist", n_train=240, n_test=120, channels=3,
                       num_classes=5)
    return root


def test_soft_pull_spans_averaging_and_keeping():
    rng = np.random.default_rng(0)
    models = [{"w": rng.normal(size=(3, 2)).astype(np.float32),
               "n": np.array(k, dtype=np.int64)} for k in range(4)]
    total = {name: sum(m[name].astype(np.float64) for m in models) for name in models[0]}
    mean = total["w"] / 4
    for model in models:
        assert np.allclose(soft_pull(model, total, 0.25, 4)["w"], mean, atol=1e-6)  # 1/K
        assert np.array_equal(soft_pull(model, total, 1.0, 4)["w"], model["w"])
        assert soft_pull(model, total, 0.7, 4)["n"].dtype == np.int64


def test_site_shift_is_seeded_per_client_and_shared_by_train_and_test(retina_fixture):
    dataset = load_dataset(DatasetConfig(name="retinamnist", root=str(retina_fixture),
                                         verify_checksum=False))
    config = PartitionConfig(scheme="iid", num_clients=3)
    partition = make_partition(dataset.train_y, dataset.test_y, config, 5, 0)
    shift = SiteShiftConfig()
    sites = [site_appearance(shift, 0, c, 3, 28) for c in range(3)]
    assert len({s.contrast for s in sites}) == 3  # every site looks different
    assert site_appearance(shift, 0, 1, 3, 28) == sites[1]  # fixed by the seed
    assert site_appearance(shift, 1, 1, 3, 28) != sites[1]
    shifted = apply_site_shift(dataset, partition, shift, 0)
    again = apply_site_shift(dataset, partition, shift, 0)
    assert np.array_equal(shifted.train_x, again.train_x)
    assert not np.array_equal(shifted.train_x, dataset.train_x)
    assert shifted.train_x.dtype == np.uint8 and shifted.train_x.shape == dataset.train_x.shape
    # a client's train and test images share its appearance: mean brightness per site agrees
    for client in range(3):
        train_mean = shifted.train_x[partition.train[client]].mean()
        test_mean = shifted.test_x[partition.test[client]].mean()
        assert abs(train_mean - test_mean) < 6
    off = apply_site_shift(dataset, partition, SiteShiftConfig(strength=0.0, noise=0.0), 0)
    assert np.abs(off.train_x.astype(int) - dataset.train_x).max() <= 1  # strength 0: identity


def test_site_shift_rejects_tabular_data():
    dataset = load_dataset(DatasetConfig(name="breast-cancer"))
    partition = make_partition(dataset.train_y, dataset.test_y, PartitionConfig(), 2, 0)
    with pytest.raises(ConfigError, match="site_shift"):
        apply_site_shift(dataset, partition, SiteShiftConfig(), 0)


def test_holdout_client_becomes_the_unseen_set():
    labels = np.repeat(np.arange(3), 40)
    full = make_partition(labels, np.repeat(np.arange(3), 10), PartitionConfig(num_clients=4),
                          3, 0)
    held = full.hold_out(2)
    assert held.num_clients == 3
    assert np.array_equal(held.unseen, full.test[2])
    assert [len(t) for t in held.train] == [len(full.train[c]) for c in (0, 1, 3)]


def test_fedsm_routes_evaluates_and_matches_across_worker_counts(ray_session, tmp_path,
                                                                 retina_fixture):
    frames, outcome_dirs = {}, {}
    for workers in (1, 2):
        raw = fedsm_raw(retina_fixture)
        raw["engine"]["num_workers"] = workers
        outcome = run_experiment(parse_config(raw), output=str(tmp_path / f"w{workers}"),
                                 progress=False)[0]
        assert outcome.error is None, outcome.error
        outcome_dirs[workers] = outcome.run_dir
        frames[workers] = {table: load(outcome.run_dir, table)
                           for table in ("rounds", "client_eval", "selection")}
    rounds, client_eval, selection = (frames[1][t] for t in ("rounds", "client_eval",
                                                             "selection"))
    columns = ["round", "accuracy", "own_accuracy", "gm_accuracy", "pm_own_accuracy",
               "g0_accuracy", "g1_accuracy", "train_loss"]
    pd.testing.assert_frame_equal(rounds[columns], frames[2]["rounds"][columns])
    routing = ["round", "model", "source_client", "chosen", "count"]
    pd.testing.assert_frame_equal(selection[routing], frames[2]["selection"][routing])
    # gamma = 1 is the global model alone; gamma = 0 never answers with the global model
    assert np.allclose(rounds["g1_accuracy"], rounds["gm_accuracy"])
    by_model = selection.groupby(["round", "model"])["count"].sum()
    assert (by_model == 120).all()  # every test sample routed once per model and round
    g0 = selection[selection["model"] == "g0_"]
    assert (g0["chosen"] >= 0).all()
    g1 = selection[selection["model"] == "g1_"]
    assert (g1["chosen"] == -1).all()
    routes = selection_table(selection, "g0_")
    assert "GM" not in routes.columns and np.allclose(routes.filter(like="PM").sum(axis=1), 1)
    text, _ = report(outcome_dirs[1], metrics=["accuracy", "gm_accuracy", "g1_accuracy"],
                     selection="main", csv_dir=tmp_path / "csv")
    assert "gm_accuracy" in text and "selection frequencies" in text
    summary = pd.read_csv(tmp_path / "csv" / "summary.csv")  # the tables as CSV too
    assert summary["gm_accuracy_mean"].iloc[0] == pytest.approx(rounds["gm_accuracy"].iloc[-1])
    assert (tmp_path / "csv" / "selection.csv").is_file()
    per_seed = pd.read_csv(tmp_path / "csv" / "per_seed.csv")  # each run's own row
    for experiment, rows in per_seed.groupby("experiment"):
        mean = summary.set_index("experiment").loc[experiment, "accuracy_mean"]
        assert rows["accuracy"].mean() == pytest.approx(mean)
    # personalized models on their own shares: one row per client per evaluated round
    assert sorted(client_eval["client"].unique()) == [0, 1, 2]
    assert client_eval[["main_own_accuracy", "gm_own_accuracy", "pm_own_accuracy"]].notna().all().all()


def test_fedsm_extra_trains_the_selector_in_extra_rounds_only(ray_session, tmp_path,
                                                             retina_fixture):
    raw = fedsm_raw(retina_fixture, variant="extra", extra_rounds=1, gamma_sweep=[])
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is None, outcome.error
    clients = load(outcome.run_dir, "clients")
    assert clients[clients["round"] < 2]["selector_loss"].isna().all()
    assert clients[clients["round"] == 2]["selector_loss"].notna().all()
    communication = load(outcome.run_dir, "communication")
    down = communication[communication["direction"] == "down"].groupby("round")["bytes"].sum()
    # a main round ships the global model and the personalized models' sum; the extra round
    # the selector, the global model and every personalized model
    assert down[2] > 2 * down[1]
    rounds = load(outcome.run_dir)
    assert np.isclose(rounds["gm_accuracy"].iloc[1], rounds["gm_accuracy"].iloc[2])  # frozen


@pytest.mark.skipif(not (REAL_MEDMNIST / "retinamnist.npz").exists(),
                    reason="real RetinaMNIST not available")
def test_selector_recognises_sites_on_real_retinamnist(ray_session, tmp_path):
    raw = fedsm_raw(REAL_MEDMNIST, gamma_sweep=[0.0], selector_lr=0.01)
    raw["dataset"]["verify_checksum"] = True
    raw["partition"]["num_clients"] = 4
    raw["model"]["width"] = 16
    raw["training"]["rounds"] = 8
    raw["evaluation"]["every"] = 8
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is None, outcome.error
    selection = load(outcome.run_dir, "selection")
    routed = selection[(selection["model"] == "g0_") & (selection["source_client"] >= 0)]
    own = routed[routed["source_client"] == routed["chosen"]]["count"].sum()
    assert own / routed["count"].sum() > 0.5  # chance: 1/4
    manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
    assert manifest["status"] == "completed"


@pytest.mark.parametrize("change, needle", [
    ({"softpull_lambda": 0.2}, "algorithm.softpull_lambda"),
    ({"softpull_lambda": 1.5}, "algorithm.softpull_lambda"),
    ({"gamma": 1.2}, "algorithm.gamma"),
    ({"gamma_sweep": [0.5, -0.1]}, "gamma_sweep"),
    ({"variant": "extra"}, "extra_rounds"),
    ({"variant": "extra", "extra_rounds": 3}, "algorithm.extra_rounds"),
])
def test_fedsm_bad_input_exit_2(capsys, tmp_path, retina_fixture, change, needle):
    code, err = run_cli(capsys, tmp_path, fedsm_raw(retina_fixture, **change), command="run")
    assert code == 2 and needle in err and "Traceback" not in err


def test_fedsm_with_one_client_and_site_shift_on_tabular_exit_2(capsys, tmp_path,
                                                               retina_fixture):
    raw = fedsm_raw(retina_fixture)
    raw["partition"]["num_clients"] = 1
    code, err = run_cli(capsys, tmp_path, raw, command="run")
    assert code == 2 and "at least 2 clients" in err
    raw = fedsm_raw(retina_fixture, name="fedavg")
    raw["algorithm"] = {"name": "fedavg"}
    raw["dataset"] = {"name": "breast-cancer"}
    raw["model"] = {"name": "mlp"}
    code, err = run_cli(capsys, tmp_path, raw, command="run")
    assert code == 2 and "site_shift" in err


def test_a_held_out_client_is_not_sampled(retina_fixture):
    raw = fedsm_raw(retina_fixture)
    raw["partition"]["holdout_client"] = 1
    config = parse_config(raw)
    prepared = prepare(config, None)
    dataset, partition = prepared[0]
    assert partition.num_clients == 2 and partition.unseen is not None
    assert run_context(config, dataset, 0, 2).clients_per_round == 2


def test_selection_labels_use_partition_ids_with_a_held_out_client():
    assert [_route_label(c, 2) for c in (-1, 0, 1, 2, 3)] == ["GM", "PM0", "PM1", "PM3", "PM4"]
    assert [_route_label(c, None) for c in (0, 2)] == ["PM0", "PM2"]
    assert _original_id(-1, 2) == -1  # the unseen source keeps its marker


def test_validate_checks_method_settings_against_the_data(capsys, tmp_path, retina_fixture):
    code, err = run_cli(capsys, tmp_path, fedsm_raw(retina_fixture, softpull_lambda=0.2))
    assert code == 2 and "algorithm.softpull_lambda" in err and "1/K" in err
    code, _ = run_cli(capsys, tmp_path, fedsm_raw(retina_fixture))
    assert code == 0


# ----- mechanisms -----
def test_soft_pull_at_an_intermediate_lambda_mixes_own_and_the_others_mean():
    models = [{"w": np.full((2,), float(k), np.float32)} for k in range(4)]  # 0, 1, 2, 3
    total = {"w": sum(m["w"].astype(np.float64) for m in models)}
    pulled = soft_pull(models[0], total, 0.7, 4)["w"]
    np.testing.assert_allclose(pulled, 0.7 * 0 + 0.3 * (1 + 2 + 3) / 3)  # = 0.6


def test_fedsm_global_model_is_fedavg(ray_session, tmp_path, retina_fixture):
    raw = fedsm_raw(retina_fixture)
    fedsm = load(run_experiment(parse_config(raw), output=str(tmp_path / "sm"),
                                progress=False)[0].run_dir)
    raw["algorithm"] = {"name": "fedavg"}
    fedavg = load(run_experiment(parse_config(raw), output=str(tmp_path / "avg"),
                                 progress=False)[0].run_dir)
    np.testing.assert_allclose(fedsm["gm_loss"].to_numpy(), fedavg["loss"].to_numpy(),
                               rtol=1e-6)
    assert not np.allclose(fedsm["loss"].to_numpy(), fedavg["loss"].to_numpy())  # super model


def _fedsm_algorithm(root, **params):
    raw = fedsm_raw(root, **params)
    config = parse_config(raw)
    prepared = prepare(config, None)
    dataset, partition = prepared[0]
    return (ALGORITHMS["fedsm"](config.algorithm, run_context(config, dataset, 0, 3)),
            dataset, partition, config)


def test_selector_takes_one_adam_step_per_selector_epoch_and_has_its_own_architecture(
        retina_fixture):
    import torch

    from raysim.models import build_model
    from raysim.training.context import ClientData, RunContext
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import get_weights

    algorithm, dataset, partition, config = _fedsm_algorithm(
        retina_fixture, selector_epochs=3,
        selector_model={"name": "convnet", "width": 4, "depth": 1, "norm": "none"})
    torch.manual_seed(0)
    runtime = ClientRuntime(
        RunContext(0, dataset.info, config.model, config.training, len(partition.train),
                   len(partition.train)),
        ClientData(dataset.train_x, dataset.train_y, partition.train, get_weights(build_model(config.model,
                   dataset.info))),
        torch.device("cpu"))
    state = algorithm.init_server_state(runtime.initial_weights)
    assert state["selector"]["classifier.weight"].shape == (3, 4 * 14 * 14)  # its own model
    results = algorithm.local_updates(runtime, [0], 0, algorithm.broadcast(state, 0), [None])
    steps = {v.item() for k, v in results[0].upload["selector_adam"].items()
             if k.endswith(".step")}
    assert steps == {3.0}


def test_fedsm_extra_labels_each_sample_with_its_least_loss_model(retina_fixture):
    import torch

    from raysim.models import build_model
    from raysim.training.context import ClientData, RunContext
    from raysim.training.runtime import ClientRuntime
    from raysim.vectors.weights import get_weights

    algorithm, dataset, partition, config = _fedsm_algorithm(
        retina_fixture, variant="extra", extra_rounds=1)
    torch.manual_seed(0)
    weights = [get_weights(build_model(config.model, dataset.info)) for _ in range(4)]
    runtime = ClientRuntime(
        RunContext(0, dataset.info, config.model, config.training, len(partition.train),
                   len(partition.train)),
        ClientData(dataset.train_x, dataset.train_y, partition.train, weights[0]),
        torch.device("cpu"))
    seen = []
    original = algorithm._train_selector
    algorithm._train_selector = lambda rt, x, message, labels: (  # capture the labels
        seen.append(labels) or original(rt, x, message, labels))
    state = algorithm.init_server_state(weights[0])
    state["global"], state["personal"] = weights[0], weights[1:]
    algorithm.local_updates(runtime, [1], 2, algorithm.broadcast(state, 2), [None])
    x, y = runtime.client_data(1)
    losses = []
    for w in weights:
        model = build_model(config.model, dataset.info)
        from raysim.vectors.weights import set_weights
        set_weights(model, w)
        model.eval()
        with torch.no_grad():
            losses.append(torch.nn.functional.cross_entropy(model(x), y, reduction="none"))
    expected = torch.stack(losses).argmin(0).numpy()
    np.testing.assert_array_equal(seen[0], expected)
    assert len(set(expected.tolist())) > 1  # the labels are not all one model


# ----- SoftPull at both ends (switched off, these must fail) -----
def _fedsm(retina_fixture, lam: float = 0.5):
    raw = fedsm_raw(retina_fixture, softpull_lambda=lam, variant="fedsm")
    config = parse_config(raw)
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    return ALGORITHMS["fedsm"](config.algorithm, context), context


def _personal(k: int, value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((3,), value, np.float32), "b": np.array([k], np.int64)}


class _StartSpy:
    """A runtime that records the starting weights of every train_many call and returns them
    unchanged (no training), with the attributes FedSM's client code reads."""

    def __init__(self, initial):
        self.initial_weights = initial
        self.starts: list[list] = []

    def train_many(self, clients, round_, weights, optimizer_states, **_):
        from raysim.training.runtime import TrainOutcome

        self.starts.append(list(weights))
        return [(w, TrainOutcome(0.0, 4, 1, {})) for w in weights]


def test_clients_start_their_personal_training_from_the_soft_pulled_model(retina_fixture):
    """The client side of SoftPull: a client with a personalized model trains it from
    lambda * own + (1 - lambda) * mean of the others' (the broadcast sum minus its own)."""
    algorithm, context = _fedsm(retina_fixture, lam=0.5)
    k = context.num_clients
    own = [_personal(c, float(c)) for c in range(k)]
    total = {"w": sum(m["w"].astype(np.float64) for m in own),
             "b": sum(m["b"].astype(np.float64) for m in own)}
    spy = _StartSpy(own[0])
    message = {"model": own[0], "personal_sum": total}
    algorithm.local_updates(spy, [0], 1, message, [(own[0], None)])
    personal_start = spy.starts[1][0]
    others_mean = sum(float(c) for c in range(1, k)) / (k - 1)
    np.testing.assert_allclose(personal_start["w"], 0.5 * 0.0 + 0.5 * others_mean, rtol=1e-6)
    assert not np.array_equal(personal_start["w"], own[0]["w"])


def test_the_server_pulls_the_personalized_models_it_evaluates(retina_fixture):
    """The server side of SoftPull: the personalized models the server keeps (and evaluates
    as ``pm_`` and inside the super model) are the soft-pulled uploads, not the raw ones."""
    algorithm, context = _fedsm(retina_fixture, lam=0.5)
    k = context.num_clients
    uploads = {c: _personal(c, float(c)) for c in range(k)}
    state = algorithm.init_server_state(uploads[0])
    state = algorithm.aggregate(state, [{"personal": uploads}], 0)
    total = sum(float(c) for c in range(k))
    for c in range(k):
        expected = 0.5 * c + 0.5 * (total - c) / (k - 1)
        np.testing.assert_allclose(state["personal"][c]["w"], expected, rtol=1e-6)
    evaluated = algorithm.evaluation_models(state)["pm_"]["personal"]
    assert not np.array_equal(evaluated[k - 1]["w"], uploads[k - 1]["w"])


def test_the_selectors_adam_moments_travel_from_round_to_round(data_root):
    """The selector's Adam state is averaged by the server and broadcast, so every round's
    selector steps continue the last round's moments: after three rounds of two selector
    epochs each, the mean moments have taken six steps (two, were they dropped between
    rounds)."""
    from algorithm_configs import contract_raw
    from inprocess import simulate

    raw = contract_raw(data_root, "fedsm")
    raw["algorithm"] = {**raw["algorithm"], "selector_epochs": 2}
    trace = simulate(parse_config(raw))
    moments = trace.server_state["selector_adam"]
    assert moments is not None
    steps = {float(np.asarray(v)) for k, v in moments.items() if k.endswith(".step")}
    assert steps == {6.0}
