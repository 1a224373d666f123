"""The benchmark scripts' shared harness (run them from the repository root; the scripts'
folder is on sys.path then): raysim's configurations, a raysim run as a whole process (from
this checkout or another: its rate, start-up and where its rounds went), a workload's data and
timed config, the statistics of alternated pairs, and where a suite's records go.

Every comparison alternates its sides (A B, B A, ...) in one invocation, so that the machine's
drift between minutes falls on both; a ratio is reported with the mean of the per-pair ratios
and its t (:func:`paired_ratios`). A record file is named by suite, device and commit
(:func:`record_path`), e.g. ``records/peers_cpu-2cores_2c0c27a.jsonl``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import yaml
from workloads import EQUAL_THREADS, WORKLOADS, dataset_section, raysim_config

from raysim.configuration.experiment import parse_config
from raysim.data.dataset import to_tensor
from raysim.data.generated import write_medmnist_npz
from raysim.preparation import prepare
from raysim.results import load


def workload_dataset(name: str, data_root: str, scratch: Path) -> tuple[dict, bool]:
    """(the config's dataset section, real?) for workload ``name``: the built-in set, the real
    MedMNIST file under ``data_root`` when present at 28 px, else a generated file of its layout
    under ``scratch`` (for the pfl-research shape always: 28x28x3 images, CIFAR-10-shaped)."""
    spec = WORKLOADS[name]
    cifar_shape = name == "cnn-1000x50-cifar-shape"
    real = spec.data == "synthetic" or (
        not cifar_shape and spec.size == 28 and (Path(data_root) / f"{spec.data}.npz").exists())
    if real:
        return dataset_section(name, data_root, True), True
    root = scratch / name
    write_medmnist_npz(root, spec.data, n_train=max(spec.clients * spec.samples, 2000),
                       n_test=200, size=spec.size,
                       **({"channels": 3, "num_classes": 9} if cifar_shape else {}))
    return dataset_section(name, str(root), False), False


def bench_config(name: str, dataset: dict, rounds: int, engine: dict) -> dict:
    """Workload ``name`` as a raysim config for a timed run: ``rounds`` rounds on ``engine``
    (1 CPU per worker unless it says), no evaluation."""
    return raysim_config(name, dataset, rounds=rounds, evaluate_last=False,
                         engine={"cpus_per_worker": 1, "flush_seconds": 5.0, **engine})


def export_for_peers(raw: dict, path: Path, write: bool = True) -> dict:
    """Write a raysim config's client samples (in client order, normalised as raysim normalises
    them) and test set to ``path`` (unless ``write`` is false: written before); returns the
    workload spec that ``flower_workload.py`` and ``pfl_workload.py`` read. The peers train on
    the same arrays as raysim and do not pay for loading, checking or partitioning them."""
    config = parse_config(raw)
    dataset, partition = prepare(config, None)[config.seeds[0]]
    info = dataset.info
    order = np.concatenate(partition.train)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in partition.train])])
    if write:
        np.savez(path, x_train=to_tensor(dataset.train_x[order], info).numpy(),
                 y_train=dataset.train_y[order].astype(np.int64), offsets=offsets,
                 x_test=to_tensor(dataset.test_x, info).numpy(),
                 y_test=dataset.test_y.astype(np.int64))
    training = config.training
    return {"model": raw["model"], "input_shape": list(info.input_shape),
            "num_classes": info.num_classes, "num_clients": partition.num_clients,
            "clients_per_round": training.clients_per_round or partition.num_clients,
            "rounds": training.rounds, "local_epochs": training.local_epochs,
            "local_steps": training.local_steps, "batch_size": training.batch_size,
            "lr": training.optimizer.lr, "cpus": os.cpu_count() or 1}


RECORDS = Path(__file__).resolve().parent / "records"
REPOSITORY = Path(__file__).resolve().parents[2]


def commit(tree: Path = REPOSITORY) -> str:
    """The short commit hash of ``tree`` (``RAYSIM_COMMIT`` where set, for a copy of the
    tree whose git history is elsewhere; "unknown" without git)."""
    if tree == REPOSITORY and os.environ.get("RAYSIM_COMMIT"):
        return os.environ["RAYSIM_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree,
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def cpu_device() -> str:
    """This machine as a record names it when it runs on CPUs (``cpu-<cores>cores``)."""
    return f"cpu-{os.cpu_count()}cores"


def device_slug(device: str) -> str:
    """A device's name as record files name it: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


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


GPU_ENGINES = {
    "raysim_vectorized_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "always"},
    "raysim_vectorized_4x0.25gpu": {"num_workers": 4, "gpus_per_worker": 0.25,
                                    "vectorize": "always"},
    "raysim_vectorized_8x0.125gpu": {"num_workers": 8, "gpus_per_worker": 0.125,
                                     "vectorize": "always"},
    "raysim_loop_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "never"},
    "raysim_compiled_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "always",
                             "compile_step": "always"},
    "raysim_compiled_4x0.25gpu": {"num_workers": 4, "gpus_per_worker": 0.25,
                                  "vectorize": "always", "compile_step": "always"},
}
"""raysim's configurations on a GPU machine, by the label its records carry."""
CPU_ENGINES = {"raysim_2x1cpu": {"num_workers": 2, "cpus_per_worker": 1},
               "raysim_1x2cpu": {"num_workers": 1, "cpus_per_worker": 2}}
"""raysim's configurations on a CPU machine: two workers of one CPU (one thread each: the
thread budget every side gets in the equal-budget rows) and one worker of two."""



def thread_counts(device: torch.device) -> list[int]:
    """The torch thread counts an in-process baseline is measured at: on CPUs the equal budget
    first, then every count up to the machine's CPUs (its own best is the fastest of them); on
    a GPU the equal budget only (the device does the arithmetic)."""
    if device.type == "cuda":
        return [EQUAL_THREADS]
    return [EQUAL_THREADS, *[n for n in range(1, (os.cpu_count() or 1) + 1)
                             if n != EQUAL_THREADS]]


def threads_side(side: str, threads: int) -> str:
    """An in-process baseline's side name at ``threads`` threads: the plain name at the equal
    budget (so a new measurement replaces the earlier figures of that side), else with its
    thread count."""
    return side if threads == EQUAL_THREADS else f"{side}_{threads}threads"


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` for the block, then restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
FIRST_ROUND = re.compile(r"first round dispatched ([0-9.]+) s after the command")


class Records:
    """Prints each record of ``suite`` as a JSON line (with the ``common`` fields) and appends
    it to a file."""

    def __init__(self, suite: str, path: str | Path | None, common: dict):
        self.suite, self.path, self.common = suite, path, common

    def add(self, **fields: object) -> None:
        line = json.dumps({"suite": self.suite, **fields, **self.common})
        print(line, flush=True)
        if self.path:
            with open(self.path, "a") as handle:
                handle.write(line + "\n")


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy since boot (Linux's /proc/stat: user, nice,
    system, irq, softirq and steal time of every CPU), None where there is no /proc/stat. The
    difference over a command on a quiet machine is what the command cost, every process it
    started included (Ray's own, the workers, a peer's ranks)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


@contextmanager
def machine_cpu(into: dict) -> Iterator[None]:
    """Set ``into["machine_cpu_s"]`` to the machine's busy CPU seconds over the block (where
    /proc/stat exists)."""
    before = machine_busy_seconds()
    yield
    after = machine_busy_seconds()
    if before is not None and after is not None:
        into["machine_cpu_s"] = round(after - before, 2)


def run_process(command: list[str], env: dict[str, str], timeout: float,
                cwd: Path | None = None) -> tuple[float, str, str]:
    """Whole-process seconds, stdout and an error text ("" when it succeeded)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout,
                              cwd=cwd)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - started, "", f"timed out after {timeout:.0f} s"
    seconds = time.perf_counter() - started
    error = "" if done.returncode == 0 else \
        f"exit {done.returncode}: {(done.stderr or done.stdout)[-600:]}"
    return seconds, done.stdout, error


def last_json(text: str) -> dict:
    """The last line of ``text`` that is a JSON object, parsed ({} when none is)."""
    lines = [line for line in text.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def raysim_process(raw: dict, scratch: Path, env: dict[str, str], timeout: float,
                   tree: Path | None = None) -> dict:
    """``raysim run`` of one config as a whole process, from this checkout or from another
    ``tree`` (its package first on the path, run from its root): seconds, the first round's
    dispatch after the command, steady rounds per second of each seed (the rounds after the
    first, a final evaluation left out) and where seed 0's rounds went (:func:`round_split`)."""
    path = scratch / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    output = scratch / "results"
    if tree is not None:
        env = {**env, "PYTHONPATH": os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])}
    seconds, out, error = run_process([sys.executable, "-m", "raysim.cli", "run", str(path),
                                       "--no-progress", "--output", str(output)], env, timeout,
                                      cwd=tree)
    if error:
        return {"wall_s": round(seconds, 2), "error": error}
    root = max((p for p in output.glob(f"{raw['name']}-*")), key=lambda p: p.stat().st_mtime)
    per_seed = []
    for run in sorted(root.glob("seed_*")):
        rounds = load(run)
        span = rounds["wall_time"].iloc[-1] - rounds["wall_time"].iloc[0] - \
            rounds["seconds_evaluate"].iloc[1:].sum()
        per_seed.append(round((len(rounds) - 1) / span, 3))
    first = FIRST_ROUND.search(out)
    return {"wall_s": round(seconds, 2), "rounds_per_s": per_seed[0] if len(per_seed) == 1
            else per_seed, "first_round_s": float(first.group(1)) if first else None,
            "round_split_ms": round_split(root, raw["engine"].get("num_workers", 1))}


def round_split(root: Path, workers: int) -> dict[str, float]:
    """Where a round's time goes, medians over the rounds after the first (seed 0), in ms:
    the whole round, the dispatch-to-last-reply phase (``seconds_train``), the workers' own
    local updates within it (the clients' ``train_seconds`` summed, per worker: the rest of
    the phase is hand-offs and waiting), the aggregation and the evaluation."""
    run = sorted(root.glob("seed_*"))[0]
    rounds = load(run).iloc[1:]
    local = load(run, "clients").groupby("round")["train_seconds"].sum() / workers
    return {"round": round(float(rounds["wall_time"].diff().median()) * 1e3, 2),
            "dispatch_to_replies": round(float(rounds["seconds_train"].median()) * 1e3, 2),
            "worker_local_updates": round(float(local.iloc[1:].median()) * 1e3, 2),
            "aggregate": round(float(rounds["seconds_aggregate"].median()) * 1e3, 2),
            "evaluate": round(float(rounds["seconds_evaluate"].median()) * 1e3, 2)}


SamplerT = TypeVar("SamplerT", bound="Sampler")


class Sampler:
    """Calls :meth:`sample` every ``interval`` seconds in a thread while its block runs (what a
    benchmark watches in the processes it starts)."""

    interval = 0.5

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self: SamplerT) -> SamplerT:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """One sample (override)."""


def process_stats() -> Iterator[tuple[int, list[str]]]:
    """Every process's pid and the fields of its /proc stat after the command's name (field 3
    onwards: state, parent, ...; niceness is index 16)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
