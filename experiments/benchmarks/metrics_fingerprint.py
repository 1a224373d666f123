"""Fingerprints of the Parquet metrics of one small run per registered algorithm, to show that
a refactoring changes no number: run it on two commits and compare the output.

Every algorithm runs the configuration of tests/algorithm_configs.py (3 clients, 3 rounds, a
generated PneumoniaMNIST-layout file) on the engine with 2 workers and the membership audit
(8 members per client). For each results table
(rounds, clients, client_eval, communication) the timing, memory and wall-clock columns and
the labels holding the timestamped run directory are dropped, the columns sorted by name and
the rows hashed (SHA-256 of pandas' row hashes).

Then (``--large``) the per-client loop's large-model cases, where a client's first SGD step is
written from its start (``raysim/training/first_step.py``: models of at least 262,144 values):
an MLP [512, 512] on the built-in synthetic set, 12 clients, 3 rounds of 3 SGD steps, for
FedAvg (plain SGD; momentum and weight decay), FedProx (momentum), local-only and FedDC (with
and without momentum, so optimizer states are carried between rounds).

Then (``--system``) the simulated clock's policies (sync, deadline, over-selection, FedBuff with
FedAvg and FedProx) on the built-in synthetic set: 200 clients in the three built-in tiers, 20
per round, 12 rounds, an MLP [32], one local step; the ``system`` table is compared too.

Then (``--privacy``) client-level DP: FedAvg in central mode, local mode and with adaptive
clipping, FedProx in central mode, and the methods with their own DP in local mode (FedSM,
FedDF, FedDC), each on its contract config with 6 clients (FedAvg, FedProx and FedDF: 3 sampled per
round, Poisson).

    python experiments/benchmarks/metrics_fingerprint.py [--large] [--system] [--privacy] > after.txt
    PYTHONPATH=<other checkout> python experiments/benchmarks/metrics_fingerprint.py > before.txt
    diff before.txt after.txt
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

import pandas as pd
from algorithm_configs import CONFIGS, contract_raw

from raysim.configuration.experiment import parse_config
from raysim.data.generated import write_medmnist_npz
from raysim.engine.runner import run_experiment
from raysim.results import load

VOLATILE = ("seconds", "memory", "wall_time", "time")
LABELS = ("experiment", "run")  # hold the timestamped run directory


def fingerprint(frame: pd.DataFrame) -> str:
    keep = sorted(c for c in frame.columns
                  if not any(v in c for v in VOLATILE) and c not in LABELS)
    values = pd.util.hash_pandas_object(frame[keep], index=False).to_numpy()
    return hashlib.sha256(values.tobytes()).hexdigest()[:16] + f" ({len(frame)}x{len(keep)})"


LARGE_CASES = [("fedavg", {"lr": 0.05}), ("fedavg", {"lr": 0.05, "momentum": 0.9,
                                                     "weight_decay": 1e-3}),
               ("fedprox", {"lr": 0.05, "momentum": 0.5}), ("local", {"lr": 0.05}),
               ("local", {"lr": 0.05, "momentum": 0.9}), ("feddc", {"lr": 0.05}),
               ("feddc", {"lr": 0.05, "momentum": 0.9})]


def large_raw(algorithm: str, optimizer: dict) -> dict:
    """A large-model per-client-loop config (see the module docstring)."""
    sampled = {} if algorithm == "feddc" else {"clients_per_round": 8}  # FedDC: all clients
    return {"name": f"large-{algorithm}", "dataset": {"name": "synthetic"},
            "partition": {"scheme": "iid", "num_clients": 12, "samples_per_client": 16},
            "model": {"name": "mlp", "hidden": [512, 512]}, "algorithm": {"name": algorithm},
            "training": {"rounds": 3, "local_steps": 3, "batch_size": 4,
                         "optimizer": {"name": "sgd", **optimizer}, **sampled},
            "evaluation": {"every": 1}, "seeds": [0],
            "engine": {"num_workers": 2, "cpus_per_worker": 1, "vectorize": "never"}}


SYSTEM_CASES = [("fedavg", "sync"), ("fedavg", "deadline"), ("fedavg", "overselect"),
                ("fedavg", "fedbuff"), ("fedprox", "fedbuff")]


def system_raw(algorithm: str, policy: str) -> dict:
    """A config with ``system:`` (see the module docstring)."""
    return {"name": f"system-{algorithm}-{policy}", "dataset": {"name": "synthetic"},
            "partition": {"scheme": "iid", "num_clients": 200, "samples_per_client": 4},
            "model": {"name": "mlp", "hidden": [32]},
            "algorithm": {"name": algorithm, **({"mu": 0.01} if algorithm == "fedprox" else {})},
            "training": {"rounds": 12, "local_steps": 1, "batch_size": 4,
                         "clients_per_round": 20, "optimizer": {"name": "sgd", "lr": 0.05}},
            "system": {"tiers": {"workstation_gpu": 0.2, "cpu_server": 0.4,
                                 "constrained_site": 0.4}, "policy": policy,
                       **({"deadline_s": 0.002} if policy == "deadline" else {}),
                       **({"over_selection": 0.3} if policy == "overselect" else {})},
            "evaluation": {"every": 4}, "seeds": [0],
            "engine": {"num_workers": 2, "cpus_per_worker": 1}}


PRIVACY_CASES = [
    ("fedavg", {"mode": "central"}), ("fedavg", {"mode": "local"}),
    ("fedavg", {"mode": "central",
                "adaptive_clip": {"target_quantile": 0.5, "count_noise_std": 1.0}}),
    ("fedprox", {"mode": "central"}), ("fedsm", {"mode": "local"}),
    ("feddf", {"mode": "local", "noise_multiplier": 0.05}), ("feddc", {"mode": "local"})]


def privacy_raw(root: Path, algorithm: str, settings: dict) -> dict:
    """An algorithm's contract config under ``privacy:`` (see the module docstring)."""
    raw = contract_raw(root, algorithm)
    raw["partition"] = {**raw.get("partition", {}), "num_clients": 6}
    if algorithm in ("fedavg", "fedprox", "feddf"):  # (FedSM and FedDC train every client)
        raw["training"] = {**raw["training"], "clients_per_round": 3}
    raw["privacy"] = {"clip": 0.5, "noise_multiplier": 0.8, "delta": 1e-3, **settings}
    raw["evaluation"] = {"every": 1}
    raw["engine"] = {"num_workers": 2, "cpus_per_worker": 1}
    return raw


def print_fingerprints(name: str, raw: dict, output: Path) -> None:
    """Run ``raw`` and print its tables' fingerprints (or why it failed)."""
    outcome = run_experiment(parse_config(raw), output=str(output), progress=False)[0]
    if outcome.error is not None:
        print(f"{name}: failed: {outcome.error}")
        return
    for table in ("rounds", "clients", "client_eval", "communication", "system"):
        try:
            frame = load(outcome.run_dir, table)
        except (FileNotFoundError, ValueError):
            continue
        if table == "system" and frame.empty:  # (a run without ``system:``)
            continue
        print(f"{name} {table}: {fingerprint(frame)}", flush=True)


def main() -> None:
    large, system = "--large" in sys.argv[1:], "--system" in sys.argv[1:]
    privacy = "--privacy" in sys.argv[1:]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "data"
        write_medmnist_npz(root, n_train=90, n_test=30)
        for name in sorted(CONFIGS):  # (the methods on masks only have their own tests)
            raw = contract_raw(root, name)
            raw["engine"] = {"num_workers": 2, "cpus_per_worker": 1}
            raw["evaluation"] = {"membership_audit": 8}  # the audit's attacks are compared too
            print_fingerprints(name, raw, Path(scratch) / name)
        for index, (algorithm, optimizer) in enumerate(LARGE_CASES if large else []):
            label = f"large {algorithm} " + ",".join(f"{k}={v}" for k, v in optimizer.items())
            print_fingerprints(label, large_raw(algorithm, optimizer),
                               Path(scratch) / f"large{index}")
        for algorithm, policy in SYSTEM_CASES if system else []:
            print_fingerprints(f"system {algorithm} {policy}", system_raw(algorithm, policy),
                               Path(scratch) / f"system-{algorithm}-{policy}")
        for index, (algorithm, settings) in enumerate(PRIVACY_CASES if privacy else []):
            label = f"privacy {algorithm} " + ",".join(f"{k}={v}" for k, v in settings.items())
            print_fingerprints(label, privacy_raw(root, algorithm, settings),
                               Path(scratch) / f"privacy{index}")


if __name__ == "__main__":
    main()
