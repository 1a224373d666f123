"""FedVCK and FedDM: augmentation, kernels, importance sampling, condensation, server
training with the relational contrastive loss, uploads, the membership audit, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REAL_MEDMNIST
from fixtures import write_medmnist_npz
from test_bad_input import run_cli

from raysim.algorithms.base import ClientResult, RunContext
from raysim.algorithms.feddm import FedDM, FedDMParams
from raysim.algorithms.fedvck import FedVCK, FedVCKParams, hard_negative_classes
from raysim.condensation.augment import OPERATIONS, augment, chosen_operations, shift
from raysim.condensation.importance import class_sampling_probabilities, importance_weights
from raysim.condensation.kernels import mmd
from raysim.condensation.matching import MatchingSettings, RealData, condense
from raysim.condensation.synthetic import (
    ServerTraining,
    images_per_class,
    to_uint8,
    train_on_synthetic,
)
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import TrainingConfig
from raysim.data.dataset import DataInfo, to_tensor
from raysim.engine.runner import run_experiment
from raysim.models import build_model
from raysim.models.convnet import ConvNetParams
from raysim.results import load
from raysim.results.report import communication_table, privacy_table
from raysim.training.context import ClientData
from raysim.training.evaluation import classification_metrics, predict_proba
from raysim.training.membership import audit_sets, membership_auc
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import get_weights, set_weights

INFO = DataInfo("fixture", "image", 3, (1, 28, 28), (0.5,), (0.5,))
MODEL = ConvNetParams(width=8, depth=3, norm="batch")
FAST = {"iterations": 10, "real_per_class": 16, "server_epochs": 2, "server_batch_size": 16}


def test_siamese_augmentation_is_seeded_shared_and_differentiable():
    x = torch.randn(4, 1, 28, 28, requires_grad=True)
    a, b = augment(x, 7), augment(x, 7)
    assert torch.equal(a, b) and not torch.allclose(a, augment(x, 8))
    a.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("kernel", ["linear", "gaussian", "polynomial"])
def test_mmd_is_zero_for_equal_sets_and_positive_otherwise(kernel):
    torch.manual_seed(0)
    real = torch.randn(32, 6)
    assert float(mmd(real, real, kernel)) == pytest.approx(0.0, abs=1e-5)
    assert float(mmd(real, real + 1.0, kernel)) > 1e-3
    if kernel == "linear":
        shifted = real + 0.5
        assert float(mmd(real, shifted)) == pytest.approx(6 * 0.25, rel=1e-5)


def test_importance_sampling_favours_badly_predicted_samples():
    labels = torch.tensor([0, 0, 0, 1, 1])
    logits = torch.tensor([[5.0, 0], [0, 0], [-5, 0], [0, 5], [0, -5]])
    weights = importance_weights(logits, None, labels, alpha=0.5, gamma=1.0, offset=0.0)
    assert weights[2] > weights[1] > weights[0] and weights[4] > weights[3]
    ensembled = importance_weights(logits, -logits, labels, alpha=0.5, gamma=1.0, offset=0.0)
    assert torch.allclose(ensembled, ensembled[0].expand(5))  # z = 0 everywhere: equal CE
    probabilities = class_sampling_probabilities(weights, labels, 3)
    assert set(probabilities) == {0, 1}
    assert all(np.isclose(p.sum(), 1.0) for p in probabilities.values())
    assert probabilities[0].argmax() == 2


def test_synthetic_set_sizes_follow_percent_floor_and_skip_rule():
    sizes = images_per_class(np.array([1000, 9, 120, 0]), 1.0, 5, 10)
    assert sizes == {0: 10, 2: 5}  # ceil(1% of 1000) = 10; class 1 < 10 samples skipped
    assert images_per_class(np.array([3, 0]), None, 10, 1) == {0: 10}


def test_uint8_upload_round_trips_within_one_grey_level():
    x = torch.rand(3, 1, 28, 28) * 2 - 1  # normalised space of mean 0.5, std 0.5
    back = to_tensor(to_uint8(x, INFO), INFO)
    assert back.shape == x.shape
    assert (back - x).abs().max() <= 1 / 255 / 0.5 + 1e-6
    assert to_uint8(x, INFO).nbytes == 3 * 28 * 28  # one byte per pixel


def test_server_training_feeds_one_forward_pass_to_both_loss_terms():
    """With an extra loss, each batch passes the model once: BatchNorm counts one update per
    step, and the extra term receives the batch's embeddings."""
    model = build_model(ConvNetParams(width=8, depth=2, norm="batch"), INFO)
    images = np.random.default_rng(0).integers(0, 256, (20, 28, 28), dtype=np.uint8)
    labels = np.arange(20) % 3
    seen = []

    def extra(embeddings: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append((embeddings.shape, len(targets)))
        return embeddings.pow(2).mean() * 0.0

    settings = ServerTraining(epochs=3, lr=0.01, momentum=0.9, weight_decay=0.0, batch_size=8)
    train_on_synthetic(model, images, labels, INFO, settings, torch.Generator().manual_seed(0),
                       extra)
    steps = 3 * 3  # 20 samples in batches of 8, 8, 4
    assert len(seen) == steps
    assert all(shape == (n, model.embedding_dim) for shape, n in seen)
    bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert int(bn.num_batches_tracked) == steps


def test_condensation_moves_synthetic_class_means_towards_the_real_ones():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(64, 28, 28), dtype=np.uint8)
    x[:32] //= 4  # class 0 dark, class 1 bright
    real = RealData(x, {0: np.arange(32), 1: np.arange(32, 64)})
    torch.manual_seed(0)
    embed = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten())
    embed.requires_grad_(False)
    synthetic = {c: torch.randn(5, 1, 28, 28, requires_grad=True) for c in (0, 1)}

    def distance() -> float:
        with torch.no_grad():
            return sum(float(mmd(embed(to_tensor(x[real.by_class[c]], INFO)), embed(synthetic[c])))
                       for c in (0, 1))

    def loss(r, s, rs, ss):
        return sum(mmd(a, b) for a, b in zip(embed(r).split(rs), embed(s).split(ss), strict=True))

    before = distance()
    condense(synthetic, real, INFO, MatchingSettings(60, 0.2, 0.5, 32), loss,  # augmented
             np.random.default_rng(0), np.arange(60))
    assert distance() < 0.2 * before


def test_hard_negatives_are_the_top_k_other_classes_of_the_prototype():
    prototypes = np.array([[9.0, 1, 5, 3], [2, 9, 1, 8], [0, 0, 9, 0], [1, 2, 3, 9]])
    available = np.array([True, True, True, False])
    rows = hard_negative_classes(prototypes, 2, available)
    assert rows[0].tolist() == [0, 2, 1]  # class 3 unavailable
    assert rows[1].tolist() == [1, 0, 2]
    assert rows[3].tolist() == [-1, -1, -1]


def _runtime(num_clients: int = 2) -> ClientRuntime:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(200, 28, 28), dtype=np.uint8)
    y = np.repeat([0, 1, 2], [100, 60, 40])
    torch.manual_seed(0)
    return ClientRuntime(
        RunContext(0, INFO, MODEL, TrainingConfig(rounds=4), 2, 2),
        ClientData(x, y, [np.arange(0, 130), np.arange(130, 200)], get_weights(build_model(MODEL, INFO))),
        torch.device("cpu"))


def _context(runtime: ClientRuntime) -> RunContext:
    return RunContext(0, INFO, MODEL, runtime.training, 2, 2)


def _rounds(algorithm, runtime, rounds: int):
    state, states, history = algorithm.init_server_state(runtime.initial_weights), [None, None], []
    for round_ in range(rounds):
        results = algorithm.local_updates(runtime, [0, 1], round_,
                                          algorithm.broadcast(state, round_), states)
        states = [r.state for r in results]
        state = algorithm.aggregate(state, [algorithm.reduce(list(enumerate(results)))], round_)
        history.append((results, state))
    return history


def test_fedvck_uploads_synthetic_sets_and_prototypes_and_keeps_a_window_of_rounds():
    runtime = _runtime()
    algorithm = FedVCK(FedVCKParams(**FAST, percent=10, hard_negatives=2, keep_rounds=2),
                       _context(runtime))
    history = _rounds(algorithm, runtime, 3)
    results, state = history[0]
    # client 0: 100 of class 0 -> 10 images, 30 of class 1 -> 5; client 1: 30 + 40 -> 5 + 5
    assert [len(r.upload["synthetic"]) for r in results] == [15, 10]
    assert results[0].upload["synthetic"].dtype == np.uint8
    assert results[0].upload["prototype_counts"].tolist() == [100, 30, 0]
    assert [len(b[1]) for b in state["buffer"]] == [15, 10]
    assert "projector" not in state and state["previous"] is not None  # projector: per round
    assert sorted({b[0] for b in history[2][1]["buffer"]}) == [1, 2]  # the last 2 rounds
    assert "previous" in algorithm.broadcast(state, 1)  # the self-ensemble needs z_{t-1}
    uniform = FedVCK(FedVCKParams(**FAST, selection="uniform", hard_negatives=2), _context(runtime))
    assert "previous" not in uniform.broadcast(state, 1)  # nobody reads it: not sent
    warm = history[1][0][0].state[0]  # warm start: round 1 continued round 0's images
    assert warm.shape == (10, 1, 28, 28) and not np.allclose(warm, results[0].state[0])


def test_feddm_trains_the_server_on_the_current_round_only():
    runtime = _runtime()
    algorithm = FedDM(FedDMParams(**FAST, images_per_class=3), _context(runtime))
    history = _rounds(algorithm, runtime, 2)
    assert [len(r.upload["synthetic"]) for r in history[0][0]] == [6, 6]
    assert {b[0] for b in history[1][1]["buffer"]} == {1}
    assert set(algorithm.broadcast(history[1][1], 2)) == {"model"}  # no previous model sent
    assert not np.array_equal(history[1][1]["model"]["classifier.weight"],
                              history[0][1]["model"]["classifier.weight"])


def test_membership_audit_detects_uploaded_members():
    runtime = _runtime()
    test_x, test_y = runtime.train_x[:50].copy() // 2, runtime.train_y[:50].copy()
    members, nonmembers = audit_sets(runtime.client_indices[0], runtime.train_y, test_y, 20, 0, 0)
    assert len(members) == len(nonmembers) and set(members) <= set(range(130))
    # non-members carry the members' class mix, so labels alone cannot separate them
    assert np.array_equal(np.bincount(runtime.train_y[members], minlength=3),
                          np.bincount(test_y[nonmembers], minlength=3))
    algorithm = FedVCK(FedVCKParams(**FAST, hard_negatives=2), _context(runtime))

    def audit(upload: dict) -> float:  # the engine's audit: the algorithm's attack hook
        return membership_auc(
            lambda x, y: algorithm.membership_scores(runtime, 0, upload, x, y), runtime,
            members, nonmembers, test_x, test_y)

    leaky = {"synthetic": runtime.train_x[members], "labels": runtime.train_y[members]}
    assert audit(leaky) == 1.0
    unrelated = {"synthetic": test_x[nonmembers], "labels": test_y[nonmembers]}
    assert audit(unrelated) < 0.5
    assert np.isnan(audit({"logits": np.zeros(3)}))


def test_privacy_and_communication_tables():
    clients = pd.DataFrame({"experiment": "e", "algorithm": "fedvck", "run": ["a"] * 4,
                            "round": 9, "mia_auc": [0.4, 0.5, 0.6, 0.7]})
    row = privacy_table(clients).iloc[0]
    assert row["max_auc_mean"] == 0.7 and row["mean_auc_mean"] == pytest.approx(0.55)
    assert row["defense_rate_mean"] == 0.5
    communication = pd.DataFrame({"experiment": "e", "algorithm": "fedvck", "run": "a",
                                  "round": [0, 0, 1, 1], "direction": "up",
                                  "message_type": ["synthetic", "prototypes"] * 2,
                                  "bytes": [2_000_000, 100, 4_000_000, 100]})
    table = communication_table(communication).iloc[0]
    assert table["up synthetic MB"] == 3.0 and table["up total MB"] == pytest.approx(3.0001)


def vck_raw(root, **algorithm) -> dict:
    return {"name": "fedvck-test",
            "dataset": {"name": "pneumoniamnist", "root": str(root), "download": False,
                        "verify_checksum": False},
            "partition": {"scheme": "dirichlet", "num_clients": 3, "beta": 0.5, "min_size": 10},
            "model": {"name": "convnet", "width": 8, "depth": 3, "norm": "batch"},
            "algorithm": {"name": "fedvck", **FAST, "hard_negatives": 1, **algorithm},
            "training": {"rounds": 2}, "seeds": [0],
            "engine": {"num_workers": 1, "cpus_per_worker": 1}}


BAD = [("percent 0", {"percent": 0}, "algorithm.percent"),
       ("percent above 100", {"percent": 101}, "algorithm.percent"),
       ("unknown kernel", {"kernel": "cosine"}, "algorithm.kernel"),
       ("negative beta", {"beta": -0.1}, "algorithm.beta"),
       ("K >= classes", {"hard_negatives": 2}, "algorithm.hard_negatives")]


@pytest.mark.parametrize("label,algorithm,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_fedvck_settings_exit_2(capsys, tmp_path, label, algorithm, expected):
    root = tmp_path / "data"
    write_medmnist_npz(root, n_train=60, n_test=20)
    code, err = run_cli(capsys, tmp_path, vck_raw(root, **algorithm))
    assert code == 2, err
    assert expected in err and "Traceback" not in err


def test_fedvck_run_is_the_same_on_one_or_two_workers_with_audit_and_byte_counts(
        ray_session, tmp_path):
    root = tmp_path / "data"
    write_medmnist_npz(root, n_train=120, n_test=40)
    rounds = {}
    for workers in (1, 2):
        raw = vck_raw(root, iterations=5)
        raw["engine"]["num_workers"] = workers
        raw["evaluation"] = {"membership_audit": 10}
        outcome = run_experiment(parse_config(raw), output=str(tmp_path / f"w{workers}"),
                                 progress=False)[0]
        assert outcome.error is None, outcome.error
        rounds[workers] = load(outcome.run_dir, "rounds")
        clients = load(outcome.run_dir, "clients")
        communication = load(outcome.run_dir, "communication")
    columns = ["round", "accuracy", "auc", "loss", "bytes_up"]
    assert rounds[1][columns].equals(rounds[2][columns])
    audited = clients.dropna(subset=["mia_auc"])
    last = clients[clients["round"] == 1]
    assert set(audited["round"]) == {1}  # the last round only
    # every client that uploaded synthetic images is audited (one may hold no class >= 10)
    assert len(audited) == (last["synthetic_images"] > 0).sum() >= 2
    assert audited["mia_auc"].between(0, 1).all()
    up = communication[communication["direction"] == "up"]
    assert {"synthetic", "labels", "prototypes", "prototype_counts"} == set(up["message_type"])
    images = clients[clients["round"] == 0]["synthetic_images"].sum()
    assert up[(up["round"] == 0) & (up["message_type"] == "synthetic")]["bytes"].sum() == (
        images * 28 * 28)


# ----- mechanisms of the condensation -----
def _condensed_set_quality(train_x, train_y, test_x, test_y, info, iterations, seed,
                           **settings) -> tuple[dict, ClientResult]:
    """Condense one client's data with FedVCK, train a fresh model on the uploaded uint8
    images only, and score it on the test set."""
    model_params = ConvNetParams(width=16, depth=3, norm="batch", first_padding=3)
    torch.manual_seed(seed)
    initial = get_weights(build_model(model_params, info))
    training = TrainingConfig(rounds=1)
    runtime = ClientRuntime(
        RunContext(seed, info, model_params, training, 1, 1),
        ClientData(train_x, train_y, [np.arange(len(train_y))], initial),
        torch.device("cpu"))
    params = FedVCKParams(iterations=iterations, real_per_class=64, percent=2,
                          selection="uniform", contrastive=False, **settings)
    algorithm = FedVCK(params, RunContext(seed, info, model_params, training, 1, 1))
    result = algorithm.local_updates(runtime, [0], 0, {"model": initial}, [None])[0]
    model = build_model(model_params, info)
    set_weights(model, initial)
    train_on_synthetic(model, result.upload["synthetic"], result.upload["labels"], info,
                       ServerTraining(300, 0.01, 0.9, 0.0, 256, 0.1, OPERATIONS),
                       torch.Generator().manual_seed(0))
    return classification_metrics(test_y, predict_proba(model, test_x, info, 512,
                                                        torch.device("cpu"))), result


def test_a_model_trained_on_a_condensed_fixture_set_beats_the_majority_class(tmp_path):
    path = write_medmnist_npz(tmp_path, n_train=300, n_test=200, seed=3)
    arrays = np.load(path)
    train_y, test_y = arrays["train_labels"][:, 0].astype(np.int64), arrays["test_labels"][:, 0]
    info = DataInfo("pneumoniamnist", "image", 2, (1, 28, 28), (0.5,), (0.5,))
    metrics, _ = _condensed_set_quality(arrays["train_images"], train_y, arrays["test_images"],
                                        test_y.astype(np.int64), info, 60, 0)
    majority = np.bincount(test_y).max() / len(test_y)
    assert metrics["accuracy"] > majority + 0.2, metrics


@pytest.mark.skipif(not (REAL_MEDMNIST / "pneumoniamnist.npz").exists(),
                    reason="the real PneumoniaMNIST file is not present")
def test_a_model_trained_on_a_condensed_real_pneumonia_client_ranks_the_test_set():
    """300 matching steps on 600 real training images (authors' single-operation
    augmentation): the 15 uploaded images teach a model (N(0,1) noise, i.e. no condensation,
    gives AUC ~0.5; DSA's apply-all mode gave accuracy 0.38-0.53 in the probes)."""
    arrays = np.load(REAL_MEDMNIST / "pneumoniamnist.npz")
    train_y = arrays["train_labels"][:, 0].astype(np.int64)
    pick = np.random.default_rng(2).choice(len(train_y), 600, replace=False)
    info = DataInfo("pneumoniamnist", "image", 2, (1, 28, 28), (0.5,), (0.5,))
    metrics, result = _condensed_set_quality(
        arrays["train_images"][pick], train_y[pick], arrays["test_images"],
        arrays["test_labels"][:, 0].astype(np.int64), info, 300, 2)
    assert metrics["auc"] > 0.85 and metrics["accuracy"] > 0.7, metrics
    assert result.metrics["matching_loss"] < 25


def test_single_mode_applies_one_operation_and_crop_moves_whole_pixels():
    x = torch.rand(3, 1, 28, 28)
    seen = set()
    for seed in range(40):
        (op,) = chosen_operations(seed, OPERATIONS, "single")
        seen.add(op)
        if op == "crop":  # a whole-pixel shift: every pixel is an input pixel or the zero fill
            out = augment(x, seed)
            values = set(x.flatten().tolist()) | {0.0}
            assert set(out.flatten().tolist()) <= values
            assert any(torch.equal(out, shift(x, r, c)) for r in range(-4, 5) for c in range(-4, 5))
    assert seen == set(OPERATIONS)
    assert chosen_operations(5, OPERATIONS, "all") == OPERATIONS
    flip_only = augment(x, 1, ("flip",))
    assert torch.equal(flip_only, x) or torch.equal(flip_only, x.flip(-1))


def test_warm_start_continues_from_the_clients_previous_images():
    runtime = _runtime()
    algorithm = FedVCK(FedVCKParams(**{**FAST, "image_lr": 1e-6}, percent=10, hard_negatives=2),
                       _context(runtime))
    message = algorithm.broadcast(algorithm.init_server_state(runtime.initial_weights), 0)
    previous = {c: np.full((n, 1, 28, 28), 0.25, np.float32) for c, n in ((0, 10), (1, 5))}
    warm = algorithm.local_updates(runtime, [0], 1, message, [previous])[0]
    cold = algorithm.local_updates(runtime, [0], 1, message, [None])[0]
    assert np.allclose(warm.state[0], 0.25, atol=1e-3)  # a tiny step away from the old images
    assert not np.allclose(cold.state[0], 0.25, atol=0.5)


def test_latent_constraint_embeds_synthetic_images_with_the_running_statistics():
    runtime = _runtime()
    torch.manual_seed(0)
    real, syn = torch.randn(8, 1, 28, 28) * 2 + 1, torch.randn(6, 1, 28, 28)
    losses = {}
    for latent in (True, False):
        algorithm = FedVCK(FedVCKParams(**FAST, latent_constraint=latent, hard_negatives=2),
                           _context(runtime))
        model = runtime.model
        set_weights(model, runtime.initial_weights)
        modes = []
        hooks = [m.register_forward_hook(
            lambda m, i, o, seen=modes: seen.append((len(i[0]), m.training)))
                 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        loss = algorithm.matching_loss(runtime, model, 0, 0, {})
        losses[latent] = float(loss(real, syn, [4, 4], [3, 3]).detach())
        for hook in hooks:
            hook.remove()
        syn_modes = {training for size, training in modes if size == 6}
        assert syn_modes == ({False} if latent else {True})
    assert losses[True] != pytest.approx(losses[False])


def test_hard_negatives_default_fits_every_class_count():
    runtime = _runtime()
    for classes in (2, 3, 5, 11):
        info = DataInfo("fixture", "image", classes, (1, 28, 28), (0.5,), (0.5,))
        algorithm = FedVCK(FedVCKParams(**FAST), RunContext(0, info, MODEL, runtime.training, 2, 2))
        assert algorithm.hard_negatives == min(5, classes - 1)


def test_convnet_first_padding_three_ends_on_a_4x4_map_at_28_px():
    for padding, side in ((1, 3), (3, 4)):
        model = build_model(ConvNetParams(width=4, depth=3, first_padding=padding), INFO)
        assert model.features(torch.zeros(2, 1, 28, 28)).shape[-1] == side


def test_server_training_decays_the_learning_rate_at_half_and_augments_batches():
    model = build_model(ConvNetParams(width=8, depth=2, norm="none"), INFO)
    images = np.random.default_rng(0).integers(0, 256, (16, 28, 28), dtype=np.uint8)
    labels = np.arange(16) % 3
    inputs = []
    model.register_forward_pre_hook(lambda m, i: inputs.append(i[0].detach().clone()))
    lrs = []
    original = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        lrs.append(self.param_groups[0]["lr"])
        return original(self, *args, **kwargs)

    torch.optim.SGD.step = step
    try:
        settings = ServerTraining(4, 0.1, 0.0, 0.0, 16, lr_decay=0.1, augmentation=OPERATIONS)
        train_on_synthetic(model, images, labels, INFO, settings, torch.Generator().manual_seed(0))
    finally:
        torch.optim.SGD.step = original
    assert lrs == pytest.approx([0.1, 0.1, 0.01, 0.01])
    plain = to_tensor(images, INFO)
    assert not any(torch.equal(batch.sort(0).values, plain.sort(0).values) for batch in inputs)


# ----- FedVCK's two mechanisms, at three classes (switched off, these must fail) ----
def test_model_guided_selection_draws_real_samples_by_the_broadcast_models_errors():
    """Model-guided selection: within each class, a real sample is drawn with probability
    softmax(sigmoid(gamma (CE - b))) under the broadcast model (self-ensemble with the previous
    one), not uniformly: the hard samples dominate the draws."""
    runtime = _runtime()
    params = FedVCKParams(**FAST, hard_negatives=2, gamma=4.0, offset=1.0)
    algorithm = FedVCK(params, _context(runtime))
    before, now = (_fitted(runtime, steps) for steps in (20, 40))  # errors that differ by sample
    message = {"model": now, "previous": before}
    indices = runtime.client_indices[0]
    labels = runtime.train_y[indices]
    real = RealData(runtime.train_x, {c: indices[labels == c] for c in (0, 1)})
    model = runtime.model
    set_weights(model, now)
    selected, _ = algorithm.sampling(runtime, model, message, 0, real)
    assert selected.probabilities is not None

    def logits(weights) -> torch.Tensor:
        set_weights(model, weights)
        model.eval()
        with torch.no_grad():
            return model(to_tensor(runtime.train_x[indices], INFO))

    mixed = params.alpha * logits(now) + (1 - params.alpha) * logits(before)
    errors = torch.nn.functional.cross_entropy(mixed, torch.from_numpy(labels.astype(np.int64)),
                                               reduction="none")
    weights = torch.sigmoid(params.gamma * (errors - params.offset)).double()
    for cls in (0, 1):
        expected = torch.softmax(weights[torch.from_numpy(labels == cls)], 0).numpy()
        np.testing.assert_allclose(selected.probabilities[cls], expected, rtol=1e-5)
        assert expected.max() / expected.min() > 1.05  # not uniform
        if cls == 0:  # 100 samples, the widest spread of errors
            draws = selected.batch(cls, 20000, np.random.default_rng(0))
            hardest = real.by_class[cls][expected.argmax()]
            easiest = real.by_class[cls][expected.argmin()]
            assert (draws == hardest).sum() > 1.2 * (draws == easiest).sum()


def test_the_relational_contrastive_loss_changes_the_server_model():
    """L_rc in the server's training: at three classes (two hard negatives each), the same
    uploads give a different global model with beta > 0 than without the term."""
    runtime = _runtime()
    models = []
    for contrastive in (True, False):
        algorithm = FedVCK(FedVCKParams(**FAST, hard_negatives=2, beta=1.0,
                                        contrastive=contrastive), _context(runtime))
        models.append(_rounds(algorithm, runtime, 1)[0][1]["model"])
    with_rc, without_rc = models
    changed = [name for name in with_rc if np.issubdtype(with_rc[name].dtype, np.floating)
               and not np.allclose(with_rc[name], without_rc[name], atol=1e-6)]
    assert "classifier.weight" in changed or any("features" in n for n in changed), changed


def _fitted(runtime: ClientRuntime, steps: int) -> dict[str, np.ndarray]:
    """A model fitted for ``steps`` Adam steps to client 0's (random) data: it has memorised
    some samples and not others."""
    torch.manual_seed(steps)
    model = build_model(MODEL, INFO)
    x, y = runtime.client_data(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y.long()).backward()
        optimizer.step()
    return get_weights(model)
