"""raysim's server optimizers beside Flower's strategies, fed the same round means.

    python -m venv ../flwr-venv && ../flwr-venv/bin/pip install "flwr==1.41.0"
    python experiments/fidelity/server_optimizers.py --flower-python ../flwr-venv/bin/python

One seeded sequence of round means (``--entries`` float32 entries over ``--rounds`` rounds:
means that approach a target with shrinking noise, as a run's do) goes to raysim's
:func:`~raysim.layers.server_optimizer.server_step` under ``convention: paper`` and ``flower``
and to Flower's own FedAvgM, FedAdagrad, FedAdam and FedYogi (``flower_server_optimizers.py``,
run by ``--flower-python``), each setting at raysim's defaults and at Flower's. Per setting and
convention it records the largest relative distance between the two trajectories over the
rounds (||raysim_t - flower_t|| / ||flower_t - start||), the last round's, and the ratio of
the first steps' lengths (raysim's over Flower's).

Writes ``--out``/summary.csv (key ``experiment``: ``<setting>_<convention>``), which
docs/methods.md renders.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raysim.configuration.schema import ServerOptimizerConfig
from raysim.layers.server_optimizer import ServerMoments, server_step
from raysim.vectors.weights import FlatWeights

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
OUT = REPOSITORY / "docs" / "results" / "fidelity" / "server_optimizers"

SETTINGS: list[dict[str, Any]] = [
    # raysim's defaults (lr 1 / 0.01, beta1 0.9, beta2 0.99, tau 1e-3); FedAvgM with momentum
    {"label": "fedavgm", "name": "sgd", "lr": 1.0, "momentum": 0.9},
    {"label": "fedadagrad", "name": "adagrad", "lr": 0.01, "tau": 1e-3},
    {"label": "fedadam", "name": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    {"label": "fedyogi", "name": "yogi", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    # Flower's defaults (flwr.server.strategy: eta 0.1 and tau 1e-9 for FedAdagrad and FedAdam,
    # eta 0.01 and tau 1e-3 for FedYogi)
    {"label": "fedadagrad_flower_defaults", "name": "adagrad", "lr": 0.1, "tau": 1e-9},
    {"label": "fedadam_flower_defaults", "name": "adam", "lr": 0.1, "beta1": 0.9,
     "beta2": 0.99, "tau": 1e-9},
]


def round_means(entries: int, rounds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A start model and the round means that approach a target from it with noise shrinking
    by 0.8 per round (float32)."""
    rng = np.random.default_rng(seed)
    start = rng.normal(0.0, 0.1, entries).astype(np.float32)
    target = rng.normal(0.0, 0.1, entries)
    means = np.stack([start + (target - start) * (1 - 0.8 ** (t + 1))
                      + rng.normal(0.0, 0.02 * 0.8 ** t, entries) for t in range(rounds)])
    return start, means.astype(np.float32)


def raysim_trajectory(setting: dict[str, Any], convention: str, start: np.ndarray,
                      means: np.ndarray) -> np.ndarray:
    """The models raysim's server step makes from ``start`` and the round means."""
    options = {k: v for k, v in setting.items() if k not in ("label", "name")}
    if convention == "flower" and setting["name"] == "adagrad":
        options.pop("beta1", None)
    settings = ServerOptimizerConfig(name=setting["name"], convention=convention, **options)
    layout = (("w", start.shape),)
    current, moments, models = FlatWeights(start, layout), ServerMoments(), []
    for mean in means:
        current, moments = server_step(settings, current, FlatWeights(mean, layout), moments)
        models.append(np.asarray(current["w"], dtype=np.float64))
    return np.stack(models)


def flower_trajectories(python: str, start: np.ndarray, means: np.ndarray) -> dict[str, Any]:
    """Flower's strategies' trajectories, from ``flower_server_optimizers.py`` under
    ``python``."""
    with tempfile.TemporaryDirectory() as folder:
        given, out = Path(folder) / "means.npz", Path(folder) / "flower.npz"
        np.savez(given, start=start, means=means)
        subprocess.run([python, str(HERE / "flower_server_optimizers.py"), "--means", str(given),
                        "--settings", json.dumps(SETTINGS), "--out", str(out)], check=True)
        with np.load(out) as arrays:
            return {k: arrays[k] for k in arrays.files}


def compare(ours: np.ndarray, theirs: np.ndarray, start: np.ndarray) -> dict[str, float]:
    """Relative distances between two trajectories from ``start``."""
    moved = np.linalg.norm(theirs - start, axis=1)
    apart = np.linalg.norm(ours - theirs, axis=1) / moved
    return {"max_relative_difference": float(apart.max()),
            "last_relative_difference": float(apart[-1]),
            "first_step_ratio": float(np.linalg.norm(ours[0] - start) / moved[0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flower-python", required=True,
                        help="a Python with flwr==1.41.* (its own virtual environment)")
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    start, means = round_means(args.entries, args.rounds, args.seed)
    flower = flower_trajectories(args.flower_python, start, means)
    rows = []
    for setting in SETTINGS:
        for convention in ("paper", "flower"):
            ours = raysim_trajectory(setting, convention, start, means)
            rows.append({"experiment": f"{setting['label']}_{convention}",
                         "optimizer": setting["name"], "convention": convention,
                         "rounds": args.rounds, "entries": args.entries,
                         **compare(ours, flower[setting["label"]], start.astype(np.float64))})
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "summary.csv", index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
