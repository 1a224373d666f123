"""End-to-end behaviour of the Ray engine (one local Ray instance for the module)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import REAL_MEDMNIST, quickstart_raw
from fixtures import write_medmnist_npz

from raysim.configuration.experiment import parse_config
from raysim.engine.runner import run_experiment
from raysim.results import load
from raysim.results.report import summary_table


def run(raw, tmp_path, **kwargs):
    config = parse_config(raw)
    outcomes = run_experiment(config, output=str(tmp_path), progress=False, **kwargs)
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    return outcomes


def test_one_and_three_workers_give_identical_metrics(ray_session, tmp_path):
    base = quickstart_raw(
        dataset={"name": "digits"}, model={"name": "convnet", "width": 8, "depth": 2},
        partition={"num_clients": 12, "beta": 0.3, "min_size": 10},
        training={"rounds": 3, "clients_per_round": 7, "batch_size": 16},
        algorithm={"name": "fedprox", "mu": 0.01},
    )
    tables = {}
    for workers in (1, 3):
        raw = {**base, "engine": {"num_workers": workers, "cpus_per_worker": 1}}
        outcome = run(raw, tmp_path / f"w{workers}")[0]
        rounds = load(outcome.run_dir, "rounds")
        clients = load(outcome.run_dir, "clients")
        tables[workers] = (rounds, clients, json.loads((outcome.run_dir / "manifest.json")
                                                        .read_text())["workers"])
    (r1, c1, w1), (r3, c3, w3) = tables[1], tables[3]
    assert len(w1) == 1 and len(w3) == 3
    metrics = ["round", "accuracy", "macro_f1", "auc", "loss", "train_loss", "bytes_up"]
    pd.testing.assert_frame_equal(r1[metrics], r3[metrics])
    keyed = ["round", "client", "train_loss", "num_samples", "steps"]
    pd.testing.assert_frame_equal(c1[keyed].sort_values(["round", "client"]).reset_index(drop=True),
                                  c3[keyed].sort_values(["round", "client"]).reset_index(drop=True))
    assert c1["client"].nunique() > 7  # sampling picked different clients across rounds


def test_runs_reuse_pooled_actors_and_give_the_numbers_of_fresh_ones(ray_session, tmp_path):
    """Runs of one process share worker and driver actors (no start-up per run); a run served
    by actors that served other runs gives the numbers of one on fresh actors."""
    from raysim.engine.pool.shared_actors import POOL

    first = quickstart_raw(dataset={"name": "digits"}, training={"rounds": 3},
                           model={"name": "convnet", "width": 8, "depth": 2},
                           engine={"num_workers": 2, "cpus_per_worker": 1})
    other = {**first, "algorithm": {"name": "local"}, "model": {"name": "mlp", "hidden": [16]}}
    POOL.clear()
    # local-only keeps client states on the workers: the second local run must not see the
    # first one's
    outcomes = [run(raw, tmp_path / f"run{i}")[0] for i, raw in enumerate([first, other, other])]
    POOL.clear()  # the first config again, on fresh actors
    outcomes.append(run(first, tmp_path / "fresh")[0])
    pids = [sorted(w["pid"] for w in json.loads((o.run_dir / "manifest.json").read_text())
                   ["workers"]) for o in outcomes]
    assert pids[0] == pids[1] == pids[2] and set(pids[3]).isdisjoint(pids[0])
    tables = [load(o.run_dir, "rounds") for o in outcomes]
    metrics = ["accuracy", "macro_f1", "auc", "loss", "train_loss"]
    pd.testing.assert_frame_equal(tables[1][metrics], tables[2][metrics])
    pd.testing.assert_frame_equal(tables[0][metrics], tables[3][metrics])
    assert not np.allclose(tables[0]["accuracy"], tables[1]["accuracy"])
    from raysim.engine.startup_phases import startup_phases

    phases = [startup_phases(json.loads((o.run_dir / "manifest.json").read_text()))
              for o in outcomes]
    assert all(p is not None and min(p.values()) >= 0 for p in phases)
    assert all(p["first_round"] >= p["imports"] + p["data"] + p["ray"] + p["workers"]
               for p in phases)


def test_fedavg_learns_breast_cancer_within_quickstart_budget(ray_session, tmp_path):
    outcome = run(quickstart_raw(), tmp_path)[0]
    rounds = load(outcome.run_dir)
    assert rounds["accuracy"].iloc[-1] >= 0.90
    assert rounds["round"].tolist() == list(range(30))
    assert (rounds["bytes_down"] == rounds["bytes_up"]).all()  # every client gets and sends a model


def test_convnet_on_generated_medmnist_npz_learns_above_chance(ray_session, tmp_path):
    write_medmnist_npz(tmp_path / "data", "pneumoniamnist", n_train=300, n_test=200)
    raw = quickstart_raw(
        dataset={"name": "pneumoniamnist", "root": str(tmp_path / "data"),
                 "verify_checksum": False, "download": False},
        model={"name": "convnet", "width": 16, "depth": 3, "norm": "instance"},
        partition={"scheme": "iid", "num_clients": 4},
        training={"rounds": 4, "batch_size": 16,
                  "optimizer": {"name": "sgd", "lr": 0.02, "momentum": 0.9}},
    )
    raw["model"] = {"name": "convnet", "width": 16, "depth": 3}
    rounds = load(run(raw, tmp_path / "out")[0].run_dir)
    assert rounds["accuracy"].iloc[-1] >= 0.8  # chance is about 0.5


@pytest.mark.skipif(not (REAL_MEDMNIST / "pneumoniamnist.npz").exists(),
                    reason="real MedMNIST files not present")
def test_convnet_learns_real_pneumoniamnist(ray_session, tmp_path):
    raw = quickstart_raw(
        dataset={"name": "pneumoniamnist", "root": str(REAL_MEDMNIST), "download": False},
        partition={"scheme": "iid", "num_clients": 5},
        training={"rounds": 2, "batch_size": 32,
                  "optimizer": {"name": "sgd", "lr": 0.01, "momentum": 0.9}},
    )
    raw["model"] = {"name": "convnet", "width": 16, "depth": 3}
    rounds = load(run(raw, tmp_path)[0].run_dir)
    majority = 390 / 624
    assert rounds["accuracy"].iloc[-1] >= majority + 0.1
    assert rounds["auc"].iloc[-1] >= 0.85


def test_parquet_readable_while_run_continues(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 60}, engine={"flush_seconds": 0.0})
    raw["model"] = {"name": "mlp", "hidden": [256, 256]}
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(out=run(raw, tmp_path)))
    thread.start()
    seen_partial = False
    deadline = time.time() + 120
    while thread.is_alive() and time.time() < deadline:
        if list(tmp_path.glob("*/seed_0/rounds/part-*.parquet")):
            partial = load(next(tmp_path.glob("*/seed_0")))
            if 0 < len(partial) < 60:
                seen_partial = True
                assert partial["round"].tolist() == list(range(len(partial)))
        time.sleep(0.05)
    thread.join()
    assert seen_partial
    final = load(result["out"][0].run_dir)
    assert final["round"].tolist() == list(range(60))  # every round exactly once


def test_four_quarter_gpu_workers_share_one_gpu(ray_session, tmp_path):
    raw = quickstart_raw(training={"rounds": 2},
                         engine={"num_workers": 4, "cpus_per_worker": 0.5, "gpus_per_worker": 0.25})
    outcome = run(raw, tmp_path)[0]
    workers = json.loads((outcome.run_dir / "manifest.json").read_text())["workers"]
    assert len(workers) == 4
    assert all(w["gpu_ids"] == ["0"] for w in workers)  # Ray's logical GPU 0, shared
    if torch.cuda.is_available():  # each worker on the GPU, its memory capped to a quarter
        assert all(w["device"] == "cuda" and w["gpu_memory_fraction"] == 0.25 for w in workers)
    else:  # no CUDA: the CPU twin runs, with no memory share
        assert all(w["device"] == "cpu" and "gpu_memory_fraction" not in w for w in workers)


def test_seeds_run_concurrently_each_with_its_own_driver(ray_session, tmp_path):
    raw = quickstart_raw(seeds=[0, 1, 2], training={"rounds": 5},
                         engine={"num_workers": 1, "cpus_per_worker": 1})
    outcomes = run(raw, tmp_path)
    assert [o.seed for o in outcomes] == [0, 1, 2]
    assert len({o.run_dir.parent for o in outcomes}) == 1
    rounds = load(outcomes[0].run_dir.parent)
    starts = rounds.groupby("seed")["wall_time"].min()
    ends = rounds.groupby("seed")["wall_time"].max()
    assert starts.max() < ends.min() + 60  # sanity: all seeds ran in this invocation
    table = summary_table(rounds)
    assert table["seeds"].tolist() == [3] and table["accuracy_std"].iloc[0] > 0
    parts = [pd.read_parquet(o.run_dir / "partition.parquet") for o in outcomes]
    assert not parts[0].equals(parts[1])  # each seed draws its own partition


def test_local_only_and_centralized(ray_session, tmp_path):
    local = run(quickstart_raw(algorithm={"name": "local"}, training={"rounds": 5}),
                tmp_path / "local")[0]
    evals = load(local.run_dir, "client_eval")
    assert sorted(evals.groupby("round")["client"].count().unique()) == [10]
    rounds = load(local.run_dir)
    assert (rounds["bytes_up"] == 0).all() and (rounds["bytes_down"] == 0).all()
    last = evals[evals["round"] == 4]
    assert rounds["accuracy"].iloc[-1] == pytest.approx(last["global_accuracy"].mean())
    assert rounds["personal_accuracy"].iloc[-1] == pytest.approx(np.nanmean(last["own_accuracy"]))

    central = run(quickstart_raw(algorithm={"name": "centralized"}, training={"rounds": 5}),
                  tmp_path / "central")[0]
    clients = load(central.run_dir, "clients")
    assert clients["client"].unique().tolist() == [0]
    assert clients["num_samples"].iloc[0] == 455  # the pooled training set
    central_rounds = load(central.run_dir)
    assert central_rounds["accuracy"].iloc[-1] >= 0.93
    assert (central_rounds["bytes_up"] == 0).all()  # handing the model to the evaluator is free
    # evaluated like a global model: on every client's own share as well
    central_evals = load(central.run_dir, "client_eval")
    assert sorted(central_evals[central_evals["round"] == 4]["client"]) == list(range(10))
    assert central_rounds["own_accuracy"].iloc[-1] == pytest.approx(
        central_evals[central_evals["round"] == 4]["main_own_accuracy"].mean())


def test_centralized_on_the_clients_union_or_on_the_full_training_split(ray_session, tmp_path):
    partition = {"scheme": "iid", "num_clients": 10, "samples_per_client": 4}
    sizes = {}
    for data in ("clients", "full"):
        outcome = run(quickstart_raw(algorithm={"name": "centralized", "data": data},
                                     partition=partition, training={"rounds": 1}),
                      tmp_path / data)[0]
        sizes[data] = int(load(outcome.run_dir, "clients")["num_samples"].iloc[0])
    assert sizes == {"clients": 40, "full": 455}


def test_runs_from_a_directory_where_a_folder_named_raysim_shadows_the_package(tmp_path):
    """Ray puts the driver's working directory on the workers' path: from the parent of a
    clone named ``raysim`` that folder used to shadow the package in every worker."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "raysim"
    if not script.is_file():
        found = shutil.which("raysim")  # (never a relative "raysim": the package folder here)
        if found is None:
            pytest.skip("needs raysim installed (its `raysim` console script), as the README does")
        script = Path(found)
    repository = Path(__file__).resolve().parents[1]
    (tmp_path / "raysim").symlink_to(repository)
    completed = subprocess.run(  # the console script, run by this test's interpreter
        [sys.executable, str(script), "run", "raysim/experiments/quickstart.yaml", "--set",
         "training.rounds=1", "--set", "seeds=[0]", "--output", "out", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "No module named" not in completed.stderr
    assert len(list((tmp_path / "out").glob("quickstart-*/seed_0/manifest.json"))) == 1


def test_the_driver_sums_on_the_cpus_of_its_node_that_no_actor_reserved(ray_session):
    """``engine.reduction_threads``' default: the CPUs of the node no actor reserved (the
    session's 4 logical CPUs, then 3 while an actor holds one)."""
    from raysim.engine.pool.shared_actors import POOL
    from raysim.engine.run.driver import spare_node_cpus

    POOL.clear()  # idle pooled actors of earlier tests hold CPUs

    def settled(expected: int) -> int:
        deadline = time.monotonic() + 20
        while (spare := spare_node_cpus()) != expected and time.monotonic() < deadline:
            time.sleep(0.1)  # (Ray's resource view lags an actor's start and end)
        return spare

    assert settled(4) == 4

    @ray_session.remote(num_cpus=1)
    class Holder:
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    assert ray_session.get(holder.ready.remote(), timeout=60)
    assert settled(3) == 3
    ray_session.kill(holder)
    assert settled(4) == 4


def test_a_run_records_the_reduction_threads_its_driver_used(ray_session, tmp_path):
    """A run's driver sums with the CPUs its worker left (the session has 4), or with the
    configured count; the manifest says which."""
    from raysim.engine.pool.shared_actors import POOL

    counts = []
    for threads in (None, 1):
        POOL.clear()
        engine = {"num_workers": 1, "cpus_per_worker": 1, "reduction_threads": threads}
        config = parse_config(quickstart_raw(engine=engine, training={"rounds": 1}))
        outcome = run_experiment(config, output=str(tmp_path / str(threads)),
                                 progress=False)[0]
        manifest = json.loads((outcome.run_dir / "manifest.json").read_text())
        counts.append(manifest["driver"]["reduction_threads"])
    assert counts[0] >= 2 and counts[1] == 1
