"""10,000 virtual clients on one small machine: sampled fractions, flat memory."""

from __future__ import annotations

from pathlib import Path

from raysim.configuration.experiment import load_config
from raysim.engine.runner import run_experiment
from raysim.results import load

CONFIG = Path(__file__).parents[1] / "experiments" / "scale" / "synthetic_10k.yaml"


def test_ten_thousand_clients_sampled_per_round_with_flat_memory(ray_session, tmp_path):
    # results flushed every 0.1 s: Arrow's memory pool, allocated once by the first Parquet
    # write (about 20-40 MB), is in place before round 100 (at the default 2 s the first
    # flush fell before or after it by chance, and with it the test)
    config = load_config(CONFIG, ["training.rounds=300", "evaluation.every=100",
                                  "training.clients_per_round=50", "engine.flush_seconds=0.1"])
    outcome = run_experiment(config, output=str(tmp_path), progress=False)[0]
    assert outcome.error is None
    clients = load(outcome.run_dir, "clients")
    per_round = clients.groupby("round")["client"].agg(["nunique", "size", "max"])
    assert (per_round["nunique"] == 50).all() and (per_round["size"] == 50).all()
    assert clients["client"].nunique() > 5000  # the sample moves over the 10,000 clients
    assert (clients["num_samples"] == 4).all()
    rounds = load(outcome.run_dir)
    assert rounds["accuracy"].dropna().iloc[-1] > 0.75  # learns (chance is 0.5)
    # no per-client actors, models or states: memory after warm-up does not grow with rounds
    warm, end = rounds.iloc[100], rounds.iloc[-1]
    assert end["worker_memory_mb"] - warm["worker_memory_mb"] < 25
    assert end["driver_memory_mb"] - warm["driver_memory_mb"] < 25
