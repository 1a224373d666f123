"""Seeds of one config on shared workers: their clients train in one vectorised call, with the
same numbers as separate runs."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
import torch
from conftest import SIGNAL_TESTS, quickstart_raw

from raysim.configuration.experiment import parse_config
from raysim.configuration.schema import DatasetConfig, OptimizerConfig
from raysim.data import load_dataset
from raysim.engine.pool.seed_groups import SeedGroup, plan_seed_groups
from raysim.engine.run import driver_turns as turns
from raysim.engine.runner import run_experiment
from raysim.models import build_model
from raysim.results import load
from raysim.training import merged_training
from raysim.training.merged_training import Rendezvous, VectorizedJob, train_merged
from raysim.training.runtime import batch_plans
from raysim.vectors.weights import get_weights

pytestmark = SIGNAL_TESTS

OPTIMIZER = OptimizerConfig(name="sgd", lr=0.05, momentum=0.9)


def _job(seed: int, clients: int = 5, size: int = 8, momentum: bool = False) -> VectorizedJob:
    """One run's clients of one size: the run's own initial model, data and batch plans."""
    dataset = load_dataset(DatasetConfig(name="breast-cancer"))
    torch.manual_seed(seed)
    model = build_model(parse_config(quickstart_raw()).model, dataset.info)
    rng = np.random.default_rng(seed)
    index = rng.choice(len(dataset.train_y), (clients, size), replace=False)
    inputs = torch.from_numpy(dataset.train_x[index.reshape(-1)]).float().reshape(
        clients, size, -1)
    start = get_weights(model)
    weights = [{k: v + 0.01 * i for k, v in start.items()} for i in range(clients)]
    buffers = [rng.standard_normal(sum(v.size for v in start.values())).astype(np.float32)
               if momentum else None for _ in range(clients)]
    plan = batch_plans(size, 4, 2, None, seed, 3, np.arange(clients))
    return VectorizedJob(model, weights, buffers, inputs,
                         torch.from_numpy(dataset.train_y[index]), plan, OPTIMIZER)


def _assert_same(result, expected) -> None:
    (weights, momentum, losses), (weights_0, momentum_0, losses_0) = result, expected
    np.testing.assert_array_equal(losses, losses_0)
    for w, w0 in zip(weights, weights_0, strict=True):
        np.testing.assert_array_equal(w.vector, w0.vector)
    for m, m0 in zip(momentum, momentum_0, strict=True):
        np.testing.assert_array_equal(m, m0)


@pytest.mark.parametrize("momentum", [False, True])
def test_one_call_for_several_runs_gives_each_run_its_own_numbers(momentum):
    jobs = [_job(seed, clients=3 + seed, momentum=momentum) for seed in range(3)]
    merged, shared = train_merged(jobs)
    assert shared == [True, True, True]
    for job, result in zip(jobs, merged, strict=True):
        _assert_same(result, job.train())


def test_jobs_of_other_shapes_or_with_a_proximal_anchor_train_alone():
    other_size = _job(1, size=12)
    anchored = _job(2)
    anchored.prox = (get_weights(anchored.model), 0.1)
    _, shared = train_merged([_job(0), other_size, anchored])
    assert shared == [False, False, False]


class _CountingTrainer:
    """Counts the vectorised calls the rendezvous makes."""

    def __init__(self, monkeypatch):
        self.calls: list[int] = []
        real = merged_training.train_vectorized

        def counted(model, weights, *args, **kwargs):
            self.calls.append(len(weights))
            return real(model, weights, *args, **kwargs)

        monkeypatch.setattr(merged_training, "train_vectorized", counted)


def _hand_in(rendezvous: Rendezvous, slot: int, job: VectorizedJob, out: dict) -> None:
    with rendezvous.holding():
        out[slot] = rendezvous.train(slot, [job])


def test_rendezvous_waits_for_every_bound_run_and_trains_them_in_one_call(monkeypatch):
    counter = _CountingTrainer(monkeypatch)
    rendezvous = Rendezvous(window_s=30.0)  # runs are waited for, not timed out
    jobs = {slot: _job(slot, clients=2 + slot) for slot in range(3)}
    for slot in jobs:
        rendezvous.bind(slot)
    out: dict = {}
    threads = [threading.Thread(target=_hand_in, args=(rendezvous, slot, job, out))
               for slot, job in jobs.items()]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # the runs arrive one after another
    for thread in threads:
        thread.join(timeout=20)
    assert counter.calls == [2 + 3 + 4]  # one call with every run's clients
    for slot, job in jobs.items():
        _assert_same(out[slot][0], job.train())
        assert rendezvous.stats[slot].as_dict() == {"jobs": 1, "merged_jobs": 1, "calls": 1}


def test_rendezvous_does_not_wait_longer_than_its_window_for_an_absent_run(monkeypatch):
    counter = _CountingTrainer(monkeypatch)
    rendezvous = Rendezvous(window_s=0.05)
    rendezvous.bind(0)
    rendezvous.bind(1)  # bound, but its driver does not send anything
    out: dict = {}
    started = time.monotonic()
    _hand_in(rendezvous, 0, _job(0), out)
    assert time.monotonic() - started < 10
    assert counter.calls == [5]
    assert rendezvous.stats[0].as_dict() == {"jobs": 1, "merged_jobs": 0, "calls": 1}
    rendezvous.unbind(1)
    _hand_in(rendezvous, 0, _job(0), out)  # alone now: trained without waiting
    assert counter.calls == [5, 5]


def test_a_run_waits_for_its_turn_until_the_other_run_waits_for_ray():
    order: list[str] = []
    first_in, second_ran = threading.Event(), threading.Event()

    def first() -> None:
        with turns.taking_turns():
            order.append("first works")
            first_in.set()
            time.sleep(0.2)  # the second run is ready meanwhile, but this is not its turn
            order.append("first still works")
            with turns.released():  # as in turns.get
                second_ran.wait(timeout=10)
            order.append("first resumes")

    def second() -> None:
        first_in.wait(timeout=10)
        with turns.taking_turns():
            order.append("second works")
            second_ran.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert order == ["first works", "first still works", "second works", "first resumes"]


def test_seeds_that_would_wait_form_seed_groups_of_at_most_the_free_slots():
    config = parse_config(quickstart_raw(seeds=[0, 1, 2]))
    queue = [("", seed) for seed in config.seeds]
    seed_groups = plan_seed_groups(queue, {"": config}, concurrent_runs=2)
    assert seed_groups == {("", 0): SeedGroup("", (0, 1)), ("", 1): SeedGroup("", (0, 1)),
                       ("", 2): SeedGroup("", (2,))}
    assert plan_seed_groups(queue, {"": config}, concurrent_runs=3) == {}  # all fit at once
    never = parse_config(quickstart_raw(seeds=[0, 1, 2], engine={"merge_seeds": "never"}))
    assert plan_seed_groups(queue, {"": never}, concurrent_runs=1) == {}
    many = parse_config(quickstart_raw(seeds=list(range(20))))
    sizes = {c.seeds: len(c.seeds) for c in plan_seed_groups(
        [("", s) for s in range(20)], {"": many}, concurrent_runs=1).values()}
    assert sorted(sizes.values()) == [6, 7, 7]  # at most 8 runs per worker process


def _w3_like(merge: str) -> dict:
    raw = quickstart_raw(
        dataset={"name": "synthetic"},
        partition={"scheme": "iid", "num_clients": 60, "samples_per_client": 4},
        training={"rounds": 8, "local_steps": 1, "local_epochs": None, "batch_size": 4,
                  "clients_per_round": 30, "optimizer": {"name": "sgd", "lr": 0.05,
                                                         "momentum": 0.0}},
        evaluation={"every": 4},
        seeds=[0, 1, 2],
        engine={"num_workers": 2, "cpus_per_worker": 2, "client_groups": 8,
                "merge_seeds": merge},  # 4 test CPUs: one run at a time, or all three merged
    )
    raw["model"] = {"name": "mlp", "hidden": [16]}
    return raw


def test_seeds_on_shared_workers_give_the_numbers_of_separate_runs(ray_session, tmp_path):
    tables = {}
    for merge in ("never", "auto"):
        outcomes = run_experiment(parse_config(_w3_like(merge)),
                                  output=str(tmp_path / merge), progress=False)
        assert all(o.error is None for o in outcomes)
        tables[merge] = {o.seed: (load(o.run_dir), load(o.run_dir, "clients"),
                                  json.loads((o.run_dir / "manifest.json").read_text()))
                         for o in outcomes}
    merged_jobs = 0
    for seed in (0, 1, 2):
        (rounds, clients, _), (rounds_m, clients_m, manifest) = (tables["never"][seed],
                                                                 tables["auto"][seed])
        for column in ("accuracy", "loss", "train_loss", "bytes_up", "bytes_down"):
            np.testing.assert_array_equal(rounds[column].to_numpy(), rounds_m[column].to_numpy())
        np.testing.assert_array_equal(clients["train_loss"].to_numpy(),
                                      clients_m["train_loss"].to_numpy())
        assert manifest["merged_training"]["jobs"] == 8 * 2  # a job per round and worker
        merged_jobs += manifest["merged_training"]["merged_jobs"]
        assert "merged_training" not in tables["never"][seed][2]
    assert merged_jobs > 0  # clients of different seeds did train in one call
    manifests = [tables["auto"][seed][2] for seed in (0, 1, 2)]
    assert len({m["driver"]["pid"] for m in manifests}) == 1  # one driver process
    assert len({tuple(w["pid"] for w in m["workers"]) for m in manifests}) == 1


@pytest.mark.parametrize("process", ["driver", "worker"])
def test_a_seed_group_recovers_when_its_shared_driver_or_worker_process_dies(ray_session, tmp_path,
                                                                         process):
    from test_resilience import _run_and_kill

    raw = _w3_like("auto")
    raw["training"]["rounds"] = 30
    raw["engine"].update(flush_seconds=0, checkpoint_every=5, checkpoint_seconds=0, checkpoint_share=0)
    config = parse_config(raw)
    pid = (lambda m: m["driver"]["pid"]) if process == "driver" else \
        (lambda m: m["workers"][0]["pid"])
    _, killed = _run_and_kill(config, tmp_path / "killed", after_rounds=8, process=pid)
    clean = run_experiment(parse_config({**raw, "engine": {**raw["engine"],
                                                           "merge_seeds": "never"}}),
                           output=str(tmp_path / "clean"), progress=False)
    assert killed
    for seed, outcome in zip((0, 1, 2), clean, strict=True):
        run_dir = next((tmp_path / "killed").glob(f"*/seed_{seed}"))
        manifest = json.loads((run_dir / "manifest.json").read_text())
        assert manifest["status"] == "completed"
        rounds = load(run_dir)
        assert rounds["round"].tolist() == list(range(30))
        for column in ("accuracy", "loss", "train_loss"):
            np.testing.assert_array_equal(rounds[column].to_numpy(),
                                          load(outcome.run_dir)[column].to_numpy())


def test_a_shared_worker_trains_each_call_with_its_runs_threads_whatever_thread_runs_it(
        monkeypatch):
    """torch's thread count is per OS thread (OpenMP); a worker process shared by several runs
    runs each call in one of its pool's threads, so every call, not only the run's configure,
    must set it: a thread that had run torch ops before would otherwise keep its own count
    (float reductions split otherwise: other numbers from the same seed)."""
    from concurrent.futures import ThreadPoolExecutor

    from raysim.algorithms import ALGORITHMS
    from raysim.engine.pool.worker_host import WorkerHost
    from raysim.engine.run import worker as worker_module
    from raysim.engine.run.worker import ClientWorker, WorkerSetup
    from raysim.preparation import initial_weights, prepare, run_context

    monkeypatch.setattr(worker_module, "pick_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(ClientWorker, "describe",  # (no Ray here)
                        lambda self: {"threads": torch.get_num_threads()})
    config = parse_config(_w3_like("auto"))
    dataset, partition = prepare(config, None)[0]
    arrays = {"train_x": dataset.train_x, "train_y": dataset.train_y,
              "test_x": dataset.test_x, "test_y": dataset.test_y}
    default = ThreadPoolExecutor(1).submit(torch.get_num_threads).result()
    threads = default + 1  # not what a fresh thread has
    setup = WorkerSetup(ALGORITHMS[config.algorithm.name], config.algorithm,
                        run_context(config, dataset, 0, partition.num_clients), arrays,
                        partition, initial_weights(config, dataset, 0), 64, threads=threads)
    host = WorkerHost()
    before = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(1) as configuring, ThreadPoolExecutor(1) as serving:
            serving.submit(lambda: torch.ones(1 << 20).sum()).result()  # OpenMP set up there
            configuring.submit(host.call, 0, "configure", setup, 0).result()
            seen = serving.submit(
                lambda: host.call(0, "describe")["threads"]).result()
    finally:
        torch.set_num_threads(before)
    assert seen == threads
