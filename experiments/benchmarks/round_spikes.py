"""Rounds that stall: the W3 workload of ``vs_flower.py`` (1,000 clients x 4 samples, 100 per
round, FedAvg on 2 workers of 1 CPU), without ``system:`` and with FedBuff (``system_overhead.py``'s
tiers), run alternately in one Ray session (warm: the pool's processes kept between runs).
For each configuration, over every run but the first: the median round period (the ``rounds``
table's wall clock, first and last rounds left out), the rounds longer than 5 x that median
("spikes": a full garbage collection in the driver or a worker shows as one), their excess
milliseconds per run, the longest period, and the median seconds of a whole run. One JSON line.

    python experiments/benchmarks/round_spikes.py [--runs 7] [--rounds 100]
    PYTHONPATH=<other checkout> python experiments/benchmarks/round_spikes.py   # that tree
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from system_overhead import with_system
from vs_flower import workloads

import raysim
from raysim.config import parse_config
from raysim.engine.runner import run_experiment
from raysim.results import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    base = workloads(".", False)["W3"]
    base = {**base, "training": {**base["training"], "rounds": args.rounds}}
    periods: dict[str, list[np.ndarray]] = {"none": [], "fedbuff": []}
    wholes: dict[str, list[float]] = {"none": [], "fedbuff": []}
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            for label in periods:
                config = parse_config(with_system(base, None if label == "none" else label))
                started = time.perf_counter()
                outcome = run_experiment(config, output=scratch, progress=False)[0]
                whole = time.perf_counter() - started
                assert outcome.error is None, outcome.error
                if run == 0:  # the pool's first run: actors started, imports
                    continue
                stamps = load(outcome.run_dir)["wall_time"].to_numpy()
                periods[label].append(np.diff(stamps[1:-1]) * 1e3)
                wholes[label].append(whole)
    tree = Path(raysim.__file__).resolve().parents[1]
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    row: dict[str, object] = {"tree": str(tree), "commit": commit, "runs": args.runs - 1,
                              "rounds": args.rounds}
    for label, parts in periods.items():
        values = np.concatenate(parts)
        median = float(np.median(values))
        spikes = values[values > 5 * median]
        row[label] = {"median_round_ms": round(median, 2), "spikes": len(spikes),
                      "spike_excess_ms_per_run": round(float((spikes - median).sum())
                                                       / len(parts), 1),
                      "longest_round_ms": round(float(values.max()), 1),
                      "run_seconds": round(float(np.median(wholes[label])), 3)}
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
