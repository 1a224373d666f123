"""Client-level differential privacy: clipping, Gaussian noise (central and
local), Poisson sampling, the fixed-denominator private mean, dp-accounting's epsilon in the
rounds table, calibration and the budget stop, and the refusals."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_tables, small_federation
from test_bad_input import run_cli

from raysim.algorithms.base import ClientResult
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import PrivacyConfig
from raysim.engine.runner import run_experiment
from raysim.privacy.accountant import default_delta
from raysim.privacy.private_mean import private_mean
from raysim.privacy.sampling import poisson_sample
from raysim.privacy.settings import DpSettings, resolve
from raysim.privacy.uploads import privatize_uploads
from raysim.results import load
from raysim.results.report import summary_table
from raysim.vectors.weighted_sum import WeightedSum
from raysim.vectors.weights import FlatWeights

logging.getLogger("absl").setLevel(logging.ERROR)  # dp-accounting's RDP order warnings
CPU = torch.device("cpu")


def _raw(**privacy) -> dict:
    raw = small_federation(name="dp", algorithm={"name": "fedavg", "weighted": False},
                           **({"privacy": privacy} if privacy else {}))
    raw["training"] = {"rounds": 4, "local_steps": 2, "batch_size": 8, "clients_per_round": 4,
                       "optimizer": {"name": "sgd", "lr": 0.1}}
    return raw


def _run(raw: dict, tmp_path: Path, label: str):
    return run_tables(raw, tmp_path / label, "rounds", "clients")


def _flat(values: np.ndarray) -> FlatWeights:
    vector = torch.from_numpy(values.astype(np.float32))
    return FlatWeights(vector, (("w", (len(values),)),))


def _settings(**overrides) -> DpSettings:
    fields = {"clip": 1.0, "noise_multiplier": 0.0, "mode": "central", "delta": 1e-5,
              "rate": 0.5, "num_clients": 10, "accountant": "rdp", "rounds_allowed": 3}
    return DpSettings(**{**fields, **overrides})


# ----- the mechanism -----
def test_every_clipped_update_is_within_the_bound_and_small_ones_are_unchanged():
    rng = np.random.default_rng(0)
    reference = _flat(rng.normal(size=500))
    ref = reference.vector.numpy()
    scales = [0.001, 0.02, 3.0, 40.0]  # update norms about 0.02, 0.45, 67, 890
    results = [(c, ClientResult({"model": _flat(ref + rng.normal(size=500) * s)}))
               for c, s in enumerate(scales)]
    originals = [r.upload["model"].vector.clone() for _, r in results]
    privatize_uploads(results, ("model",), lambda kind, client: reference,
                      {"model": reference}, _settings(clip=1.0), 0, 0, CPU)
    for (_, result), original, scale in zip(results, originals, scales, strict=True):
        upload = result.upload["model"].vector.double()
        norm = float(torch.linalg.vector_norm(upload - reference.vector.double()))
        assert norm <= 1.0 + 1e-5
        before = result.metrics["dp_model_update_norm"]
        if before <= 1.0:  # within the bound: the very same values
            assert torch.equal(result.upload["model"].vector, original)
        else:  # scaled onto the bound, same direction
            assert norm == pytest.approx(1.0, rel=1e-5) and scale >= 3.0
            direction = (original.double() - reference.vector.double()) / before
            assert torch.allclose(upload - reference.vector.double(), direction, atol=1e-5)


def test_local_noise_has_the_stated_std_and_is_the_same_stream_on_every_call():
    reference = _flat(np.zeros(200_000))
    settings = _settings(mode="local", clip=0.5, noise_multiplier=2.0)  # std 1.0
    draws = []
    for _ in range(2):
        results = [(7, ClientResult({"model": _flat(np.zeros(200_000))}))]
        privatize_uploads(results, ("model",), lambda kind, client: reference,
                          {"model": reference}, settings, 3, 5, CPU)
        draws.append(results[0][1].upload["model"].vector.double().numpy())
    assert np.array_equal(draws[0], draws[1])  # the client's stream (seed, round, client)
    assert np.std(draws[0]) == pytest.approx(settings.noise_std, rel=0.01)
    assert abs(np.mean(draws[0])) < 0.01


def test_central_noise_on_the_sum_has_the_stated_std_over_the_expected_count():
    """Clients that upload the broadcast itself: the private mean is broadcast + noise /
    expected, the noise N(0, (z C)^2) per coordinate."""
    broadcast = {"w": np.full(100_000, 0.25, np.float32)}
    partials = [WeightedSum.of([broadcast] * 3, [1.0] * 3)]
    settings = _settings(clip=0.5, noise_multiplier=4.0, rate=0.4, num_clients=10)  # std 2
    mean = private_mean(partials, broadcast, settings.expected_clients, settings.noise_std,
                        0, 1)["w"].astype(np.float64)
    offsets = (mean - 0.25) * settings.expected_clients
    assert np.std(offsets) == pytest.approx(settings.noise_std, rel=0.01)
    assert abs(np.mean(offsets)) < 0.05


def test_the_private_mean_divides_the_clipped_updates_by_the_expected_count():
    broadcast = {"w": np.zeros(3, np.float32)}
    uploads = [{"w": np.array([1.0, 0.0, 0.0], np.float32)},
               {"w": np.array([0.0, 2.0, 0.0], np.float32)}]
    mean = private_mean([WeightedSum.of(uploads, [1.0, 1.0])], broadcast, 4.0, 0.0, 0, 0)
    np.testing.assert_allclose(mean["w"], [0.25, 0.5, 0.0])  # (sum of updates) / 4, not / 2
    none_sampled = private_mean([], broadcast, 4.0, 0.0, 0, 0)
    np.testing.assert_array_equal(none_sampled["w"], broadcast["w"])


def test_poisson_sampling_has_the_rate_and_depends_only_on_seed_and_round():
    counts = [len(poisson_sample(0, r, 1000, 0.1)) for r in range(50)]
    assert np.mean(counts) == pytest.approx(100, rel=0.05) and len(set(counts)) > 5
    assert np.array_equal(poisson_sample(3, 7, 500, 0.2), poisson_sample(3, 7, 500, 0.2))
    assert len(poisson_sample(0, 0, 50, 1.0)) == 50


# ----- the accountant -----
def _direct_epsilon(rate: float, noise: float, rounds: int, delta: float) -> float:
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(noise)),
        rounds))
    return float(accountant.get_epsilon(delta))


def test_calibration_reaches_the_target_and_the_default_delta_is_one_over_n_to_1_1():
    settings = resolve(PrivacyConfig(target_epsilon=3.0), 100, 10, 20)
    assert settings.calibrated and settings.delta == pytest.approx(100 ** -1.1)
    assert settings.delta == default_delta(100)
    achieved = _direct_epsilon(0.1, settings.noise_multiplier, 20, settings.delta)
    assert achieved <= 3.0 and achieved == pytest.approx(3.0, rel=0.01)
    capped = resolve(PrivacyConfig(noise_multiplier=1.0, target_epsilon=1.0), 100, 10, 50)
    assert 0 < capped.rounds_allowed < 50
    assert _direct_epsilon(0.1, 1.0, capped.rounds_allowed, capped.delta) <= 1.0
    assert _direct_epsilon(0.1, 1.0, capped.rounds_allowed + 1, capped.delta) > 1.0


# ----- runs on the engine -----
def test_epsilon_in_the_rounds_table_is_dp_accountings(ray_session, tmp_path):
    rounds, clients = _run(_raw(clip=0.5, noise_multiplier=1.1, delta=1e-3), tmp_path, "eps")
    expected = [_direct_epsilon(4 / 12, 1.1, t + 1, 1e-3) for t in range(4)]
    np.testing.assert_allclose(rounds["epsilon"].to_numpy(), expected, rtol=1e-9)
    assert (clients.groupby("round").size().to_numpy() != 4).any()  # Poisson, not fixed size
    assert clients["dp_model_update_norm"].notna().all()


def test_no_noise_and_no_clip_give_fedavgs_numbers_exactly(ray_session, tmp_path):
    raw = _raw()
    raw["training"]["clients_per_round"] = 12  # rate 1: Poisson sampling takes everyone
    plain, _ = _run(raw, tmp_path, "plain")
    private, _ = _run({**raw, "privacy": {"clip": math.inf, "noise_multiplier": 0.0}},
                      tmp_path, "private")
    for column in ("accuracy", "loss", "train_loss"):
        assert np.array_equal(plain[column].to_numpy(), private[column].to_numpy()), column
    assert np.isinf(private["epsilon"]).all()  # no noise: no guarantee


@pytest.mark.parametrize("mode", ["central", "local"])
def test_one_and_two_workers_give_the_same_numbers_with_dp(ray_session, tmp_path, mode):
    runs = []
    for workers in (1, 2):
        raw = _raw(clip=0.5, noise_multiplier=0.8, mode=mode)
        raw["engine"]["num_workers"] = workers
        runs.append(_run(raw, tmp_path, f"{mode}{workers}")[0])
    for column in ("accuracy", "loss", "clients_sampled", "epsilon"):
        assert np.array_equal(runs[0][column].to_numpy(), runs[1][column].to_numpy()), column


def test_the_noise_changes_the_model(ray_session, tmp_path):
    quiet, _ = _run(_raw(clip=0.5, noise_multiplier=0.0), tmp_path, "quiet")
    noisy, _ = _run(_raw(clip=0.5, noise_multiplier=5.0), tmp_path, "noisy")
    assert not np.array_equal(quiet["loss"].to_numpy(), noisy["loss"].to_numpy())


def test_a_budget_stop_ends_the_run_early_and_its_last_row_says_why(ray_session, tmp_path):
    rounds, _ = _run(_raw(clip=0.5, noise_multiplier=0.8, target_epsilon=4.0, delta=1e-3),
                     tmp_path, "stop")
    allowed = resolve(PrivacyConfig(clip=0.5, noise_multiplier=0.8, target_epsilon=4.0,
                                    delta=1e-3), 12, 4, 4).rounds_allowed
    assert 0 < allowed < 4 and len(rounds) == allowed
    assert (rounds["epsilon"] <= 4.0).all()
    assert "privacy budget" in rounds["stop_reason"].iloc[-1]
    run_dir = next((tmp_path / "stop").glob("*/seed_0"))
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "stopped"  # not "completed": it ended before its rounds
    assert manifest["stop_reason"] == rounds["stop_reason"].iloc[-1]
    summary = summary_table(load(run_dir.parent))
    assert summary[["completed", "stopped"]].values.tolist() == [[0, 1]]


# ----- refusals -----
@pytest.mark.parametrize("algorithm", ["fedvck", "feddm", "fedmd", "mhpflid",
                                       "local", "centralized"])
def test_methods_without_protectable_weight_uploads_refuse_privacy(capsys, tmp_path,
                                                                  algorithm):
    raw = _raw(noise_multiplier=1.0)
    raw["algorithm"] = {"name": algorithm}
    raw["dataset"] = {"name": "digits"}
    raw["model"] = {"name": "convnet", "width": 8, "depth": 2}
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2, err
    assert "Invalid config section `privacy`" in err and "fedavg, fedprox, moon (or feddc, feddf, fedsm, " \
        "pfeddf in local mode)" in err
    assert "Traceback" not in err


def test_privacy_without_noise_or_target_is_a_config_error(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, _raw(clip=1.0))
    assert code == 2 and "noise_multiplier" in err and "target_epsilon" in err


def test_the_privacy_report_puts_epsilon_beside_the_membership_audit(ray_session, tmp_path):
    from raysim.results.report import report

    raw = _raw(clip=0.5, noise_multiplier=1.1, delta=1e-3)
    raw["evaluation"]["membership_audit"] = 4
    outcome = run_experiment(parse_config(raw), output=str(tmp_path / "r"), progress=False)[0]
    text, _ = report(outcome.run_dir.parent, privacy=True, csv_dir=tmp_path / "csv")
    import pandas as pd

    table = pd.read_csv(tmp_path / "csv" / "privacy.csv")
    row = table.iloc[0]
    assert row["epsilon"] == pytest.approx(_direct_epsilon(4 / 12, 1.1, 4, 1e-3), rel=1e-9)
    assert row["accountant"] == "rdp" and row["rounds"] == 4 and row["clip"] == 0.5
    assert 0 <= row["max_auc_mean"] <= 1 and "differential privacy" in text


def test_under_dp_every_client_weighs_one_in_the_sum(tmp_path):
    """DP bounds each client's contribution by the clip: the DP layer turns sample-weighted
    FedAvg into one vote per client (a client with many samples would otherwise weigh more
    than its clip)."""
    from raysim.algorithms.fedavg import FedAvg
    from raysim.algorithms.params import FedAvgParams
    from raysim.layers.assembly import compose
    from raysim.preparation import prepare, run_context

    config = parse_config(_raw(clip=1.0, noise_multiplier=1.0))
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    model = {"w": np.ones(3, np.float32)}
    results = [(c, ClientResult({"model": model}, num_samples=n, weight=float(n)))
               for c, n in ((0, 5), (1, 50))]
    private = compose(FedAvg, FedAvgParams(weighted=True), context)
    assert type(private).__name__ == "PrivateMean"
    assert private.reduce(results)["model"].total_weight == 2.0
    plain = compose(FedAvg, FedAvgParams(weighted=True), replace(context, features={}))
    assert plain.reduce(results).total_weight == 55.0


# ----- adaptive clipping (Andrew et al. 2021) -----
def test_adaptive_clip_splits_the_noise_multiplier_and_refuses_too_little_count_noise():
    settings = resolve(PrivacyConfig(clip=1.0, noise_multiplier=1.0,
                                     adaptive_clip={"count_noise_std": 2.0}), 100, 40, 10)
    assert settings.adaptive is not None
    z_delta = settings.adaptive.update_noise_multiplier
    assert z_delta ** -2 + (2 * 2.0) ** -2 == pytest.approx(1.0)  # composes to z = 1
    assert settings.noise_std_at(0.3) == pytest.approx(z_delta * 0.3)
    assert settings.epsilon_after(10) == pytest.approx(_direct_epsilon(0.4, 1.0, 10,
                                                                       settings.delta))
    # the server sees the bits centred at 1/2 (sensitivity 1/2, as the split assumes): with 30
    # of 50 sampled clients within the clip and 40 expected, the share is 1/2 + (30 - 25) / 40
    assert settings.adaptive.next_clip(1.0, 30, 50, 40, noise=0.0) == pytest.approx(
        math.exp(-settings.adaptive.learning_rate * (0.5 + 5 / 40 - 0.5)))
    assert resolve(PrivacyConfig(clip=1.0, noise_multiplier=1.0, adaptive_clip={}),
                   100, 40, 10).adaptive.count_noise_std == pytest.approx(40 / 20)
    from raysim.errors import ConfigError

    with pytest.raises(ConfigError, match="count_noise_std"):
        resolve(PrivacyConfig(clip=1.0, noise_multiplier=1.0,
                              adaptive_clip={"count_noise_std": 0.4}), 100, 40, 10)
    with pytest.raises(ConfigError, match="central"):
        resolve(PrivacyConfig(clip=1.0, noise_multiplier=1.0, mode="local",
                              adaptive_clip={}), 100, 40, 10)


def test_adaptive_clip_follows_the_target_quantile_of_the_update_norms(ray_session, tmp_path):
    """Without noise the clip moves geometrically by exp(-lr (share within - quantile)): from
    far above every update norm it shrinks by exp(-lr (1 - q)) per round (every update within)
    until it reaches the norms, then settles where about q of them are within."""
    raw = _raw(clip=20.0, noise_multiplier=0.0,
               adaptive_clip={"target_quantile": 0.5, "learning_rate": 0.5,
                              "count_noise_std": 0.0})
    raw["training"].update(rounds=30, clients_per_round=12)  # rate 1: every client each round
    rounds, clients = _run(raw, tmp_path, "adaptive")
    clip = rounds["dp_clip"].to_numpy()
    within = clients.groupby("round")["dp_model_within_clip"].mean().to_numpy()
    norms = clients.groupby("round")["dp_model_update_norm"].median().to_numpy()
    for t in range(len(clip) - 1):  # the recorded clips obey the update rule exactly
        assert clip[t + 1] == pytest.approx(clip[t] * math.exp(-0.5 * (within[t] - 0.5)))
    assert clip[0] == 20.0 and clip[1] == pytest.approx(20 * math.exp(-0.25))
    assert within[:5].min() == 1.0 and clip[-1] < 2 * norms[-1]  # it came down to the norms
    assert 0.2 <= within[-8:].mean() <= 0.8  # and keeps about half of them whole


# ----- FedDC: every released model privatized by its client, accounted per release -----
def _feddc_raw(**privacy) -> dict:
    raw = _raw(**privacy)
    raw["algorithm"] = {"name": "feddc", "daisy_period": 2, "aggregation_period": 4}
    raw["training"]["clients_per_round"] = 12  # FedDC: every client every round
    return raw


def test_feddc_under_privacy_composes_one_gaussian_mechanism_per_release(ray_session, tmp_path):
    rounds, clients = _run(_feddc_raw(clip=0.5, noise_multiplier=2.0, mode="local",
                                      delta=1e-3), tmp_path, "feddc")
    # d = 2, b = 4: round 1 hands over, round 3 aggregates; no sampling (rate 1)
    releases = [0, 1, 1, 2]
    expected = [0.0 if n == 0 else _direct_epsilon(1.0, 2.0, n, 1e-3) for n in releases]
    np.testing.assert_allclose(rounds["epsilon"].to_numpy(), expected, rtol=1e-9)
    assert (clients.groupby("round").size() == 12).all()
    quiet, _ = _run(_feddc_raw(clip=0.5, noise_multiplier=0.0, mode="local"), tmp_path, "q")
    assert not np.array_equal(quiet["loss"].to_numpy(), rounds["loss"].to_numpy())


@pytest.mark.parametrize("change, needle", [
    ({"mode": "central"}, "privacy.mode: local"),
    ({"mode": "local", "adaptive_clip": {}}, "adaptive_clip"),
])
def test_feddc_refuses_central_noise_and_adaptive_clipping(capsys, tmp_path, change, needle):
    code, err = run_cli(capsys, tmp_path, _feddc_raw(clip=0.5, noise_multiplier=1.0, **change))
    assert code == 2 and needle in err and "Traceback" not in err


def test_feddc_refuses_its_own_dp_beside_privacy(capsys, tmp_path):
    raw = _feddc_raw(clip=0.5, noise_multiplier=1.0, mode="local")
    raw["algorithm"]["dp"] = {"clip": 0.5, "sigma": 1.0}
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and "remove algorithm.dp" in err


def test_adaptive_clipping_noises_the_sum_at_the_rounds_clip_with_the_updates_multiplier():
    from raysim.algorithms.fedavg import FedAvg
    from raysim.algorithms.params import FedAvgParams
    from raysim.layers.assembly import compose
    from raysim.preparation import prepare, run_context
    from raysim.privacy.private_mean import AdaptivelyClipped
    from raysim.vectors.weighted_sum import WeightedSum

    config = parse_config(_raw(clip=1.0, noise_multiplier=1.0,
                               adaptive_clip={"count_noise_std": 2.0}))
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    settings = context.privacy
    zeros = {"w": np.zeros(40_000, np.float32)}
    expected = settings.expected_clients
    partial = {"model": WeightedSum.of([zeros], [expected]), "within_clip": expected}
    state = compose(FedAvg, FedAvgParams(weighted=False), context).aggregate(
        AdaptivelyClipped(zeros, 0.3), [partial], round_=0)
    noise_std = float(np.std(state.model["w"])) * expected  # the mean divides the sum's noise
    z_delta = settings.adaptive.update_noise_multiplier
    assert noise_std == pytest.approx(z_delta * 0.3, rel=0.03)  # not z x the first clip 1.0
    assert state.clip == pytest.approx(0.3 * math.exp(-0.2 * (1.0 - 0.5)), rel=0.2)


# ----- FedDF: its clients' weights privatized locally, the teacher computed by the server -----
def _feddf_raw(**privacy) -> dict:
    raw = _raw(**privacy)
    raw["algorithm"] = {"name": "feddf", "weighted": False, "public_per_client": 4,
                        "distillation_steps": 3, "distillation_batch_size": 8}
    raw["training"]["clients_per_round"] = 12  # rate 1: Poisson sampling takes everyone
    return raw


def test_feddf_under_local_dp_uploads_no_logits_and_equals_feddf_without_noise_or_clip(
        ray_session, tmp_path):
    """With DP on, FedDF's clients upload only their (clipped, noised) weights and the server
    computes each upload's logits on the public set: with no clip and no noise that is
    FedDF's own run to the bit; the noise reaches the distilled models."""
    from raysim.results import load

    runs = {}
    for label, privacy in (("plain", None), ("open", {"clip": math.inf,
                                                       "noise_multiplier": 0.0}),
                           ("noisy", {"clip": 0.5, "noise_multiplier": 2.0})):
        raw = _feddf_raw(**({**privacy, "mode": "local"} if privacy else {}))
        outcome = run_experiment(parse_config(raw), output=str(tmp_path / label),
                                 progress=False)[0]
        assert outcome.error is None, outcome.error
        runs[label] = (load(outcome.run_dir), load(outcome.run_dir, "communication"))
    (plain, plain_bytes), (open_, open_bytes), (noisy, _) = (runs[k] for k in
                                                             ("plain", "open", "noisy"))
    assert "logits" in set(plain_bytes["message_type"])
    assert "logits" not in set(open_bytes["message_type"])
    for column in ("accuracy", "loss", "personal_accuracy"):
        assert np.array_equal(plain[column].to_numpy(), open_[column].to_numpy()), column
    assert not np.array_equal(open_["loss"].to_numpy(), noisy["loss"].to_numpy())
    assert np.isfinite(noisy["epsilon"]).all()


def test_feddf_refuses_central_noise(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, _feddf_raw(clip=0.5, noise_multiplier=1.0,
                                                     mode="central"))
    assert code == 2 and "privacy.mode: local" in err and "Traceback" not in err


def test_feddf_privatizes_each_upload_against_the_model_its_client_started_from():
    from types import SimpleNamespace

    from raysim.algorithms import ALGORITHMS
    from raysim.preparation import prepare, run_context

    config = parse_config(_feddf_raw(clip=0.5, noise_multiplier=1.0, mode="local"))
    dataset, partition = prepare(config, None)[0]
    feddf = ALGORITHMS["feddf"](config.algorithm,
                                run_context(config, dataset, 0, partition.num_clients))
    runtime = SimpleNamespace(client_initial_weights=lambda client: f"initial {client}")
    group = {"models": {"0": "group 0's distilled model"}}
    assert feddf.dp_reference(runtime, group, 3) == "group 0's distilled model"
    assert feddf.dp_reference(runtime, {}, 3) == "initial 3"  # its first round


# ----- FedSM: global model, selector and personalized models, each privatized locally -----
def _fedsm_raw(variant: str = "fedsm", **privacy) -> dict:
    raw = _raw(**privacy)
    raw["algorithm"] = {"name": "fedsm", "variant": variant,
                        **({"extra_rounds": 1} if variant == "extra" else {})}
    raw["training"]["clients_per_round"] = 12  # FedSM: every client every round
    return raw


@pytest.mark.parametrize("variant, releases", [("fedsm", [3, 6, 9, 12]),
                                                ("extra", [2, 4, 6, 7])])
def test_fedsm_under_privacy_composes_one_gaussian_mechanism_per_upload(
        ray_session, tmp_path, variant, releases):
    rounds, clients = _run(_fedsm_raw(variant, clip=0.5, noise_multiplier=3.0, mode="local",
                                      delta=1e-3), tmp_path, variant)
    expected = [_direct_epsilon(1.0, 3.0, n, 1e-3) for n in releases]
    np.testing.assert_allclose(rounds["epsilon"].to_numpy(), expected, rtol=1e-9)
    main = clients[clients["round"] < (4 if variant == "fedsm" else 3)]
    assert main["dp_model_update_norm"].notna().all()
    assert main["dp_personal_update_norm"].notna().all()


def test_fedsm_clips_and_noises_the_personalized_model_the_client_keeps(monkeypatch):
    """A client's personalized upload is its SoftPull start plus the clipped update (norm <=
    clip without noise) plus Gaussian noise of std multiplier x clip per weight, from its own
    stream; the client keeps exactly that release (its next start is public), and the
    selector's Adam moments are not uploaded."""
    from test_data_plane import _workers

    from raysim.algorithms import ALGORITHMS

    measured = {}
    for noise in (0.0, 1.0):
        config = parse_config(_fedsm_raw(clip=0.01, noise_multiplier=noise, mode="local"))
        workers, _, _ = _workers(config, 1, monkeypatch)
        worker = workers[0]
        server = ALGORITHMS["fedsm"](config.algorithm, worker.setup.context)
        message = server.broadcast(server.init_server_state(worker.runtime.initial_weights), 0)
        clients = list(range(12))
        results = worker.algorithm.local_updates(worker.runtime, clients, 0, message,
                                                 [None] * 12)
        start = torch.from_numpy(np.concatenate([np.ravel(v) for v in
                                                 worker.runtime.initial_weights.values()]))
        distances = []
        for result in results:
            personal = result.upload["personal"]
            assert result.state[0] is personal and "selector_adam" not in result.upload
            vector = torch.as_tensor(personal.vector).double()
            distances.append(float(torch.linalg.vector_norm(vector - start.double())))
            assert result.metrics["dp_personal_update_norm"] > 0.01  # (so it was clipped)
        measured[noise] = (np.array(distances), start.numel())
    quiet, _ = measured[0.0]
    assert (quiet <= 0.01 + 1e-6).all() and (quiet > 0.0099).all()
    noisy, size = measured[1.0]
    np.testing.assert_allclose(noisy / (0.01 * np.sqrt(size)), 1.0, rtol=0.05)


def test_fedsm_refuses_central_noise(capsys, tmp_path):
    code, err = run_cli(capsys, tmp_path, _fedsm_raw(clip=0.5, noise_multiplier=1.0,
                                                     mode="central"))
    assert code == 2 and "privacy.mode: local" in err and "super model" in err


def test_fedsm_calibrates_its_noise_for_every_upload_of_every_round():
    from raysim.algorithms import ALGORITHMS
    from raysim.preparation import prepare, run_context

    config = parse_config(_fedsm_raw(clip=0.5, target_epsilon=4.0, delta=1e-3, mode="local"))
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    fedsm = ALGORITHMS["fedsm"](config.algorithm, context)
    settings = context.privacy
    assert settings is not None and settings.calibrated
    assert settings.epsilon_after(fedsm.dp_releases(4)) == pytest.approx(4.0, rel=1e-3)


def test_the_dp_feature_brings_its_layer_sampler_accountant_and_round_cap(tmp_path):
    """``privacy:`` is one feature (``raysim.layers.client_dp``): assembled into a run it wraps
    the algorithm in the private mean, samples clients by Poisson at the accountant's rate,
    adds the budget's columns and caps the rounds at what ``target_epsilon`` allows; without
    it the run has none of them."""
    from raysim.algorithms.fedavg import FedAvg
    from raysim.algorithms.params import FedAvgParams
    from raysim.layers.assembly import assemble
    from raysim.layers.client_dp import PoissonSampler, PrivacyAccounting
    from raysim.preparation import prepare, run_context

    config = parse_config(_raw(clip=1.0, noise_multiplier=1.0))
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    parts = assemble(FedAvg, FedAvgParams(), context)
    assert type(parts.algorithm).__name__ == "PrivateMean"
    assert isinstance(parts.sampler(), PoissonSampler)
    assert parts.sampler().rate == context.privacy.rate
    assert [type(c) for c in parts.callbacks(10)] == [PrivacyAccounting]
    assert parts.rounds(10 ** 6) == context.privacy.rounds_allowed
    assert "privacy" in parts.manifest()
    plain = assemble(FedAvg, FedAvgParams(), replace(context, features={}))
    assert type(plain.algorithm) is FedAvg and plain.sampler() is None
    assert plain.callbacks(10) == [] and plain.rounds(7) == 7 and plain.manifest() == {}


def test_the_dp_layer_takes_an_algorithm_with_two_mean_uploads(tmp_path):
    """An algorithm that declares two mean uploads (e.g. a model and a control variate) under
    central DP: each upload is clipped on its own, the server's private mean of each is taken
    over its own broadcast entry with noise from its own stream, and the algorithm's server
    step receives both means."""
    from raysim.algorithms.fedavg import FedAvg
    from raysim.algorithms.params import FedAvgParams
    from raysim.layers.dp_mean import PrivateMean
    from raysim.preparation import prepare, run_context

    class TwoMeans(FedAvg):
        mean_uploads = ("model", "extra")

        def broadcast(self, state, round_):
            return {"model": state["model"], "extra": state["extra"]}

        def server_step(self, state, mean):
            return {"model": mean["model"], "extra": mean["extra"]}

    config = parse_config(_raw(clip=1.0, noise_multiplier=1.0))
    dataset, partition = prepare(config, None)[0]
    context = run_context(config, dataset, 0, partition.num_clients)
    state = {"model": {"w": np.zeros(3, np.float32)}, "extra": {"c": np.zeros(2, np.float32)}}

    def run(settings):
        layer = PrivateMean(TwoMeans(FedAvgParams(), replace(context, features={"privacy": settings})))
        message = layer.broadcast(state, 0)
        results = [ClientResult({"model": {"w": np.full(3, 10.0, np.float32)},
                                 "extra": {"c": np.full(2, 0.1 * c, np.float32)}},
                                num_samples=5) for c in (1, 2)]
        pairs = list(zip((0, 1), results, strict=True))
        privatize_uploads(pairs, layer.mean_uploads, lambda kind, client: message[kind],
                          message, layer.settings, 0, 0, torch.device("cpu"))
        assert all(r.metrics["dp_model_update_norm"] > 1.0 for r in results)  # clipped alone
        assert all(r.metrics["dp_extra_within_clip"] == 1.0 for r in results)
        return layer.aggregate(state, [layer.reduce(pairs)], 0)

    quiet = run(replace(context.privacy, noise_multiplier=0.0))
    expected = context.privacy.expected_clients
    np.testing.assert_allclose(quiet["model"]["w"], 2 * 10 / np.sqrt(300) / expected, rtol=1e-5)
    np.testing.assert_allclose(quiet["extra"]["c"], (0.1 + 0.2) / expected, rtol=1e-5)
    noisy = run(context.privacy)
    model_noise = np.asarray(noisy["model"]["w"]) - quiet["model"]["w"]
    extra_noise = np.asarray(noisy["extra"]["c"]) - quiet["extra"]["c"]
    assert np.abs(model_noise).min() > 0 and np.abs(extra_noise).min() > 0
    assert not np.allclose(model_noise[:2], extra_noise)  # streams of their own


def test_the_in_process_loop_honours_the_privacy_budgets_round_cap(data_root):
    """The contract tests' in-process loop takes the driver's rounds: the configured ones,
    capped where DP's budget allows fewer (here 1 of 3)."""
    from algorithm_configs import contract_raw
    from inprocess import simulate

    from raysim.configuration.experiment import parse_config

    raw = {**contract_raw(data_root, "fedavg"),
           "privacy": {"clip": 0.5, "noise_multiplier": 2.0, "target_epsilon": 2.0,
                       "delta": 1e-3}}
    trace = simulate(parse_config(raw))
    assert len(trace.rows["rounds"]) == 1 and len(trace.metrics) == 1
