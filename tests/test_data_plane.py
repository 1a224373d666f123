"""The device data plane: client weights stay torch tensors on the worker's device,
a worker sends one partial (its subtrees of the fixed reduction tree), the server merges in
place, the workers' clients' data is resident on the device (or on the host with a notice
when it does not fit), and 1, 2, 3 or 4 workers give the same bits."""

from __future__ import annotations

import pickle
import shutil
from typing import Any

import numpy as np
import pytest
import torch

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import parse_config
from raysim.engine.run import worker as worker_module
from raysim.engine.run.worker import ClientWorker, WorkerSetup
from raysim.preparation import initial_weights, prepare, run_context
from raysim.rounds.placement import assign_groups, client_groups
from raysim.training import resident_data
from raysim.vectors.reduction_tree import combine
from raysim.vectors.weighted_sum import WeightedSum, weighted_mean
from raysim.vectors.weights import FlatWeights, on_device

HIDDEN = [64]


def _config(clients: int, vectorize: str, algorithm: str = "fedavg",
            model: dict | None = None, compile_step: str = "never",
            per_round: int | None = None) -> Any:
    return parse_config({
        "name": "plane", "dataset": {"name": "breast-cancer"},
        "partition": {"scheme": "iid", "num_clients": clients, "samples_per_client": 4},
        "model": model or {"name": "mlp", "hidden": HIDDEN},
        "algorithm": {"name": algorithm},
        "training": {"rounds": 2, "local_steps": 2, "batch_size": 2,
                     "clients_per_round": per_round,
                     "optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.5}},
        "engine": {"vectorize": vectorize, "client_groups": 16, "compile_step": compile_step},
        "seeds": [0]})


def _workers(config: Any, num_workers: int, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[list[ClientWorker], np.ndarray, np.ndarray]:
    """In-process ClientWorkers configured as the driver configures Ray actors, with their
    groups placed as the driver places them."""
    monkeypatch.setattr(worker_module, "pick_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ClientWorker, "describe", lambda self: {})
    dataset, partition = prepare(config, None)[0]
    arrays = {"train_x": dataset.train_x, "train_y": dataset.train_y,
              "test_x": dataset.test_x, "test_y": dataset.test_y}
    setup = WorkerSetup(ALGORITHMS[config.algorithm.name], config.algorithm,
                        run_context(config, dataset, 0, partition.num_clients), arrays,
                        partition, initial_weights(config, dataset, 0), 64, threads=1,
                        vectorize=config.engine.vectorize,
                        compile_step=config.engine.compile_step)
    groups = client_groups(partition.num_clients, config.engine.client_groups)
    owned = assign_groups([float(len(g)) for g in groups], num_workers)
    group_of = np.concatenate([np.full(len(g), i) for i, g in enumerate(groups)])
    worker_of = np.empty(partition.num_clients, dtype=np.int64)
    for w, gs in enumerate(owned):
        for g in gs:
            worker_of[groups[g]] = w
    workers = []
    for w in range(num_workers):
        worker = ClientWorker()
        worker.configure(setup, w)
        mine = np.flatnonzero(worker_of == w)
        worker.set_groups(mine, group_of[mine])
        workers.append(worker)
    return workers, worker_of, group_of


def _round(workers: list[ClientWorker], worker_of: np.ndarray, message: dict, round_: int,
           clients: np.ndarray) -> tuple[Any, list[int]]:
    """One round as the driver runs it: each worker's reply pickled (the object store), the
    subtrees combined; returns the root and the number of partials per worker."""
    replies = [pickle.loads(pickle.dumps(w.run_round(round_, message, clients[worker_of[
        clients] == i]))) for i, w in enumerate(workers)]
    algorithm = workers[0].algorithm
    root = combine([s for r in replies for s in r.groups], algorithm.merge)
    return root, [len(r.groups) for r in replies]


@pytest.mark.parametrize("vectorize", ["never", "always"])
def test_one_partial_per_worker_and_the_same_bits_for_1_to_4_workers(monkeypatch, vectorize):
    config = _config(64, vectorize)
    clients = np.arange(0, 64, 2)  # a sampled half of the clients
    means = []
    for num_workers in (1, 2, 3, 4):
        workers, worker_of, _ = _workers(config, num_workers, monkeypatch)
        message = {"model": workers[0].runtime.initial_weights}
        root, partials = _round(workers, worker_of, message, 0, clients)
        if num_workers in (1, 2, 4):  # aligned ranges: exactly one subtree per worker
            assert partials == [1] * num_workers
        else:  # unaligned ranges: a few subtrees, still in the worker's one reply
            assert max(partials) <= 2 * 4
        assert isinstance(root, WeightedSum)
        means.append(root.mean())
    for other in means[1:]:
        for name in means[0]:
            assert np.array_equal(means[0][name], other[name]), name


@pytest.mark.skipif(shutil.which("g++") is None,
                    reason="torch.compile on CPUs needs a C++ compiler (g++)")
def test_compiled_steps_are_compiled_before_the_first_round_and_the_same_bits_for_1_or_2_workers(
        monkeypatch, tmp_path):
    """Half the clients train each round: each worker compiles, while set up, the client
    counts a uniform draw gives it, and the round compiles nothing more."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    config = _config(8, "always", compile_step="always", per_round=4)
    means = []
    for num_workers in (1, 2):
        workers, worker_of, _ = _workers(config, num_workers, monkeypatch)
        assert all(w.runtime.compile_step for w in workers)
        graphs = counters["stats"]["unique_graphs"]
        message = {"model": workers[0].runtime.initial_weights}
        root, _ = _round(workers, worker_of, message, 0, np.array([0, 2, 5, 7]))
        assert counters["stats"]["unique_graphs"] == graphs  # compiled while set up
        means.append(root.mean())
    for name in means[0]:
        assert np.array_equal(means[0][name], means[1][name]), name


def test_server_merge_adds_in_place_without_new_arrays():
    models = [{"w": np.full(3, float(i), dtype=np.float32)} for i in range(4)]
    first = WeightedSum.of(models[:2], [1.0, 1.0])
    second = WeightedSum.of(models[2:], [1.0, 1.0])
    storage = first.vector.data_ptr()
    merged = first.merge(second)
    assert merged is first and merged.vector.data_ptr() == storage
    assert np.array_equal(weighted_mean([merged])["w"], np.full(3, 1.5, dtype=np.float32))


def _whole_vector_sum(models: list[dict[str, np.ndarray]], weights: list[float]
                      ) -> torch.Tensor:
    """A group's sum the way raysim computed it before blocks: one whole float64 vector from
    zero, each model copied into a float64 scratch vector and added with its weight."""
    total = torch.zeros(sum(v.size for v in models[0].values()), dtype=torch.float64)
    scratch = torch.empty_like(total)
    for model, weight in zip(models, weights, strict=True):
        start = 0
        for value in model.values():
            stop = start + value.size
            total[start:stop].add_(scratch[start:stop].copy_(torch.from_numpy(value).reshape(-1)),
                                   alpha=weight)
            start = stop
    return total


@pytest.mark.parametrize(("block", "threads"), [(5, 1), (64, 1), (1 << 17, 1), (5, 3),
                                               (8, 2), (1 << 17, 3)])
def test_blocked_sums_and_merges_give_the_whole_vector_bits(monkeypatch, block, threads):
    """Group sums merged along a tree, with a partial read back from the object store (read
    only) in it, evaluated in blocks that cut entries and models apart, the blocks split
    between threads as on a driver host with spare CPUs: the same float64 bits as whole-vector
    sums and in-place merges (float32 and float64 entries, an integer one), and the mean's
    float32 bits of dividing the whole vector."""
    from raysim.vectors import blocked_sum
    from raysim.vectors.reduction_tree import reduce_span
    monkeypatch.setattr(blocked_sum, "CPU_BLOCK_VALUES", block)
    monkeypatch.setattr(blocked_sum, "_threads", [1])
    assert blocked_sum.set_threads(threads) == threads
    rng = np.random.default_rng(3)

    def model() -> dict[str, np.ndarray]:
        return {"a": rng.normal(size=(7, 3)).astype(np.float32),
                "b": rng.normal(size=11).astype(np.float32),
                "steps": rng.integers(0, 9, size=2),
                "scale": rng.normal(size=4)}

    groups = [[model() for _ in range(size)] for size in (1, 3, 2, 1, 4)]
    weights = [[float(rng.integers(1, 9)) for _ in group] for group in groups]
    expected = [_whole_vector_sum(g, w) for g, w in zip(groups, weights, strict=True)]
    reference = reduce_span(dict(enumerate(expected)), (0, 8), lambda x, y: x.add_(y))
    partials = {i: WeightedSum.of(g, w) for i, (g, w) in enumerate(
        zip(groups, weights, strict=True))}
    buffers: list[pickle.PickleBuffer] = []  # as the object store does: read-only buffers
    pickled = pickle.dumps(partials[2], protocol=5, buffer_callback=buffers.append)
    partials[2] = pickle.loads(pickled, buffers=[b.raw().toreadonly() for b in buffers])
    assert not partials[2].owned
    root = reduce_span(partials, (0, 8), lambda x, y: x.merge(y))
    assert root.vector.dtype == torch.float64
    assert torch.equal(root.vector, reference)
    assert root.total_weight == sum(map(sum, weights))
    mean = root.mean()
    expected_a = (reference[:21] / root.total_weight).float().numpy().reshape(7, 3)
    assert np.array_equal(mean["a"], expected_a)
    expected_b = (reference[21:32] / root.total_weight).float().numpy()
    assert np.array_equal(mean["b"], expected_b)


def test_the_driver_adds_read_only_roots_in_one_pass_with_the_bits_of_copy_then_add():
    """The driver's merge of workers' roots read from the object store: a new vector holding
    left + right (then + the rest), the same bits as copying the left and adding in place."""
    rng = np.random.default_rng(5)
    vectors = [rng.normal(size=300_001) for _ in range(3)]
    copies = [v.copy() for v in vectors]
    entries = (("w", (300_001,), "float32"),)
    for vector in vectors:
        vector.flags.writeable = False
    roots = [WeightedSum(torch.from_numpy(v), 2.0, entries, owned=False) for v in vectors]
    merged = roots[0].merge(roots[1]).merge(roots[2])
    expected = torch.from_numpy(vectors[0]).clone().add_(torch.from_numpy(vectors[1]))
    expected.add_(torch.from_numpy(vectors[2]))
    assert torch.equal(merged.vector, expected) and merged.total_weight == 6.0
    assert all(merged.vector.data_ptr() != torch.from_numpy(v).data_ptr() for v in vectors)
    assert all(np.array_equal(v, c) for v, c in zip(vectors, copies, strict=True))  # unwritten


@pytest.mark.parametrize("vectorize", ["never", "always"])
def test_weights_cross_to_the_host_a_constant_number_of_times_per_worker_round(
        monkeypatch, vectorize):
    """A spy on every tensor -> numpy conversion of weight-sized tensors (a whole model's
    vector or one of its larger entries): one worker's FedAvg
    round (local work, reduce, merge, its reply pickled for the object store) converts as
    many for 64 clients as for 8, not one per client."""
    counts = {}
    original = torch.Tensor.numpy
    # a tensor at least as large as the model's largest parameter: weights, not losses
    parameters = max(p.numel() for p in _model(_config(8, vectorize)).parameters())

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> np.ndarray:
        if self.numel() >= parameters:
            counts["n"] = counts.get("n", 0) + 1
        return original(self, *args, **kwargs)

    conversions = []
    for clients in (8, 64):
        config = _config(clients, vectorize)
        workers, worker_of, _ = _workers(config, 1, monkeypatch)
        message = {"model": workers[0].runtime.initial_weights}
        _round(workers, worker_of, message, 0, np.arange(clients))  # warm
        counts.clear()
        monkeypatch.setattr(torch.Tensor, "numpy", spy)
        _round(workers, worker_of, message, 1, np.arange(clients))
        monkeypatch.setattr(torch.Tensor, "numpy", original)
        conversions.append(counts.get("n", 0))
    assert conversions[0] == conversions[1] <= 2, conversions


def _model(config: Any) -> torch.nn.Module:
    from raysim.data import load_dataset
    from raysim.models import build_model

    return build_model(config.model, load_dataset(config.dataset).info)


def test_trained_clients_are_device_tensors_that_pickle_as_numpy(monkeypatch):
    config = _config(8, "never")
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    trained = runtime.train_many([0, 1], 0, [runtime.initial_weights] * 2, [None, None])
    weights = trained[0][0]
    assert isinstance(weights, FlatWeights) and isinstance(weights.vector, torch.Tensor)
    assert weights.vector.device == runtime.device
    restored = pickle.loads(pickle.dumps(weights))
    assert isinstance(restored.vector, np.ndarray)
    for name in weights:
        assert np.array_equal(restored[name], weights[name])


def test_client_data_is_resident_unless_it_exceeds_the_cap(monkeypatch):
    config = _config(16, "never")
    workers, _, _ = _workers(config, 2, monkeypatch)
    runtime = workers[0].runtime
    assert runtime.resident is not None and runtime.resident.resident
    held = runtime.client_data(0)
    host_x = runtime.train_x[runtime.client_indices[0]]
    assert torch.equal(held[0], torch.from_numpy(host_x.astype(np.float32)))
    baseline = [w.run_round(0, {"model": runtime.initial_weights}, np.arange(8) if i == 0
                            else np.arange(8, 16)) for i, w in enumerate(workers)]

    monkeypatch.setenv(resident_data.CAP_ENV, "16")  # bytes: nothing fits
    capped, _, _ = _workers(config, 2, monkeypatch)
    held_back = capped[0].runtime.resident
    assert held_back is not None and not held_back.resident
    assert "does not fit" in str(held_back.describe()["data_notice"])
    replies = [w.run_round(0, {"model": runtime.initial_weights}, np.arange(8) if i == 0
                           else np.arange(8, 16)) for i, w in enumerate(capped)]
    for reply, base in zip(replies, baseline, strict=True):  # the same numbers either way
        assert np.array_equal(reply.groups[0].partial.vector, base.groups[0].partial.vector)


def _digits_config():
    """Four clients of six digit images (uint8 inputs, normalised when used)."""
    return parse_config({
        "name": "plane", "dataset": {"name": "digits"},
        "partition": {"scheme": "iid", "num_clients": 4, "samples_per_client": 6},
        "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "fedavg"},
        "training": {"rounds": 1}, "seeds": [0]})


def test_image_data_is_normalised_on_the_device_as_on_the_host(monkeypatch):
    config = _digits_config()
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    from raysim.data.dataset import to_tensor

    x, y = runtime.client_data(2)
    indices = runtime.client_indices[2]
    assert runtime.resident is not None and runtime.resident.x.dtype == torch.uint8
    assert torch.equal(x, to_tensor(runtime.train_x[indices], runtime.info))
    assert torch.equal(y, torch.from_numpy(runtime.train_y[indices]))


def test_a_clients_normalised_data_is_kept_on_a_cpu_within_its_budget(monkeypatch):
    config = _digits_config()
    from raysim.data.dataset import to_tensor

    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    first, again = runtime.client_data(1), runtime.client_data(1)
    assert first[0] is again[0]  # normalised once, then reused
    fresh = to_tensor(runtime.train_x[runtime.client_indices[1]], runtime.info)
    assert torch.equal(again[0], fresh)
    assert runtime.client_data(2)[0] is not first[0]  # each client its own

    monkeypatch.setattr(resident_data, "NORMALISED_CACHE_BYTES", 0)  # no budget: every use
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    first, again = runtime.client_data(1), runtime.client_data(1)
    assert first[0] is not again[0] and torch.equal(first[0], again[0])


def test_rgb_images_are_normalised_channels_first_with_the_values_of_the_definition():
    """(x / 255 - mean) / std per channel, in float32, moved to NCHW: computed independently
    in numpy, bit for bit."""
    from raysim.data.dataset import DataInfo, normalise

    info = DataInfo("rgb", "image", 3, (3, 5, 4), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    stored = np.random.default_rng(0).integers(0, 256, (7, 5, 4, 3), dtype=np.uint8)
    expected = ((stored.astype(np.float32) / np.float32(255.0)
                 - np.array(info.mean, dtype=np.float32))
                / np.array(info.std, dtype=np.float32)).transpose(0, 3, 1, 2)
    out = normalise(torch.from_numpy(stored), info)
    assert out.dtype == torch.float32 and out.is_contiguous() and out.shape == (7, 3, 5, 4)
    assert np.array_equal(out.numpy(), expected)


def test_the_vectorised_gather_normalises_a_workers_rows_once_within_the_budget(monkeypatch):
    """Gathers of many clients' rows (the vectorised path's, every round) read a normalised
    copy of the worker's rows made at the first gather, with the values of normalising the
    gathered rows; without budget for it, every gather normalises its rows."""
    config = _digits_config()
    from raysim.data.dataset import to_tensor

    calls = []
    original = resident_data.normalise
    monkeypatch.setattr(resident_data, "normalise",
                        lambda batch, info: calls.append(len(batch)) or original(batch, info))
    for budget, normalisations in ((resident_data.NORMALISED_CACHE_BYTES, 1), (0, 3)):
        monkeypatch.setattr(resident_data, "NORMALISED_CACHE_BYTES", budget)
        workers, _, _ = _workers(config, 1, monkeypatch)
        runtime = workers[0].runtime
        calls.clear()
        for clients in ([0, 2], [1, 3], [3, 0, 1]):
            rows = np.concatenate([runtime.client_indices[c] for c in clients])
            x, y = runtime.gather(rows)
            assert torch.equal(x, to_tensor(runtime.train_x[rows], runtime.info))
            assert torch.equal(y, torch.from_numpy(runtime.train_y[rows]))
        assert len(calls) == normalisations


def test_a_vectorised_steps_rows_are_the_clients_planned_rows():
    from raysim.training.vectorized import step_rows

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(4, 6, 2, 3, generator=generator)
    targets = torch.randint(0, 5, (4, 6), generator=generator)
    rng = np.random.default_rng(0)
    plan = [np.stack([rng.permutation(6)[:size] for _ in range(4)]) for size in (3, 3, 2)]
    clients = torch.arange(4)[:, None]
    steps = list(step_rows(inputs, targets, plan))
    assert len(steps) == len(plan)
    for positions, (x, y) in zip(plan, steps, strict=True):
        index = torch.from_numpy(positions)
        assert torch.equal(x, inputs[clients, index]) and torch.equal(y, targets[clients, index])


def test_a_gpu_keeps_normalised_data_only_within_what_the_data_cap_leaves():
    """On a GPU the normalised inputs are kept too, but the resident rows and the kept inputs
    together stay within the data's share of the worker's memory cap."""
    cuda, cpu, mib = torch.device("cuda"), torch.device("cpu"), 2**20
    budget = resident_data.NORMALISED_CACHE_BYTES
    assert resident_data.normalised_cache_bytes(cuda, 10_000 * mib, 100 * mib) == budget
    assert resident_data.normalised_cache_bytes(cuda, 300 * mib, 100 * mib) == 200 * mib
    assert resident_data.normalised_cache_bytes(cuda, 100 * mib, 100 * mib) == 0
    assert resident_data.normalised_cache_bytes(cuda, None, 100 * mib) == budget
    assert resident_data.normalised_cache_bytes(cpu, 300 * mib, 100 * mib) == budget

    # a device other than the CPU ("meta": shapes only) keeps a client's normalised inputs
    from raysim.data.dataset import DataInfo

    info = DataInfo("images", "image", 2, (1, 4, 4), (0.5,), (0.5,))
    rows = np.zeros((6, 4, 4), dtype=np.uint8)
    indices = [np.arange(0, 3), np.arange(3, 6)]
    meta = torch.device("meta")
    held = resident_data.ResidentData(rows, np.zeros(6, dtype=np.int64), indices, [0, 1], info,
                                      meta, cap_bytes=mib)
    assert held.resident and held.client(1)[0] is held.client(1)[0]
    full = resident_data.ResidentData(rows, np.zeros(6, dtype=np.int64), indices, [0, 1], info,
                                      meta, cap_bytes=held.nbytes)  # the rows fill the cap
    assert full.resident and full.client(1)[0] is not full.client(1)[0]


_FAULTS_PER_BLOCK = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from raysim.rounds.process_memory import keep_freed_memory
    assert keep_freed_memory()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def round_():  # a worker round: 40 trained clients' 4 MiB weights held, then freed
    held = [torch.ones(2**20) for _ in range(40)]
    del held
round_(); round_()
before = faults(); round_()
print((faults() - before) / 40)
"""


def _faults_per_block(mode: str) -> float:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _FAULTS_PER_BLOCK, mode], check=True,
                          capture_output=True, text=True)
    return float(done.stdout.split()[-1])


def test_a_worker_reuses_freed_weight_buffers_without_page_faults():
    """keep_freed_memory (called by every client worker and driver host): a round's freed
    client weights are reused by the next round's without faulting their pages in again."""
    if not sys_is_glibc_linux():
        pytest.skip("glibc's mallopt is Linux-only")
    default = _faults_per_block("default")
    if default < 500:
        pytest.skip(f"this allocator keeps freed blocks anyway ({default} faults per block)")
    assert _faults_per_block("keep") < default / 10, default


def sys_is_glibc_linux() -> bool:
    import platform

    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.parametrize("name", ["feddc", "fedsm", "mhpflid"])
def test_client_states_move_to_the_host_with_a_notice_when_they_exceed_the_cap(
        monkeypatch, tmp_path, name):
    """Per-client persistent states stay device tensors while they fit; over the cap (forced
    with a tiny one through the test hook) they move to the host with a notice, and the run's
    numbers do not change."""
    from algorithm_configs import contract_raw
    from fixtures import write_medmnist_npz

    from raysim.training import resident_states

    write_medmnist_npz(tmp_path, n_train=90, n_test=30)
    config = parse_config(contract_raw(tmp_path, name))
    runs = []
    for cap in (None, "1"):
        if cap is None:
            monkeypatch.delenv(resident_states.CAP_ENV, raising=False)
        else:
            monkeypatch.setenv(resident_states.CAP_ENV, cap)
        workers, worker_of, _ = _workers(config, 2, monkeypatch)
        server = ALGORITHMS[config.algorithm.name](config.algorithm, workers[0].setup.context)
        state = server.init_server_state(workers[0].runtime.initial_weights)
        clients = np.arange(3)
        notices = []
        for round_ in range(3):
            message = server.broadcast(state, round_)
            replies = [w.run_round(round_, message, clients[worker_of == i])
                       for i, w in enumerate(workers)]
            notices += [r.notice for r in replies if r.notice]
            root = combine([s for r in replies for s in r.groups], server.merge)
            state = server.aggregate(state, [] if root is None else [root], round_)
        held = {c: s for w in workers for c, s in w.client_states.items()}
        runs.append((state, held, notices))
    (free_state, free_held, free_notices), (capped_state, capped_held, capped_notices) = runs
    assert free_notices == [] and len(capped_notices) == 2  # once per worker
    assert "exceed its device memory cap" in capped_notices[0]
    assert sorted(free_held) == sorted(capped_held) == [0, 1, 2]
    # on a CPU the host copy is observable as numpy-backed FlatWeights (models)
    assert {type(v) for s in free_held.values() for v in _model_vectors(s)} == {torch.Tensor}
    assert {type(v) for s in capped_held.values() for v in _model_vectors(s)} == {np.ndarray}
    from inprocess import flatten

    for a, b in zip(flatten((free_state, free_held)), flatten((capped_state, capped_held)),
                    strict=True):
        assert np.array_equal(a, b)


def _model_vectors(state: Any) -> list[Any]:
    """The vectors of every FlatWeights inside a client state."""
    if isinstance(state, FlatWeights):
        return [state.vector]
    if isinstance(state, dict):
        return [v for value in state.values() for v in _model_vectors(value)]
    if isinstance(state, (list, tuple)):
        return [v for value in state for v in _model_vectors(value)]
    return []


LARGE = [512, 512]  # an MLP of 280 K values: past weights.RELEASE_MIN_VALUES


def test_a_trained_client_takes_over_the_models_vector_and_the_next_client_starts_clean(
        monkeypatch):
    """On the per-client loop a large model's first step reads the start itself (no copy of
    it into the model), its trained state is handed over without a copy (the result is the
    storage the model trained in from the second step on), each client's result is its own
    vector, and the numbers equal training each client alone, in any order (the resident
    model is re-set, never aliased with an earlier client's result)."""
    config = _config(4, "never", model={"name": "mlp", "hidden": LARGE})
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    start = runtime.initial_weights
    alone = {c: runtime.train_many([c], 0, [start], [None])[0][0].vector.clone()
             for c in range(4)}

    used = []  # the storage of the model's first parameter while each client trains
    runtime.model.register_forward_pre_hook(
        lambda module, _: used.append(next(module.parameters()).data_ptr()))
    on_device = runtime.on_device([start])[0]
    for order in ([0, 1, 2, 3], [3, 1, 2, 0]):
        used.clear()
        trained = runtime.train_many(order, 0, [on_device] * 4, [None] * 4)
        vectors = [weights.vector for weights, _ in trained]
        assert len({v.data_ptr() for v in vectors}) == 4
        assert used[::2] == [on_device.vector.data_ptr()] * 4  # two steps each: the first
        assert [v.data_ptr() for v in vectors] == used[1::2]  # from the start; no copy
        for client, vector in zip(order, vectors, strict=True):
            assert torch.equal(vector, alone[client])


@pytest.mark.parametrize(("momentum", "weight_decay", "mu"),
                         [(0.0, 0.0, 0.0), (0.9, 0.0, 0.0), (0.0, 1e-2, 0.0), (0.9, 1e-2, 0.1)])
def test_a_first_step_written_from_the_start_gives_the_bits_of_copying_the_start(
        monkeypatch, momentum, weight_decay, mu):
    """SGD's first step written from the start into the client's own vector gives the
    weights and momentum buffers of copying the start into the model and letting torch's
    optimizer step (plain SGD, momentum, weight decay, a proximal term; three steps), and
    leaves the start as it was."""
    from raysim.training.first_step import FirstStepFromStart

    raw = _config(3, "never", model={"name": "mlp", "hidden": LARGE})
    config = raw.model_copy(update={"training": raw.training.model_copy(update={
        "local_steps": 3, "optimizer": raw.training.optimizer.model_copy(
            update={"momentum": momentum, "weight_decay": weight_decay})})})
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    start = runtime.on_device([runtime.initial_weights])[0]
    before = start.vector.clone()
    results = {}
    for way in ("from start", "copied"):
        if way == "copied":
            monkeypatch.setattr(FirstStepFromStart, "bind", classmethod(lambda *_: None))
        results[way] = runtime.train_many([0, 1, 2], 0, [start] * 3, [None] * 3,
                                          prox=(start, mu))
    assert torch.equal(start.vector, before)
    for (ours, our_outcome), (theirs, their_outcome) in zip(*results.values(), strict=True):
        assert torch.equal(ours.vector, theirs.vector)
        assert our_outcome.mean_loss == their_outcome.mean_loss
        if momentum == 0:  # nothing to carry to the next round
            assert our_outcome.optimizer_state is None is their_outcome.optimizer_state
            continue
        ours_state = our_outcome.optimizer_state["state"]
        theirs_state = their_outcome.optimizer_state["state"]
        assert ours_state.keys() == theirs_state.keys() and theirs_state
        for key, state in theirs_state.items():
            assert torch.equal(ours_state[key]["momentum_buffer"], state["momentum_buffer"])


def test_a_model_bound_to_its_start_that_takes_no_step_ends_on_its_own_copy():
    """A client that takes no step (training stopped before it) leaves the model on its own
    vector holding the start's values, never on the start's storage."""
    from raysim.configuration.schema import OptimizerConfig
    from raysim.data.dataset import DataInfo
    from raysim.models import build_model
    from raysim.training.first_step import FirstStepFromStart
    from raysim.vectors.weights import flat_state, release_state

    info = DataInfo("p", "tabular", 3, (30,), (0.0,), (1.0,))
    params = parse_config({"name": "m", "dataset": {"name": "synthetic"},
                           "model": {"name": "mlp", "hidden": LARGE},
                           "algorithm": {"name": "fedavg"}}).model
    model = build_model(params, info)
    start = flat_state(model)
    start.vector.add_(1.0)
    bound = FirstStepFromStart.bind(model, start, OptimizerConfig(), None)
    assert bound is not None
    assert next(model.parameters()).data_ptr() == start.vector.data_ptr()
    bound.finish()
    state = release_state(model)
    assert state.vector.data_ptr() != start.vector.data_ptr()
    assert torch.equal(state.vector, start.vector)
    # a start of the same size in another layout is loaded the plain way, never bound
    other = FlatWeights(start.vector.clone(), tuple(reversed(start.layout)))
    assert FirstStepFromStart.bind(model, other, OptimizerConfig(), None) is None


def test_off_the_cpu_a_large_model_is_copied_in_and_out_never_rebound(monkeypatch):
    """Handing a model's vector over and writing the first step from the start are for large
    vectors on a CPU only: on a GPU (here torch's meta device) the copy they save is one
    short kernel. A start off the CPU is not bound (the optimizer steps the plain way), and a
    model whose vector does not qualify hands over a copy and keeps its own vector. Fails
    when either choice ignores the device."""
    from raysim.configuration.schema import OptimizerConfig
    from raysim.data.dataset import DataInfo
    from raysim.models import build_model
    from raysim.training import first_step
    from raysim.training.first_step import FirstStepFromStart
    from raysim.vectors import weights

    large = weights.RELEASE_MIN_VALUES
    assert weights.saves_a_pass(torch.zeros(large))
    assert not weights.saves_a_pass(torch.zeros(large - 1))
    assert not weights.saves_a_pass(torch.empty(large, device="meta"))

    info = DataInfo("p", "tabular", 3, (30,), (0.0,), (1.0,))
    params = parse_config({"name": "m", "dataset": {"name": "synthetic"},
                           "model": {"name": "mlp", "hidden": LARGE},
                           "algorithm": {"name": "fedavg"}}).model
    model = build_model(params, info)
    own = weights.bound_vector(model)
    start = weights.flat_state(model)
    assert weights.release_state(model).vector is own  # on the CPU: handed over
    bound = FirstStepFromStart.bind(model, start, OptimizerConfig(), None)  # and bound
    assert bound is not None
    bound.finish()
    own = weights.bound_vector(model)
    monkeypatch.setattr(weights, "saves_a_pass", lambda vector: False)  # as on a GPU
    monkeypatch.setattr(first_step, "saves_a_pass", lambda vector: False)
    assert FirstStepFromStart.bind(model, start, OptimizerConfig(), None) is None
    assert weights.bound_vector(model) is own
    released = weights.release_state(model)
    assert released.vector is not own and torch.equal(released.vector, own)
    assert weights.bound_vector(model) is own


@pytest.mark.parametrize("name", ["convnet", "shufflenetv2"])
def test_binding_a_model_to_a_flat_vector_changes_no_number(name):
    """A model whose state is bound to one flat vector trains to the same bits as the same
    model left alone: a BatchNorm ConvNet (bound; its running statistics update the vector)
    and a channels-last ShuffleNet (its one-channel weights look contiguous but steer the
    convolutions' memory format: never bound)."""
    from raysim.data.dataset import DataInfo
    from raysim.models import build_model
    from raysim.training.memory_format import place
    from raysim.vectors.weights import flat_state, get_weights, set_weights

    info = DataInfo("p", "image", 3, (1, 28, 28), (0.5,), (0.25,))
    params = parse_config({"name": "m", "dataset": {"name": "synthetic"},
                           "model": {"name": name, **({"norm": "batch"} if name == "convnet"
                                                      else {})},
                           "algorithm": {"name": "fedavg"}}).model
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(place(build_model(params, info), torch.device("cpu"), "auto"))
    bound, alone = models
    set_weights(bound, flat_state(bound))  # binds where it can
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(8, 1, 28, 28, generator=generator)
    y = torch.randint(0, 3, (8,), generator=generator)
    for model in models:
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    bound_state, alone_state = get_weights(bound), get_weights(alone)
    assert all(np.array_equal(bound_state[k], alone_state[k]) for k in alone_state)
    assert not np.array_equal(bound_state["body.0.1.running_mean" if name == "shufflenetv2"
                                          else next(k for k in bound_state if "running_mean"
                                                    in k)], np.zeros(1))


def test_a_rounds_batch_plans_are_each_clients_own_draw(monkeypatch):
    """The batch positions the loop draws for all clients of a round at once equal each
    client's own draw (clients of two sizes, two epochs)."""
    from raysim.training.runtime import batch_plans

    config = parse_config({
        "name": "plane", "dataset": {"name": "breast-cancer"},
        "partition": {"scheme": "iid", "num_clients": 6},
        "model": {"name": "mlp", "hidden": [8]}, "algorithm": {"name": "fedavg"},
        "training": {"rounds": 1, "local_epochs": 2, "batch_size": 5}, "seeds": [0]})
    workers, _, _ = _workers(config, 1, monkeypatch)
    runtime = workers[0].runtime
    clients = [5, 0, 3, 1, 4]
    sizes = [len(runtime.client_indices[c]) for c in clients]
    assert len(set(sizes)) > 1
    plans = runtime.round_plans(clients, 2)
    for client, size, plan in zip(clients, sizes, plans, strict=True):
        own = batch_plans(size, 5, 2, None, 0, 2, np.array([client]))
        assert len(plan) == len(own) and all(
            np.array_equal(a, b[0]) for a, b in zip(plan, own, strict=True))


def test_step_losses_summed_on_the_host_give_the_bits_of_accumulating_them_on_the_device():
    """A client's reported loss is the sum over steps of loss x batch size. The loop keeps the
    step losses on the device and :func:`losses_to_host` sums them on the host, step after
    step in float32 from zero: the same bits as ``total += loss * size`` into a zero tensor
    (what the loop did per step before), for clients of 1 to 3,000 steps."""
    from raysim.training.runtime import StepLosses, losses_to_host

    rng = np.random.default_rng(5)
    clients, expected = [], []
    for steps in (1, 2, 7, 200, 61, 3000):
        losses = [torch.tensor(float(v), dtype=torch.float32)
                  for v in rng.gamma(2.0, 1.3, size=steps)]
        sizes = [int(v) for v in rng.integers(1, 33, size=steps)]
        total = torch.zeros((), dtype=torch.float32)
        for loss, size in zip(losses, sizes, strict=True):
            total += loss * size
        clients.append(StepLosses(losses, sizes))
        expected.append(float(total))
    assert losses_to_host(clients) == expected
    assert losses_to_host([StepLosses([], []), clients[0]]) == [0.0, expected[0]]


def test_the_per_client_loop_waits_for_its_device_once_per_round_not_once_per_client(
        monkeypatch):
    """On a GPU, a copy from host memory to the device, or a read of a value on the device
    back to the host, makes the host wait for every kernel queued before it. A spy on both
    (the batch positions' transfers, and reads of losses: ``float``, ``item`` and
    :func:`losses_to_host`) in one worker's FedAvg round on the per-client loop: one of each
    for the round, for 8 clients as for 64, so the host queues each client's kernels while
    the device still runs the previous client's."""
    from raysim.training import runtime as runtime_module

    counts = {"transfers": 0, "reads": 0}

    def counting(kind: str, function: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[kind] += 1
            return function(*args, **kwargs)
        return counted

    spies = [(runtime_module, "plans_on_device", "transfers"),
             (runtime_module, "losses_to_host", "reads"),
             (torch.Tensor, "__float__", "reads"), (torch.Tensor, "item", "reads")]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in spies]
    waits = []
    for clients in (8, 64):
        config = _config(clients, "never")
        workers, worker_of, _ = _workers(config, 1, monkeypatch)
        message = {"model": workers[0].runtime.initial_weights}
        _round(workers, worker_of, message, 0, np.arange(clients))  # warm
        counts.update(transfers=0, reads=0)
        for (owner, name, kind), (_, _, original) in zip(spies, originals, strict=True):
            monkeypatch.setattr(owner, name, counting(kind, original))
        _round(workers, worker_of, message, 1, np.arange(clients))
        for owner, name, original in originals:
            monkeypatch.setattr(owner, name, original)
        waits.append(dict(counts))
    assert waits[0] == waits[1] == {"transfers": 1, "reads": 1}, waits


def test_a_clients_batches_are_gathered_once_per_round_with_the_bits_of_one_gather_per_step(
        monkeypatch):
    """The per-client loop takes a client's round of batches (here 4 steps) from one gather of
    its inputs and one of its labels, not two per step (on a GPU two kernel launches per
    step), and trains to the same bits as gathering every batch on its own (what it does when
    the round's rows would take more than ``GATHER_ONCE_BYTES``)."""
    from raysim.training import vectorized as vectorized_module

    config = parse_config({**_config(6, "never").model_dump(mode="json"),
                           "partition": {"scheme": "iid", "num_clients": 6,
                                         "samples_per_client": 8},
                           "training": {"rounds": 2, "local_epochs": 1, "batch_size": 2,
                                        "optimizer": {"name": "sgd", "lr": 0.1}}})
    (worker,), _, _ = _workers(config, 1, monkeypatch)
    runtime = worker.runtime
    start = runtime.initial_weights
    gathers = [0]
    original = torch.Tensor.index_select

    def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        gathers[0] += 1
        return original(self, *args, **kwargs)

    def trained() -> list[torch.Tensor]:
        gathers[0] = 0
        monkeypatch.setattr(torch.Tensor, "index_select", counted)
        result = runtime.train_many([0, 1, 2], 1, [start] * 3, [None] * 3)
        monkeypatch.setattr(torch.Tensor, "index_select", original)
        assert [outcome.steps for _, outcome in result] == [4, 4, 4]
        return [torch.as_tensor(weights.vector).clone() for weights, _ in result]

    once = trained()
    assert gathers[0] == 3 * 2  # inputs and labels, once per client
    monkeypatch.setattr(vectorized_module, "GATHER_ONCE_BYTES", 0)
    per_step = trained()
    assert gathers[0] == 3 * 4 * 2
    assert all(torch.equal(a, b) for a, b in zip(once, per_step, strict=True))
    assert not torch.equal(once[0], torch.as_tensor(on_device(start, torch.device("cpu")).vector))


@pytest.mark.parametrize("vectorize", ["always", "never"])
def test_a_client_trains_to_the_same_bits_in_any_call_that_holds_it(vectorize, monkeypatch):
    """The FedBuff layer trains a worker's clients once per start version, anchored there
    (FedProx): each client gets the bits it would get in one call with all of them, on the
    batched path and on the per-client loop; the anchor matters."""
    config = _config(9, vectorize, "fedprox")
    (worker,), _, _ = _workers(config, 1, monkeypatch)
    runtime = worker.runtime
    start = on_device(initial_weights(config, prepare(config, None)[0][0], 0),
                      torch.device("cpu"))
    other = FlatWeights(torch.as_tensor(start.vector) * 1.5, start.layout, start.extras)
    clients = list(range(9))
    mu = 2.0

    def vectors(trained):
        return [weights.vector.clone() for weights, _ in trained]

    together = vectors(runtime.train_many(clients, 2, [start] * 9, [None] * 9, prox=(start, mu)))
    for members in (clients[:4], clients[4:7], clients[7:]):
        alone = vectors(runtime.train_many(members, 2, [start] * len(members),
                                           [None] * len(members), prox=(start, mu)))
        for client, vector in zip(members, alone, strict=True):
            assert torch.equal(together[client], vector)
    elsewhere = vectors(runtime.train_many(clients, 2, [start] * 9, [None] * 9,
                                           prox=(other, mu)))
    assert not any(torch.equal(elsewhere[c], together[c]) for c in clients)


def test_a_configured_worker_leaves_the_imported_objects_out_of_full_collections(monkeypatch):
    """A full garbage collection walks every tracked object; after its first configure a
    worker has moved the objects alive then (torch's, Ray's modules) out of the collector's
    reach (``gc.freeze``), once per process: the runs' own objects are what later
    collections walk."""
    import gc

    from raysim.rounds import process_memory as memory

    gc.unfreeze()
    monkeypatch.setattr(memory.PROCESS, "frozen", False)
    try:
        tracked = len(gc.get_objects())
        workers, _, _ = _workers(_config(4, "auto"), 1, monkeypatch)
        frozen = gc.get_freeze_count()
        assert frozen > 0.9 * tracked and len(gc.get_objects()) < 0.1 * frozen
        workers[0].configure(workers[0].run_setup, 0)  # a later run freezes nothing more
        assert gc.get_freeze_count() <= frozen  # (frozen objects are still freed)
    finally:
        gc.unfreeze()
