"""Fingerprints of the Parquet metrics of one small run per registered algorithm, to show that
a refactoring changes no number: run it on two commits and compare the output.

Every algorithm runs the configuration of tests/algorithm_configs.py (3 clients, 3 rounds, a
generated PneumoniaMNIST-layout file) on the engine with 2 workers and the membership audit
(8 members per client). For each results table
(rounds, clients, client_eval, communication) the timing, memory and wall-clock columns and
the labels holding the timestamped run directory are dropped, the columns sorted by name and
the rows hashed (SHA-256 of pandas' row hashes).

    python experiments/benchmarks/metrics_fingerprint.py > after.txt
    PYTHONPATH=<other checkout> python experiments/benchmarks/metrics_fingerprint.py > before.txt
    diff before.txt after.txt
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from algorithm_configs import contract_raw
from fixtures import write_medmnist_npz

from raysim.algorithms import ALGORITHMS
from raysim.config import parse_config
from raysim.engine.runner import run_experiment
from raysim.results import load

VOLATILE = ("seconds", "memory", "wall_time", "time")
LABELS = ("experiment", "run")  # hold the timestamped run directory


def fingerprint(frame: pd.DataFrame) -> str:
    keep = sorted(c for c in frame.columns
                  if not any(v in c for v in VOLATILE) and c not in LABELS)
    values = pd.util.hash_pandas_object(frame[keep], index=False).to_numpy()
    return hashlib.sha256(values.tobytes()).hexdigest()[:16] + f" ({len(frame)}x{len(keep)})"


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "data"
        write_medmnist_npz(root, n_train=90, n_test=30)
        for name in sorted(ALGORITHMS):
            raw = contract_raw(root, name)
            raw["engine"] = {"num_workers": 2, "cpus_per_worker": 1}
            raw["evaluation"] = {"membership_audit": 8}  # the audit's attacks are compared too
            outcome = run_experiment(parse_config(raw), output=str(Path(scratch) / name),
                                     progress=False)[0]
            if outcome.error is not None:
                print(f"{name}: failed: {outcome.error}")
                continue
            for table in ("rounds", "clients", "client_eval", "communication"):
                try:
                    frame = load(outcome.run_dir, table)
                except (FileNotFoundError, ValueError):
                    continue
                print(f"{name} {table}: {fingerprint(frame)}", flush=True)


if __name__ == "__main__":
    main()
