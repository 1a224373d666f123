"""FedDC: schedule, permutations across workers, aggregation operators, DP, vectorised clients."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import quickstart_raw
from test_bad_input import run_cli

from raysim.algorithms.robust_means import coordinate_median, iterated_radon_point, radon_point
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, OptimizerConfig, TrainingConfig
from raysim.data import load_dataset
from raysim.engine.runner import run_experiment
from raysim.models import MODELS, build_model
from raysim.results import load
from raysim.training.context import ClientData, RunContext
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import get_weights


def feddc_raw(**algorithm):
    raw = quickstart_raw(
        partition={"scheme": "iid", "num_clients": 40, "samples_per_client": 4},
        training={"rounds": 12, "local_steps": 1, "local_epochs": None, "batch_size": 4,
                  "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.0}},
        evaluation={"every": 4},
        algorithm={"name": "feddc", "daisy_period": 1, "aggregation_period": 4, **algorithm},
    )
    raw["model"] = {"name": "mlp", "hidden": [16]}
    return raw


def run(raw, tmp_path):
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is None, outcome.error
    return outcome.run_dir


def test_radon_point_of_a_square_is_its_centre():
    square = np.array([[0.0, 0.0], [2.0, 0.0], [2.0, 2.0], [0.0, 2.0]])
    np.testing.assert_allclose(radon_point(square), [1.0, 1.0], atol=1e-9)


def test_iterated_radon_point_uses_r_to_the_h_models_and_is_central():
    rng = np.random.default_rng(0)
    models = [{"w": rng.normal(size=(2,)).astype(np.float32) + 5} for _ in range(17)]  # r=4, h=2
    point = iterated_radon_point(models)["w"]
    assert np.abs(point - 5).max() < 1.5
    with pytest.raises(ValueError):
        iterated_radon_point(models[:3])


def test_coordinate_median():
    models = [{"w": np.array([v, -v], np.float32)} for v in (1.0, 5.0, 2.0)]
    np.testing.assert_array_equal(coordinate_median(models)["w"], [2.0, -2.0])


def test_privatize_clips_updates_and_adds_sigma_times_s_noise():
    from raysim.privacy.mechanism import privatize

    cpu = torch.device("cpu")
    reference = {"w": np.zeros(200_000, np.float32)}
    model = {"w": np.full(200_000, 0.1, np.float32)}
    clipped, _ = privatize(model, reference, 1.0, 0.0, 0, 0, 0, cpu)
    assert np.linalg.norm(clipped["w"].astype(np.float64)) == pytest.approx(1.0, rel=1e-5)
    sigma, clip = 0.5, 2.0  # FedDC's algorithm.dp: noise std sigma * S, not sigma^2 * S^2
    noisy, _ = privatize(reference, reference, clip, sigma * clip, 0, 0, 0, cpu)
    assert noisy["w"].std() == pytest.approx(1.0, rel=0.01)


def _loop_and_vectorized(seed, dataset, params, training, indices, start):
    """Two CPU runtimes of one run's clients: the per-client loop and the vectorised path."""
    def runtime(mode):
        return ClientRuntime(
            RunContext(seed, dataset.info, params, training, len(indices), len(indices)),
            ClientData(dataset.train_x, dataset.train_y, indices, start),
            torch.device("cpu"), vectorize=mode)

    loop, vectorized = runtime("never"), runtime("always")
    assert (loop.path, vectorized.path) == ("loop", "vectorized")
    return loop, vectorized


@pytest.mark.parametrize("model_name, options", [("mlp", {"hidden": (16,)}),
                                                 ("convnet", {"width": 4, "depth": 2}),
                                                 ("cnn", {"channels": (4, 8), "hidden": 16})])
def test_vectorized_clients_match_one_by_one_training(model_name, options):
    dataset = load_dataset(DatasetConfig(name="digits"))
    params = MODELS[model_name].params(**options)
    model = build_model(params, dataset.info)
    clients = list(range(6))
    indices = [np.arange(c * 10, c * 10 + 10) for c in clients]
    training = TrainingConfig(local_steps=4, batch_size=4,
                              optimizer=OptimizerConfig(lr=0.05, momentum=0.9,
                                                        weight_decay=1e-3))
    start = get_weights(model)
    loop, vectorized = _loop_and_vectorized(3, dataset, params, training, indices, start)
    prox = (start, 0.1)
    one = loop.train_many(clients, 2, [start] * 6, [None] * 6, prox=prox)
    many = vectorized.train_many(clients, 2, [start] * 6, [None] * 6, prox=prox)
    for (w_loop, o_loop), (w_vec, o_vec) in zip(one, many, strict=True):
        assert o_loop.mean_loss == pytest.approx(o_vec.mean_loss, rel=1e-4)
        for name in w_loop:
            np.testing.assert_allclose(w_loop[name], w_vec[name], rtol=1e-4, atol=1e-5)
    # a second round continues the per-client momentum in both paths
    again_loop = loop.train_many(clients, 3, [w for w, _ in one], [o.optimizer_state for _, o in one])
    again_vec = vectorized.train_many(clients, 3, [w for w, _ in many],
                                      [o.optimizer_state for _, o in many])
    for (w_loop, _), (w_vec, _) in zip(again_loop, again_vec, strict=True):
        for name in w_loop:
            np.testing.assert_allclose(w_loop[name], w_vec[name], rtol=1e-4, atol=1e-5)


def test_batchnorm_clients_train_together_with_their_own_running_statistics():
    """``engine.vectorize: always`` batches BatchNorm clients: each client's running mean and
    variance (rows of the batched matrix, updated in place by the batched forward) and batch
    counter (stacked beside it) end as the per-client loop leaves them, and so do the
    weights, over two rounds from different starts (as FedDC's permuted models)."""
    from raysim.training.vectorized import choose_path

    dataset = load_dataset(DatasetConfig(name="digits"))
    params = MODELS["convnet"].params(width=4, depth=2, norm="batch")
    model = build_model(params, dataset.info)
    clients = list(range(4))
    indices = [np.arange(c * 12, c * 12 + 12) for c in clients]
    training = TrainingConfig(local_steps=3, batch_size=4,
                              optimizer=OptimizerConfig(lr=0.05, momentum=0.5))
    start = get_weights(model)
    sgd = training.optimizer
    assert choose_path(model, sgd, torch.device("cpu"), "auto")[0] == "loop"
    assert choose_path(model, sgd, torch.device("cuda"), "auto")[0] == "vectorized"
    assert choose_path(model, sgd, torch.device("cuda"), "never")[0] == "loop"

    loop, vectorized = _loop_and_vectorized(5, dataset, params, training, indices, start)
    one = loop.train_many(clients, 1, [start] * 4, [None] * 4)
    many = vectorized.train_many(clients, 1, [start] * 4, [None] * 4)
    swapped = [1, 0, 3, 2]  # each client continues another's model, as after a permutation
    one = loop.train_many(clients, 2, [one[i][0] for i in swapped],
                          [one[i][1].optimizer_state for i in swapped])
    many = vectorized.train_many(clients, 2, [many[i][0] for i in swapped],
                                 [many[i][1].optimizer_state for i in swapped])
    statistics = [n for n, _ in model.named_buffers()]
    assert any(n.endswith("running_var") for n in statistics)
    for (w_loop, o_loop), (w_vec, o_vec) in zip(one, many, strict=True):
        assert o_loop.mean_loss == pytest.approx(o_vec.mean_loss, rel=1e-4)
        for name in w_loop:
            assert np.asarray(w_vec[name]).dtype == np.asarray(w_loop[name]).dtype, name
            np.testing.assert_allclose(w_loop[name], w_vec[name], rtol=1e-4, atol=1e-5,
                                       err_msg=name)
        for name in statistics:  # moved off their start: the statistics were trained
            assert not np.array_equal(np.asarray(w_vec[name]), np.asarray(start[name])), name
        assert int(np.asarray(w_vec[statistics[-1]])) == 6  # two rounds of three steps


def test_auto_path_vectorizes_mlp_but_not_convnet_on_cpu():
    dataset = load_dataset(DatasetConfig(name="digits"))
    for name, expected in (("mlp", "vectorized"), ("convnet", "loop")):
        params = MODELS[name].params()
        runtime = ClientRuntime(
        RunContext(0, dataset.info, params, TrainingConfig(), 0, 0),
        ClientData(dataset.train_x, dataset.train_y, [], get_weights(build_model(params, dataset.info))),
        torch.device("cpu"))
        assert runtime.path == expected


def test_feddc_permutations_across_workers_give_identical_results(ray_session, tmp_path):
    frames = []
    for workers in (1, 2):
        raw = {**feddc_raw(permutation="derangement"),
               "engine": {"num_workers": workers, "cpus_per_worker": 1, "client_groups": 8}}
        run_dir = run(raw, tmp_path / f"w{workers}")
        frames.append((load(run_dir), load(run_dir, "client_eval"), run_dir))
    (r1, e1, _), (r2, e2, d2) = frames
    columns = ["accuracy", "loss", "train_loss", "personal_accuracy", "bytes_up", "bytes_down"]
    np.testing.assert_array_equal(r1[columns].to_numpy(), r2[columns].to_numpy())
    np.testing.assert_array_equal(e1["global_loss"].to_numpy(), e2["global_loss"].to_numpy())
    manifest = json.loads((d2 / "manifest.json").read_text())
    assert [w["training_path"] for w in manifest["workers"]] == ["vectorized"] * 2


def test_feddc_bytes_count_every_model_up_and_down(ray_session, tmp_path):
    rounds = load(run(feddc_raw(), tmp_path))
    model_bytes = (30 * 16 + 16 + 16 * 2 + 2) * 4
    per_round = 40 * model_bytes
    daisy = rounds[rounds["round"] % 4 != 3]
    aggregation = rounds[rounds["round"] % 4 == 3]
    assert (daisy["bytes_up"] == per_round).all()
    assert (aggregation["bytes_up"] == per_round).all()
    after_aggregation = rounds[rounds["round"] % 4 == 0].iloc[1:]
    assert (after_aggregation["bytes_down"] == 2 * per_round).all()  # aggregate + relayed models
    communication = load(rounds["run"].iloc[0], "communication")
    assert set(communication["message_type"]) == {"daisy_chain", "model"}


def test_daisy_chaining_alone_differs_from_fedavg_and_both_learn(ray_session, tmp_path):
    fedavg = load(run(feddc_raw(daisy_period=None, aggregation_period=1), tmp_path / "a"))
    feddc = load(run(feddc_raw(), tmp_path / "b"))
    assert fedavg["accuracy"].iloc[-1] > 0.8 and feddc["accuracy"].iloc[-1] > 0.8
    assert not np.allclose(fedavg["loss"].dropna(), feddc["loss"].dropna())


BAD = [
    ({"daisy_period": 0}, "algorithm.daisy_period"),
    ({"aggregation_period": -2}, "algorithm.aggregation_period"),
    ({"dp": {"clip": 1.0, "sigma": -0.1}}, "algorithm.dp.sigma"),
    ({"dp": {"clip": 0.0, "sigma": 1.0}}, "algorithm.dp.clip"),
]


@pytest.mark.parametrize("options, needle", BAD, ids=[b[1] for b in BAD])
def test_bad_feddc_fields(capsys, tmp_path, options, needle):
    code, err = run_cli(capsys, tmp_path, feddc_raw(**options))
    assert code == 2 and needle in err and "Traceback" not in err


def test_radon_with_too_few_clients_and_derangement_of_one_client(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, feddc_raw(aggregator="radon"), "--no-progress",
                        command="run")
    assert code == 2 and "Radon point needs at least" in err
    raw = feddc_raw(permutation="derangement")
    raw["partition"] = {"scheme": "iid", "num_clients": 1}
    code, err = run_cli(capsys, tmp_path, raw, "--no-progress", command="run")
    assert code == 2 and "derangement" in err


def test_variants_expand_into_labelled_configs(tmp_path, capsys):
    import yaml

    from raysim.configuration.experiment import load_experiments

    raw = feddc_raw()
    raw["variants"] = {"feddc": {}, "fedavg_b1": {"algorithm.daisy_period": None,
                                                  "algorithm.aggregation_period": 1},
                       "central": {"algorithm": {"name": "centralized"}}}
    path = tmp_path / "v.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    experiments = load_experiments(path, ["training.rounds=7"])
    assert list(experiments) == ["feddc", "fedavg_b1", "central"]
    assert experiments["fedavg_b1"].algorithm.daisy_period is None
    assert experiments["fedavg_b1"].algorithm.aggregation_period == 1
    assert experiments["central"].algorithm.name == "centralized"
    assert all(e.training.rounds == 7 for e in experiments.values())
    raw["variants"]["broken"] = {"algorithm.daisy_period": 0}
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and "variant `broken`" in err and "algorithm.daisy_period" in err


def test_variants_run_together_and_report_per_variant(ray_session, tmp_path):
    from raysim.engine.runner import run_experiments
    from raysim.results.report import summary_table

    base = parse_config(feddc_raw())
    fedavg = parse_config({**feddc_raw(daisy_period=None, aggregation_period=1)})
    outcomes = run_experiments({"feddc": base, "fedavg_b1": fedavg}, output=str(tmp_path),
                               progress=False)
    assert sorted(o.run_dir.parent.name for o in outcomes) == ["fedavg_b1", "feddc"]
    table = summary_table(load(outcomes[0].run_dir.parents[1]))
    assert table["experiment"].tolist() == ["feddc", "fedavg_b1"]  # the config's order


# ----- mechanisms -----
def test_radon_point_is_not_the_mean_and_lies_in_both_hulls_of_its_partition():
    # a triangle and a point inside it: the Radon partition is {inside} vs {triangle}, so the
    # Radon point is the inside point itself, while the mean is pulled towards the corners
    points = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0], [1.0, 0.5]])
    point = radon_point(points)
    np.testing.assert_allclose(point, [1.0, 0.5], atol=1e-9)
    assert np.abs(point - points.mean(0)).max() > 0.2
    skew = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 1.0], [10.0, 1.0]])  # crossing diagonals
    np.testing.assert_allclose(radon_point(skew), [5.0, 0.5], atol=1e-9)


def test_iterated_radon_point_uses_exactly_the_first_r_to_the_h_models():
    rng = np.random.default_rng(1)
    models = [{"w": rng.normal(size=(2,)).astype(np.float32)} for _ in range(17)]  # r=4, h=2
    point = iterated_radon_point(models)["w"]
    outlier = [*models[:16], {"w": np.array([1e6, -1e6], np.float32)}]
    np.testing.assert_array_equal(iterated_radon_point(outlier)["w"], point)  # 17th unused
    moved = [{"w": models[0]["w"] + 3.0}, *models[1:]]
    assert not np.allclose(iterated_radon_point(moved)["w"], point)  # the first ones count
    groups = np.stack([m["w"] for m in models[:16]]).astype(np.float64).reshape(4, 4, 2)
    two_level = radon_point(np.stack([radon_point(g) for g in groups]))
    np.testing.assert_allclose(point, two_level, rtol=1e-5, atol=1e-5)


def _feddc(context_clients: int = 4, **params):
    from raysim.algorithms.base import RunContext
    from raysim.algorithms.feddc import FedDC, FedDCParams

    dataset = load_dataset(DatasetConfig(name="digits"))
    model = MODELS["mlp"].params(hidden=(8,))
    training = TrainingConfig(local_steps=2, batch_size=4,
                              optimizer=OptimizerConfig(lr=0.05, momentum=0.0))
    context = RunContext(0, dataset.info, model, training, context_clients, context_clients)
    return FedDC(FedDCParams(**params), context), dataset, model, training


def test_aggregation_takes_precedence_over_daisy_chaining_in_the_same_round():
    algorithm, *_ = _feddc(daisy_period=2, aggregation_period=4)
    assert [algorithm.daisy_chains_in(r) for r in range(8)] == [False, True, False, False] * 2
    assert [algorithm.aggregates_in(r) for r in range(8)] == [False, False, False, True] * 2
    assert algorithm.migration(3) is None and algorithm.migration(1) is not None
    permutation = algorithm.migration(1)
    assert sorted(permutation.tolist()) == [0, 1, 2, 3]


def test_the_start_schedule_acts_in_the_first_round_of_each_period_as_the_authors_code():
    """The authors' loop aggregates when t % b == 0 counting from t = 0: after the first
    round, then every b rounds; `schedule: end` (the default) after every b rounds."""
    start, *_ = _feddc(daisy_period=2, aggregation_period=4, schedule="start")
    assert [start.aggregates_in(r) for r in range(9)] == [True, False, False, False] * 2 + [True]
    assert [start.daisy_chains_in(r) for r in range(8)] == [False, False, True, False] * 2
    end, *_ = _feddc(daisy_period=2, aggregation_period=4)
    assert [end.aggregates_in(r) for r in range(8)] == [False, False, False, True] * 2


def test_proximal_anchor_lives_in_client_state_and_survives_a_new_algorithm_object():
    algorithm, dataset, model, training = _feddc(daisy_period=None, aggregation_period=2,
                                                 mu=0.5)
    torch.manual_seed(0)
    start = get_weights(build_model(model, dataset.info))
    runtime = ClientRuntime(
        RunContext(0, dataset.info, model, training, 4, 4),
        ClientData(dataset.train_x, dataset.train_y, [np.arange(c * 8, c * 8 + 8) for c in range(4)], start),
        torch.device("cpu"), vectorize="never")
    aggregate = {k: v * 0.5 for k, v in start.items()}  # an aggregate the clients received
    first = algorithm.local_updates(runtime, [0, 1, 2, 3], 2, {"model": aggregate}, [None] * 4)
    states = [r.state for r in first]
    continued = algorithm.local_updates(runtime, [0, 1, 2, 3], 3, {}, states)
    restarted_algorithm, *_ = _feddc(daisy_period=None, aggregation_period=2, mu=0.5)
    restarted = restarted_algorithm.local_updates(runtime, [0, 1, 2, 3], 3, {}, states)
    for a, b in zip(continued, restarted, strict=True):
        for key in a.state[0]:
            np.testing.assert_array_equal(np.asarray(a.state[0][key]),
                                          np.asarray(b.state[0][key]))
    without_prox, *_ = _feddc(daisy_period=None, aggregation_period=2, mu=0.0)
    plain = without_prox.local_updates(runtime, [0, 1, 2, 3], 3, {},
                                       [(s[0], s[1], s[2], None) for s in states])
    assert not np.allclose(np.asarray(plain[0].state[0]["net.1.weight"]),
                           np.asarray(continued[0].state[0]["net.1.weight"]))


def test_daisy_chaining_moves_models_between_clients(ray_session, tmp_path):
    """Daisy-chaining alone (d=1, no aggregation) against the same clients with no
    permutation: if models were not moved, every client would train its own model and both
    runs would give the same personal models."""
    chained = load(run(feddc_raw(daisy_period=1, aggregation_period=None), tmp_path / "dc"),
                   "client_eval")
    alone = load(run(feddc_raw(daisy_period=None, aggregation_period=None), tmp_path / "local"),
                 "client_eval")
    assert len(chained) == len(alone) > 0
    assert not np.allclose(chained["global_loss"].to_numpy(), alone["global_loss"].to_numpy())


def test_radon_sample_random_draws_other_models_per_aggregation_first_keeps_the_first():
    algorithm, dataset, *_ = _feddc(context_clients=700, daisy_period=None,
                                    aggregation_period=1, aggregator="radon")
    model = MODELS["mlp"].params(hidden=())
    algorithm.context = algorithm.context.__class__(0, dataset.info, model,
                                                    algorithm.context.training, 700, 700)
    rng = np.random.default_rng(0)
    shapes = {"net.1.weight": (10, 64), "net.1.bias": (10,)}  # 650 parameters: r = 652, h = 1
    models = [{k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
              for _ in range(700)]
    first = algorithm.aggregate({}, [models], 0)["aggregate"]
    assert np.allclose(first["net.1.bias"], iterated_radon_point(models[:652])["net.1.bias"])
    from raysim.algorithms.feddc import FedDC, FedDCParams
    sampled = FedDC(FedDCParams(daisy_period=None, aggregation_period=1, aggregator="radon",
                                radon_sample="random"), algorithm.context)
    round0 = sampled.aggregate({}, [models], 0)["aggregate"]["net.1.bias"]
    round1 = sampled.aggregate({}, [models], 1)["aggregate"]["net.1.bias"]
    assert not np.allclose(round0, first["net.1.bias"]) and not np.allclose(round0, round1)
    np.testing.assert_array_equal(round0, sampled.aggregate({}, [models], 0)["aggregate"]["net.1.bias"])


def test_feddc_dp_privatizes_every_hand_over(tmp_path):
    """algorithm.dp: the models FedDC hands over (and aggregates) carry clipped, noised updates;
    with an unreachable clip and no noise they are the plain run's models to the bit."""
    from algorithm_configs import contract_raw
    from fixtures import write_medmnist_npz
    from inprocess import flatten, simulate

    write_medmnist_npz(tmp_path, n_train=90, n_test=30)

    def states(dp: dict | None) -> list[np.ndarray]:
        raw = contract_raw(tmp_path, "feddc")
        if dp is not None:
            raw["algorithm"] = {**raw["algorithm"], "dp": dp}
        return flatten(simulate(parse_config(raw)).client_states)

    plain = states(None)
    for a, b in zip(plain, states({"clip": 1e9, "sigma": 0.0}), strict=True):
        assert np.array_equal(a, b)
    noisy = states({"clip": 0.5, "sigma": 0.5})
    assert any(not np.allclose(a, b) for a, b in zip(plain, noisy, strict=True))
