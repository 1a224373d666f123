"""The benchmark scripts' shared harness (run them from the repository root; the scripts'
folder is on sys.path then): a raysim run's rate, a workload's data, the statistics of
alternated pairs, and where a suite's records go.

Every comparison alternates its sides (A B, B A, ...) in one invocation, so that the machine's
drift between minutes falls on both; a ratio is reported with the mean of the per-pair ratios
and its t (:func:`paired_ratios`). A record file is named by suite, device and commit
(:func:`record_path`), e.g. ``records/peers_cpu-2cores_2c0c27a.jsonl``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from raysim.config import parse_config
from raysim.data.generated import write_medmnist_npz
from raysim.engine.runner import run_experiment
from raysim.results import load


def measure_raysim(raw: dict, output: Path, intervals: bool = False) -> dict:
    """Run one raysim experiment; rounds per second from the first to the last round's end
    (round 0 and start-up excluded; start-up reported separately). ``intervals``: also the
    seconds between consecutive rounds' ends (``raysim_round_seconds``), which show whether
    the first rounds after start-up run slower than the later ones, and the median over rounds
    of the workers' local-update seconds (``raysim_local_update_s``: each round's sum over
    its clients of ``train_seconds``, i.e. the time the workers spent in the algorithm's local
    updates, summed over workers), which splits a round between the workers' training and the
    rest (the hand-offs, the reductions, the driver)."""
    started = time.perf_counter()
    outcome = run_experiment(parse_config(raw), output=str(output), progress=False)[0]
    if outcome.error is not None:
        raise RuntimeError(f"the benchmark run failed: {outcome.error}")
    total = time.perf_counter() - started
    rounds = load(outcome.run_dir)
    span = rounds["wall_time"].iloc[-1] - rounds["wall_time"].iloc[0]
    measured = {"raysim_rounds_per_s": (len(rounds) - 1) / span, "raysim_startup_s": total - span}
    if intervals:
        measured["raysim_round_seconds"] = [round(float(s), 4)
                                            for s in rounds["wall_time"].diff().iloc[1:]]
        local = load(outcome.run_dir, "clients").groupby("round")["train_seconds"].sum()
        measured["raysim_local_update_s"] = float(local.iloc[1:].median())
    return measured


def medmnist_source(data_root: str, flag: str, scratch: Path, n_train: int, n_test: int
                    ) -> tuple[dict, str, bool]:
    """(dataset config section, data root, real?) for ``flag``: the real file under
    ``data_root`` when present, else a generated file of that layout under ``scratch``."""
    real = (Path(data_root) / f"{flag}.npz").exists()
    if not real:
        data_root = str(scratch / "data")
        write_medmnist_npz(Path(data_root), flag, n_train=n_train, n_test=n_test)
    return ({"name": flag, "root": data_root, "download": False, "verify_checksum": real},
            data_root, real)


def print_ratio(result: dict) -> None:
    """Add raysim / plain to ``result`` and print it as one JSON line (floats to 3 places)."""
    result["raysim_over_plain"] = result["raysim_rounds_per_s"] / result["plain_rounds_per_s"]
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}),
          flush=True)


RECORDS = Path(__file__).resolve().parent / "records"
REPOSITORY = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The repository's short commit hash."""
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPOSITORY,
                          capture_output=True, text=True).stdout.strip()


def cpu_device() -> str:
    """This machine as a record names it when it runs on CPUs (``cpu-<cores>cores``)."""
    return f"cpu-{os.cpu_count()}cores"


def record_path(suite: str, device: str, at_commit: str) -> Path:
    """Where a suite's records of one device and commit go."""
    return RECORDS / f"{suite}_{device}_{at_commit}.jsonl"


def paired_ratios(baseline: list[float], changed: list[float]) -> dict[str, float]:
    """The mean over alternated pairs of ``changed / baseline`` and its t against 1 (n - 1
    degrees of freedom)."""
    ratios = [b / a for a, b in zip(baseline, changed, strict=True)]
    mean = statistics.fmean(ratios)
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    t = (mean - 1) / (spread / len(ratios) ** 0.5) if spread else 0.0
    return {"ratio_mean": round(mean, 3), "ratio_t": round(t, 2)}
