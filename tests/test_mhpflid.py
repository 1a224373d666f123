"""MH-pFLID and model heterogeneity: the zoo, messenger, receiver/transmitter, the two stages,
messenger averaging, FedMD, per-client architectures and resolutions, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REAL_MEDMNIST
from fixtures import write_medmnist_npz
from test_bad_input import run_cli

from raysim.algorithms.base import RunContext
from raysim.algorithms.feddf import FedDF, FedDFParams, PFedDF
from raysim.algorithms.fedmd import FedMD, FedMDParams
from raysim.algorithms.mhpflid import MHpFLID, MHpFLIDParams
from raysim.algorithms.params import PFedDFParams
from raysim.algorithms.public_set import public_indices
from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, TrainingConfig
from raysim.data import load_dataset, stratified_subset
from raysim.data.dataset import DataInfo
from raysim.engine.runner import run_experiment
from raysim.models import MODELS, build_model
from raysim.models.messenger import InformationExchange, Messenger
from raysim.models.messenger_probes import probe_transmitter
from raysim.models.split import ZOO
from raysim.results import load
from raysim.training.context import ClientData
from raysim.training.runtime import ClientRuntime
from raysim.vectors.weights import get_weights, set_weights

GRAY = DataInfo("fixture", "image", 3, (1, 28, 28), (0.5,), (0.25,))
SMALL_MESSENGER = {"messenger_widths": [8, 8, 32], "messenger_hidden": 16}


def zoo_params(name: str):
    return MODELS[name].params()


@pytest.mark.parametrize("size", [28, 4])
def test_every_zoo_model_splits_into_body_and_head_at_any_input_size(size):
    info = DataInfo("x", "image", 3, (1, size, size), (0.5,), (0.25,))
    x = torch.randn(2, 1, size, size)
    counts = set()
    for name in ZOO:
        model = build_model(zoo_params(name), info).eval()
        features = model.body(x)
        assert features.ndim == 4 and features.shape[1] == model.feature_channels
        assert torch.equal(model.head(features), model(x)) and model(x).shape == (2, 3)
        counts.add(sum(p.numel() for p in model.parameters()))
    assert len(counts) == len(ZOO)  # eleven different architectures
    assert {"resnet5", "resnet8", "resnet11", "resnet17", "shufflenetv2", "resnext",
            "squeezenet", "senet", "mobilenetv2", "densenet", "vgg"} <= set(ZOO)


def test_messenger_follows_appendix_e():
    messenger = Messenger(1, 2)
    convs = [m for m in messenger.body if isinstance(m, torch.nn.Conv2d)]
    assert [(c.kernel_size[0], c.out_channels, c.stride[0]) for c in convs] == [
        (3, 64, 2), (5, 64, 2), (7, 512, 2)]
    pools = [m for m in messenger.body if isinstance(m, torch.nn.MaxPool2d)]
    assert [(p.kernel_size, p.stride) for p in pools] == [(3, 2), (3, 2)]
    assert messenger.body(torch.zeros(1, 1, 64, 64)).shape == (1, 512, 2, 2)
    head = list(messenger.head)
    assert (head[0].out_features, type(head[1]).__name__, head[3].out_features) == (
        256, "BatchNorm1d", 2)


@pytest.mark.parametrize("tokens", ["channel", "spatial"])
@pytest.mark.parametrize("query_from", ["messenger", "local"])
def test_attention_mixes_feature_tokens_never_samples(tokens, query_from):
    torch.manual_seed(0)
    exchange = InformationExchange(16, 32, query_from=query_from, mode="attention",
                                   tokens=tokens).eval()
    local, messenger = torch.randn(4, 16, 7, 7), torch.randn(4, 32, 2, 2)
    out = exchange(local, messenger)
    changed_local = local.clone()
    changed_local[3] = torch.randn_like(changed_local[3])
    out2 = exchange(changed_local, messenger)
    assert out.shape == (4, 32)
    assert torch.allclose(out[:3], out2[:3], atol=1e-6)  # other samples untouched
    assert not torch.allclose(out[3], out2[3])  # the changed sample's output depends on it


def _runtime(num_clients: int = 2, architectures=("resnet8", "shufflenetv2"),
             downsample=(), relabel_first_client: bool = False) -> ClientRuntime:
    torch.manual_seed(0)  # the first architecture's initial weights
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(48, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 3, size=48)
    if relabel_first_client:  # other data on client 0 only (it holds rows 0-23 of 2 clients)
        y[:48 // num_clients] = (y[:48 // num_clients] + 1) % 3
    archs = tuple(zoo_params(a) for a in architectures)
    return ClientRuntime(
        RunContext(0, GRAY, archs[0], TrainingConfig(batch_size=8), len(np.array_split(np.arange(48),
                   num_clients)), len(np.array_split(np.arange(48), num_clients)), archs, downsample),
        ClientData(x, y, np.array_split(np.arange(48), num_clients), get_weights(build_model(archs[0],
                   GRAY))),
        torch.device("cpu"))


def _algorithm(runtime: ClientRuntime, **params) -> MHpFLID:
    context = RunContext(0, GRAY, runtime.architectures[0], runtime.training, 2, 2,
                         runtime.architectures, runtime.downsample)
    return MHpFLID(MHpFLIDParams(**{**SMALL_MESSENGER, **params}), context)


def _changed(before: dict, after: dict) -> set[str]:
    return {k for k in before if not np.array_equal(before[k], after[k])}


def test_injection_trains_only_local_and_receiver_distillation_only_messenger_and_transmitter():
    runtime = _runtime()
    algorithm = _algorithm(runtime)
    server = algorithm.init_server_state({})
    state = algorithm._initial_state(runtime, 1)
    local, messenger, receiver, transmitter = algorithm._modules(runtime, 1)
    for module, weights in ((local, state["local"]), (messenger, server),
                            (receiver, state["receiver"]), (transmitter, state["transmitter"])):
        module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in weights.items()})
    snapshot = {name: get_weights(m) for name, m in
                (("local", local), ("messenger", messenger), ("receiver", receiver),
                 ("transmitter", transmitter))}
    algorithm._inject(runtime, 1, 0, local, messenger, receiver, state)
    after = {name: get_weights(m) for name, m in
             (("local", local), ("messenger", messenger), ("receiver", receiver),
              ("transmitter", transmitter))}
    assert _changed(snapshot["local"], after["local"]) and _changed(snapshot["receiver"],
                                                                    after["receiver"])
    assert not _changed(snapshot["messenger"], after["messenger"])  # frozen, BN stats too
    assert not _changed(snapshot["transmitter"], after["transmitter"])
    algorithm._distill(runtime, 1, 0, local, messenger, transmitter, state)
    final = {name: get_weights(m) for name, m in
             (("local", local), ("messenger", messenger), ("receiver", receiver),
              ("transmitter", transmitter))}
    assert not _changed(after["local"], final["local"])  # frozen, BN stats too
    assert not _changed(after["receiver"], final["receiver"])
    assert _changed(after["messenger"], final["messenger"]) and _changed(
        after["transmitter"], final["transmitter"])


@pytest.mark.parametrize("share_body,share_head", [(True, True), (True, False), (False, True)])
def test_server_averages_exactly_the_shared_messenger_parts(share_body, share_head):
    runtime = _runtime()
    algorithm = _algorithm(runtime, share_messenger_body=share_body,
                           share_messenger_head=share_head)
    server = algorithm.init_server_state({})
    message = algorithm.broadcast(server, 0)
    results = algorithm.local_updates(runtime, [0, 1], 0, message, [None, None])
    sent = set(message["messenger"])
    assert all(k.startswith("body.") == share_body or k.startswith("head.") == share_head
               for k in sent)
    assert all(set(r.upload["messenger"]) == sent for r in results)
    partial = algorithm.reduce(list(enumerate(results)))
    merged = algorithm.aggregate(server, [partial], 0)
    sizes = [r.num_samples for r in results]
    for key in sent:
        if merged[key].dtype.kind == "f":
            expected = sum(n * r.upload["messenger"][key].astype(np.float64)
                           for n, r in zip(sizes, results, strict=True)) / sum(sizes)
            assert np.allclose(merged[key], expected, atol=1e-6)
    for key in set(server) - sent:  # private parts stay with the clients
        assert np.array_equal(merged[key], server[key])
        assert all(key in r.state["private_messenger"] for r in results)


def test_downsampled_clients_train_and_cost_at_their_own_resolution():
    runtime = _runtime(4, ("resnet17", "resnet11", "resnet8", "resnet5"), (1, 2, 4, 8))
    assert [tuple(runtime.client_data(c)[0].shape[2:]) for c in range(4)] == [
        (28, 28), (14, 14), (7, 7), (4, 4)]
    algorithm = MHpFLID(MHpFLIDParams(), RunContext(
        0, GRAY, runtime.architectures[0], runtime.training, 4, 4, runtime.architectures,
        (1, 2, 4, 8)))
    table = algorithm.cost_table()
    clients = table[table["client"] >= 0]
    assert list(clients["input"]) == ["1x28x28", "1x14x14", "1x7x7", "1x4x4"]
    assert clients["mflops"].is_monotonic_decreasing
    messenger = table[table["model"] == "messenger"]
    assert len(messenger) == 4 and messenger["params"].nunique() == 1
    assert messenger["params"].iloc[0] == sum(p.numel() for p in Messenger(1, 3).parameters())


def test_fedmd_public_set_and_consensus():
    indices = [np.arange(0, 30), np.arange(30, 35), np.arange(35, 80)]
    public = public_indices(indices, 10, seed=3)
    assert len(public) == 10 + 5 + 10 and len(np.unique(public)) == len(public)
    assert np.array_equal(public, public_indices(indices, 10, seed=3))
    assert set(public[10:15]) == set(range(30, 35))
    runtime = _runtime()
    context = RunContext(0, GRAY, runtime.architectures[0], runtime.training, 2, 2,
                         runtime.architectures)
    algorithm = FedMD(FedMDParams(public_per_client=6), context)
    first = algorithm.local_updates(runtime, [0, 1], 0, {}, [None, None])
    assert all(r.upload["logits"].shape == (12, 3) for r in first)
    consensus = algorithm.aggregate(None, [algorithm.reduce(list(enumerate(first)))], 0)
    assert np.allclose(consensus["logits"],
                       (first[0].upload["logits"] + first[1].upload["logits"]) / 2, atol=1e-6)
    second = algorithm.local_updates(runtime, [0, 1], 1, algorithm.broadcast(consensus, 1),
                                     [r.state for r in first])
    assert all(np.isfinite(r.metrics["digest_loss"]) for r in second)


def test_train_subset_is_stratified_and_fixed():
    labels = np.repeat([0, 1, 2], [700, 200, 100])
    keep = stratified_subset(labels, 100)
    assert len(keep) == 100 and np.array_equal(np.bincount(labels[keep]), [70, 20, 10])
    assert np.array_equal(keep, stratified_subset(labels, 100))


def hetero_raw(root, algorithm: dict, workers: int = 1) -> dict:
    return {
        "name": "hetero-test",
        "dataset": {"name": "pneumoniamnist", "root": str(root), "download": False,
                    "verify_checksum": False},
        "partition": {"scheme": "iid", "num_clients": 3},
        "model": {"name": "resnet8"},
        "clients": {"architectures": ["resnet5", "shufflenetv2"], "assign": "cycle"},
        "algorithm": algorithm,
        "training": {"rounds": 2, "batch_size": 16, "optimizer": {"name": "adam", "lr": 0.003}},
        "seeds": [0],
        "engine": {"num_workers": workers, "cpus_per_worker": 1},
    }


def test_mhpflid_run_is_the_same_on_one_or_two_workers_and_counts_messenger_bytes(
        ray_session, tmp_path):
    root = tmp_path / "data"
    write_medmnist_npz(root, n_train=120, n_test=60)
    algorithm = {"name": "mhpflid", "injection_epochs": 1, "injection_lr": 0.003,
                 **SMALL_MESSENGER}
    evals = {}
    for workers in (1, 2):
        outcome = run_experiment(parse_config(hetero_raw(root, algorithm, workers)),
                                 output=str(tmp_path / f"w{workers}"), progress=False)[0]
        assert outcome.error is None, outcome.error
        evals[workers] = load(outcome.run_dir, "client_eval")
        communication = load(outcome.run_dir, "communication")
    first = evals[1]
    assert list(first[first["round"] == 1]["architecture"]) == ["resnet5", "shufflenetv2",
                                                                "resnet5"]
    columns = ["round", "client", "own_accuracy", "own_macro_f1", "global_loss"]
    assert first[columns].equals(evals[2][columns])
    messenger_bytes = sum(p.numel() * 4 for p in Messenger(1, 2, (8, 8, 32), 16).state_dict()
                          .values() if p.dtype == torch.float32)
    up = communication[(communication["direction"] == "up") & (communication["round"] == 0)]
    assert list(up["message_type"]) == ["messenger"]
    assert messenger_bytes * 3 <= up["bytes"].sum() <= messenger_bytes * 3 + 3 * 64


@pytest.mark.skipif(not (REAL_MEDMNIST / "pneumoniamnist.npz").exists(),
                    reason="real PneumoniaMNIST not present")
def test_heterogeneous_clients_learn_on_real_pneumonia(ray_session, tmp_path):
    raw = hetero_raw(REAL_MEDMNIST, {"name": "mhpflid", "injection_epochs": 2,
                                     "injection_lr": 0.001, **SMALL_MESSENGER})
    raw["dataset"]["train_subset"] = 600
    raw["partition"]["num_clients"] = 2
    outcome = run_experiment(parse_config(raw), output=str(tmp_path), progress=False)[0]
    assert outcome.error is None, outcome.error
    rounds = load(outcome.run_dir, "rounds")
    test_y = load_dataset(DatasetConfig(name="pneumoniamnist", root=str(REAL_MEDMNIST))).test_y
    majority = np.bincount(test_y).max() / len(test_y)  # 0.625
    assert rounds["accuracy"].iloc[-1] > majority + 0.1  # personal models on the test set


BAD_CASES = [
    ("unknown architecture", {"architectures": ["resnet17", "resnet99"]}, {}, "resnet99"),
    ("list shorter than the clients", {"architectures": ["resnet17", "vgg"]}, {},
     "clients.architectures lists 2 entries"),
    ("downsample list mismatch", {"downsample": [1, 2]}, {}, "clients.downsample lists 2"),
    ("loss weight above 1", {}, {"injection_local_weight": 1.5},
     "algorithm.injection_local_weight"),
    ("negative loss weight", {}, {"distillation_kl_weight": -0.1},
     "algorithm.distillation_kl_weight"),
]


@pytest.mark.parametrize("label,clients,algorithm,expected", BAD_CASES,
                         ids=[c[0] for c in BAD_CASES])
def test_bad_heterogeneous_configs_exit_2(capsys, tmp_path, label, clients, algorithm, expected):
    raw = hetero_raw(tmp_path, {"name": "mhpflid", **algorithm})
    raw["clients"] = clients
    raw["partition"]["num_clients"] = 3
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2, err
    assert expected in err and "Traceback" not in err


def test_shared_model_algorithms_refuse_per_client_architectures(capsys, tmp_path):
    root = tmp_path / "data"
    write_medmnist_npz(root, n_train=60, n_test=30)
    code, err = run_cli(capsys, tmp_path, hetero_raw(root, {"name": "fedavg"}))
    assert code == 2 and "trains one shared model" in err and "mhpflid" in err
    raw = hetero_raw(root, {"name": "mhpflid"})
    raw["clients"]["architectures"] = ["convnet"]
    code, err = run_cli(capsys, tmp_path, raw)
    assert code == 2 and "body and head" in err


def test_per_share_macro_f1_matches_scikit_learn():
    from sklearn.metrics import f1_score

    from raysim.training.evaluation import share_metrics

    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(4), size=300)
    labels = rng.integers(0, 4, 300)
    shares = [np.arange(0, 100), np.arange(100, 130), np.array([], dtype=int), np.arange(130, 300)]
    scores = share_metrics(probabilities, labels, shares)
    for client, share in enumerate(shares):
        if not len(share):
            assert np.isnan(scores["macro_f1"][client])
            continue
        predicted = probabilities[share].argmax(1)
        expected = f1_score(labels[share], predicted, average="macro", zero_division=0,
                            labels=np.unique(np.concatenate([labels[share], predicted])))
        assert scores["macro_f1"][client] == pytest.approx(expected)


def _probe(algorithm: MHpFLID, local_architecture: str = "resnet17"):
    torch.manual_seed(0)
    images = torch.randn(48, 1, 28, 28)
    local = build_model(zoo_params(local_architecture), GRAY).eval()
    messenger = algorithm.build_messenger().eval()
    transmitter = algorithm._build_exchange("transmitter", local.feature_channels)
    with torch.no_grad():
        return probe_transmitter(transmitter, local.body(images), messenger.feature_map(images))


@pytest.mark.parametrize("local_architecture", ["resnet17", "shufflenetv2"])
def test_transmitter_tokens_carry_messenger_and_local_information_at_28px(local_architecture):
    """The default design at 28 px: permuting the messenger's channels changes the transmitter's
    output, the output moves in many directions with the messenger's input (local input fixed)
    and moves with the local input (messenger fixed)."""
    runtime = _runtime()
    probe = _probe(_algorithm(runtime, messenger_widths=[16, 16, 64]), local_architecture)
    assert probe.permutation_change > 0.5
    assert probe.messenger_directions() >= 16
    assert probe.local_directions() >= 1


def test_token_probes_reject_the_degenerate_designs():
    """Channel tokens over a 1x1 messenger map (the old default): permutation-blind, 1-2
    directions. Spatial tokens over a 1x1 map: the output ignores the local features."""
    runtime = _runtime()
    channel = _probe(_algorithm(runtime, messenger_widths=[16, 16, 64], tokens="channel",
                                messenger_input_size=None))
    assert channel.permutation_change < 1e-3 and channel.messenger_directions() <= 2
    single_key = _probe(_algorithm(runtime, messenger_widths=[16, 16, 64],
                                   messenger_input_size=None))
    assert single_key.local_directions() == 0
    assert _algorithm(runtime).build_messenger().feature_map(
        torch.zeros(1, 1, 28, 28)).shape[2:] == (4, 4)  # the default: 16 spatial tokens


def _two_rounds(runtime: ClientRuntime, **params) -> list[list]:
    """Client results of rounds 0 and 1 of MH-pFLID on both clients of ``runtime``."""
    algorithm = _algorithm(runtime, **params)
    server = algorithm.init_server_state({})
    states: list = [None, None]
    rounds = []
    for round_ in range(2):
        results = algorithm.local_updates(runtime, [0, 1], round_,
                                          algorithm.broadcast(server, round_), states)
        server = algorithm.aggregate(server, [algorithm.reduce(list(enumerate(results)))],
                                     round_)
        states = [r.state for r in results]
        rounds.append(results)
    return rounds


def test_messenger_averaging_carries_one_clients_data_into_anothers_local_model():
    """Change client 0's labels only: client 1's local model is unchanged after round 0 (no
    exchange yet) and different after round 1, when it has injected the averaged messenger that
    client 0 distilled. Without messenger averaging, distillation or the injection's messenger
    term, client 1 would never see client 0's data."""
    params = {"injection_epochs": 1, "injection_lr": 0.003, "distillation_lr": 0.003}
    original = _two_rounds(_runtime(), **params)
    relabelled = _two_rounds(_runtime(relabel_first_client=True), **params)
    assert _changed(original[0][0].state["local"], relabelled[0][0].state["local"])  # client 0
    assert not _changed(original[0][1].state["local"], relabelled[0][1].state["local"])
    assert _changed(original[1][1].state["local"], relabelled[1][1].state["local"])
    assert all(r.metrics["messenger_change"] > 1e-3 for r in original[1])


def test_injection_messenger_term_changes_the_local_model():
    """The receiver's cross-entropy reaches the local body: the same injection with
    injection_messenger_weight 0 (local training alone) gives other local weights."""
    outcomes = []
    for weight in (0.1, 0.0):
        runtime = _runtime()
        algorithm = _algorithm(runtime, injection_epochs=1, injection_lr=0.003,
                               injection_messenger_weight=weight)
        result = algorithm.local_updates(runtime, [0], 0,
                                         algorithm.broadcast(algorithm.init_server_state({}), 0),
                                         [None])[0]
        outcomes.append(result.state["local"])
    body = [k for k in outcomes[0] if k.startswith("body.") and outcomes[0][k].dtype.kind == "f"]
    assert any(not np.allclose(outcomes[0][k], outcomes[1][k]) for k in body)


def _feddf(runtime: ClientRuntime, **params) -> FedDF:
    context = RunContext(0, GRAY, runtime.architectures[0], runtime.training,
                         len(runtime.client_indices), len(runtime.client_indices),
                         runtime.architectures, runtime.downsample)
    algorithm = FedDF(FedDFParams(**{"public_per_client": 8, **params}), context)
    algorithm.attach_server_inputs(runtime.train_x, runtime.client_indices)
    return algorithm


def _kl_to_teacher(algorithm: FedDF, runtime: ClientRuntime, client: int, weights,
                   teacher: np.ndarray) -> float:
    model = runtime.client_model(client)
    set_weights(model, weights)
    model.eval()
    with torch.no_grad():
        logits = model(runtime.client_inputs(client, algorithm._public))
    return float(torch.nn.functional.kl_div(torch.log_softmax(logits, 1),
                                            torch.log_softmax(torch.from_numpy(teacher), 1),
                                            reduction="batchmean", log_target=True))


def test_feddf_averages_each_architecture_group_then_distils_it_towards_the_ensemble():
    runtime = _runtime(3, ("resnet5", "shufflenetv2", "resnet5"))
    plain = _feddf(runtime, distillation_steps=0)
    assert plain.group_of_client == [0, 1, 0]
    results = plain.local_updates(runtime, [0, 1, 2], 0, {}, [None] * 3)
    assert all(r.upload["logits"].shape == (24, 3) for r in results)  # 3 clients x 8 public
    partial = plain.reduce(list(enumerate(results)))
    averaged = plain.aggregate({}, [partial], 0)
    sizes = [r.num_samples for r in results]
    for key, value in averaged["0"].items():  # group 0 = clients 0 and 2, sample-weighted
        if value.dtype.kind == "f":
            expected = (sizes[0] * results[0].upload["model"][key].astype(np.float64)
                        + sizes[2] * results[2].upload["model"][key]) / (sizes[0] + sizes[2])
            assert np.allclose(value, expected, atol=1e-5)
    assert all(np.array_equal(v, results[1].upload["model"][k]) for k, v in
               averaged["1"].items())  # a group of one keeps its model
    rng = np.random.default_rng(1)  # a confident ensemble the models do not yet agree with
    for upload in partial:
        upload["logits"] = rng.normal(0, 3, upload["logits"].shape).astype(np.float32)
    distilling = _feddf(runtime, distillation_steps=200)
    distilled = distilling.aggregate({}, [partial], 0)
    teacher = np.mean([u["logits"] for u in partial], axis=0)
    for group, client in (("0", 0), ("1", 1)):
        before = _kl_to_teacher(distilling, runtime, client, averaged[group], teacher)
        after = _kl_to_teacher(distilling, runtime, client, distilled[group], teacher)
        assert after < 0.5 * before, (group, before, after)
    message = distilling.broadcast(distilled, 1)
    again = distilling.local_updates(runtime, [1], 1, message, [None])[0]
    assert _changed(distilled["1"], again.upload["model"])  # local training starts from it


def test_pfeddf_keeps_the_fine_tuned_model_and_feddf_the_distilled_one():
    """pFedDF's personalization step: a client keeps (and is evaluated with) its group's
    distilled model after local training on its own data; FedDF keeps the distilled model as
    received. Everything uploaded is the same."""
    runtime = _runtime(3, ("resnet5", "shufflenetv2", "resnet5"))
    feddf = _feddf(runtime, distillation_steps=2)
    results = feddf.local_updates(runtime, [0, 1, 2], 0, {}, [None] * 3)
    distilled = feddf.aggregate({}, [feddf.reduce(list(enumerate(results)))], 0)
    message = feddf.broadcast(distilled, 1)
    context = feddf.context
    pfeddf = PFedDF(PFedDFParams(public_per_client=8, distillation_steps=2), context)
    pfeddf.attach_server_inputs(runtime.train_x, runtime.client_indices)
    plain = feddf.local_updates(runtime, [0, 1], 1, message, [None] * 2)
    tuned = pfeddf.local_updates(runtime, [0, 1], 1, message, [None] * 2)
    for client, kept, personal in zip([0, 1], plain, tuned, strict=True):
        received = distilled[str(feddf.group_of_client[client])]
        assert not _changed(received, feddf.personal_weights(kept.state))
        assert _changed(received, pfeddf.personal_weights(personal.state))  # fine-tuned
        assert not _changed(personal.upload["model"], pfeddf.personal_weights(personal.state))
        assert not _changed(kept.upload["model"], personal.upload["model"])  # same uploads
    first = feddf.local_updates(runtime, [2], 0, {}, [None])[0]  # a group's first round
    assert not _changed(runtime.client_initial_weights(2), first.state)


def test_feddf_runs_on_the_engine_with_the_server_holding_the_public_set(ray_session, tmp_path):
    root = tmp_path / "data"
    write_medmnist_npz(root, n_train=120, n_test=60)
    raw = hetero_raw(root, {"name": "feddf", "public_per_client": 10, "distillation_steps": 5},
                     workers=2)
    raw["evaluation"] = {"membership_audit": 6}  # the loss attack on each client's architecture
    outcome = run_experiment(parse_config(raw), output=str(tmp_path / "out"), progress=False)[0]
    assert outcome.error is None, outcome.error
    communication = load(outcome.run_dir, "communication")
    up = communication[communication["direction"] == "up"]
    assert set(up["message_type"]) == {"model", "logits"}
    down = communication[communication["direction"] == "down"]
    assert set(down[down["round"] == 1]["message_type"]) == {"models"}
    evals = load(outcome.run_dir, "client_eval")
    assert evals["own_accuracy"].notna().all() and len(evals) == 2 * 3
    audited = load(outcome.run_dir, "clients").dropna(subset=["mia_auc"])
    assert len(audited) == 3 and audited["mia_auc"].between(0, 1).all()


def test_fedmd_pretrains_on_the_labelled_public_set_once_and_digest_regresses_logits():
    runtime = _runtime()
    context = RunContext(0, GRAY, runtime.architectures[0], runtime.training, 2, 2,
                         runtime.architectures)
    runs = {}
    for epochs in (3, 0):
        algorithm = FedMD(FedMDParams(public_per_client=6, pretrain_epochs=epochs), context)
        runs[epochs] = algorithm.local_updates(runtime, [0, 1], 0, {}, [None, None])
    assert all("pretrain_loss" in r.metrics for r in runs[3])
    assert not any("pretrain_loss" in r.metrics for r in runs[0])
    assert _changed(runs[3][0].state[0], runs[0][0].state[0])
    second = algorithm.local_updates(runtime, [0], 1, {}, [runs[3][0].state])[0]
    assert "pretrain_loss" not in second.metrics  # only before the first round
    # the digest (l1, the authors' loss) pulls the public logits towards the consensus
    model = runtime.client_model(0)
    set_weights(model, runs[3][0].state[0])
    public = algorithm._public_inputs(runtime)
    consensus = np.random.default_rng(0).normal(0, 2, (12, 3)).astype(np.float32)

    def distance() -> float:
        model.eval()
        with torch.no_grad():
            return float(np.abs(model(public).numpy() - consensus).mean())

    before = distance()
    algorithm._digest(runtime, model, 0, 1, public, consensus, None)
    assert distance() < before


def test_heterogeneous_clients_are_placed_by_flops_times_samples():
    from raysim.rounds.placement import assign_groups, per_sample_costs

    architectures = ("resnet17", "shufflenetv2", "senet", "mobilenetv2")
    runtime = _runtime(4, architectures)
    algorithm = _algorithm(runtime)
    algorithm.context = RunContext(0, GRAY, runtime.architectures[0], runtime.training, 4, 4,
                                   runtime.architectures)
    costs = per_sample_costs(algorithm)
    table = algorithm.cost_table()
    messenger = float(table[table["model"] == "messenger"]["mflops"].iloc[0])
    own = table[table["client"] >= 0]["mflops"].to_numpy()
    assert np.allclose(costs, own + messenger)  # every client also trains the messenger
    assert costs.argmax() == 2 and costs.argmin() == 1  # SENet heaviest, ShuffleNet lightest
    loads = (np.full(4, 60) * costs).tolist()
    by_cost = [sum(loads[g] for g in owned) for owned in assign_groups(loads, 2)]
    by_size = [sum(loads[g] for g in owned) for owned in assign_groups([60.0] * 4, 2)]
    best = min(max(sum(loads[:cut]), sum(loads[cut:])) for cut in range(1, 4))
    assert max(by_cost) == best <= max(by_size)  # the best contiguous split by cost
    homogeneous = _algorithm(_runtime(2, ("resnet8", "resnet8")))
    homogeneous.context = RunContext(0, GRAY, runtime.architectures[0], runtime.training, 2, 2)
    assert per_sample_costs(homogeneous) is None
