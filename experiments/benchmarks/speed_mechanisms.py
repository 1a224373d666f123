"""What raysim's speed mechanisms gain, each switched off against on, alternating, on this
machine; one JSON line per mechanism (``--records FILE`` also appends them there).

- ``first_step``: a client's first SGD step written from its start straight into its own
  weights (``raysim/training/first_step.py``) against copying the start in and stepping in
  place. In-process, one thread: a worker's local updates of FedAvg's clients with an MLP of
  1.08 M parameters (hidden 1024 x 1024, the synthetic set, 4 samples and 1 step per client)
  on the per-client loop; milliseconds per client, median over ``--repeats`` alternations,
  and the paired t of the per-repeat ratios.
- ``compiled_step``: the vectorised path's step compiled with ``torch.compile``
  (``engine.compile_step: always``, ``raysim/training/compiled_step.py``) against the eager
  step. In-process, one thread: a worker's local updates of FedAvg's clients (50 of 100
  sampled per round, 32 synthetic rows each, 1 epoch of batch 8: 4 steps) with an MLP of
  hidden 32 on the vectorised path; milliseconds per round after every shape was compiled,
  median over ``--repeats`` alternations, and the paired t of the per-repeat ratios. The
  compile time (each (clients, batch) shape once per process, from an empty kernel cache) is
  reported beside it.
- ``prestart``: a local Ray starting only the worker processes the first runs use
  (``raysim/engine/launch/ray_internals.py``, ``prestarting``) against Ray's default of one per
  CPU, where each process imports torch and the engine. ``raysim run experiments/quickstart.yaml``
  as a new process whose machine reports ``--cpus`` CPUs (16: a GPU node's), seconds until its
  first round is dispatched (from the run's manifest) and of the whole command, medians over
  ``--repeats`` alternations. On a machine with fewer cores than ``--cpus`` the default's
  imports also contend for the cores, so the gain there is larger than on a node that has them.
- ``head_services``: a local Ray started without the head processes raysim never uses (the API
  server, the autoscaler monitor and the log monitor:
  ``raysim.engine.launch.ray_internals.UNUSED_RAY_SERVICES``) against Ray's default. A fresh
  Python process starts a local Ray as ``raysim run`` does (the engine preloaded in Ray's
  worker processes and imported in a background thread beside ``ray.init``), asks for three
  actors that import the engine (two client workers and a driver host) and waits until all
  three answer; seconds until they do, medians over ``--repeats`` alternations.

    python experiments/benchmarks/speed_mechanisms.py [--repeats 5] [--cpus 16] [--records FILE]
        [--only first_step|compiled_step|prestart|head_services]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import commit, cpu_device, paired_ratios  # noqa: E402


def first_step(repeats: int, rounds: int = 20) -> dict[str, Any]:
    """Milliseconds per client of a worker's local updates with the first-step writer and
    without it (see the module docstring)."""
    import torch
    from per_client_overhead import Worker

    from raysim.training import runtime as runtime_module

    torch.set_num_threads(1)
    raw = {"name": "first-step", "dataset": {"name": "synthetic"},
           "partition": {"scheme": "iid", "num_clients": 40, "samples_per_client": 4},
           "model": {"name": "mlp", "hidden": [1024, 1024]}, "algorithm": {"name": "fedavg"},
           "training": {"rounds": rounds, "local_steps": 1, "batch_size": 4,
                        "clients_per_round": 40, "optimizer": {"name": "sgd", "lr": 0.05}},
           "seeds": [0], "engine": {"vectorize": "never"}}
    worker = Worker(raw, vectorize="never")
    bind = runtime_module.FirstStepFromStart.bind

    def timed(enabled: bool) -> float:
        runtime_module.FirstStepFromStart.bind = (  # type: ignore[method-assign]
            bind if enabled else staticmethod(lambda *args, **kwargs: None))
        try:
            started = time.perf_counter()
            for round_ in range(rounds):
                worker.raysim(round_)
            return (time.perf_counter() - started) * 1000 / (rounds * len(worker.clients))
        finally:
            runtime_module.FirstStepFromStart.bind = bind  # type: ignore[method-assign]

    timed(True)  # warm-up
    return alternated("first_step", "ms per client, MLP 1.08 M parameters, 1 step", timed,
                      repeats)


def alternated(mechanism: str, what: str, timed: Callable[[bool], float], repeats: int,
               **extra: Any) -> dict[str, Any]:
    """A mechanism's record: ``timed(True)`` (on) and ``timed(False)`` (off) alternated
    ``repeats`` times, their medians and the paired ratio of off to on."""
    on, off = [], []
    for _ in range(repeats):
        on.append(timed(True))
        off.append(timed(False))
    return {"mechanism": mechanism, "what": what, "on": round(statistics.median(on), 3),
            "off": round(statistics.median(off), 3), **extra, "repeats": repeats,
            **paired_ratios(on, off)}


def compiled_step(repeats: int, rounds: int = 10) -> dict[str, Any]:
    """Milliseconds per round of a worker's vectorised local updates with the step compiled
    and eager (see the module docstring)."""
    import os

    import torch
    from per_client_overhead import Worker

    torch.set_num_threads(1)
    raw = {"name": "compiled-step", "dataset": {"name": "synthetic"},
           "partition": {"scheme": "iid", "num_clients": 100, "samples_per_client": 32},
           "model": {"name": "mlp", "hidden": [32]}, "algorithm": {"name": "fedavg"},
           "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 8,
                        "clients_per_round": 100, "optimizer": {"name": "sgd", "lr": 0.05,
                                                                "momentum": 0.9}},
           "seeds": [0], "engine": {"vectorize": "always"}}
    worker = Worker(raw, vectorize="always")

    def timed(enabled: bool) -> float:
        worker.runtime.compile_step = enabled
        started = time.perf_counter()
        for round_ in range(rounds):
            worker.raysim(round_)
        return (time.perf_counter() - started) * 1000 / rounds

    with tempfile.TemporaryDirectory(prefix="compiled-step-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # a cold compile: no earlier kernels
        started = time.perf_counter()
        worker.runtime.compile_step = True
        worker.runtime.warm_compiled_step(worker.clients)
        compile_s = time.perf_counter() - started
        timed(False)  # warm-up of the eager step
        return alternated("compiled_step", "ms per round, 50 clients x 4 steps, MLP 32", timed,
                          repeats, compile_s=round(compile_s, 1))


_COMMAND = """
import contextlib, os, sys
os.cpu_count = lambda: {cpus}
if {off}:
    import raysim.engine.launch.local_ray as local_ray
    local_ray.prestarting = lambda count: contextlib.nullcontext()
from raysim.cli import main
sys.exit(main(["run", "experiments/quickstart.yaml", "--output", {output!r}, "--no-progress"]))
"""


def prestart(repeats: int, cpus: int) -> dict[str, Any]:
    """Seconds to the first round and of the whole command with the prestart rewrite and
    without it (see the module docstring)."""
    from raysim.engine.invocation import startup_phases
    from raysim.results.manifest import read_manifest

    def command(off: bool, output: str) -> tuple[float, float]:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", _COMMAND.format(cpus=cpus, off=off,
                                                               output=output)],
                       cwd=REPOSITORY, check=True, capture_output=True)
        whole = time.perf_counter() - started
        run_dir = next(Path(output).glob("quickstart-*/seed_0"))
        phases = startup_phases(read_manifest(run_dir))
        assert phases is not None
        return phases["first_round"], whole

    firsts: dict[bool, list[float]] = {True: [], False: []}
    wholes: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(repeats):
            for off in (False, True):
                first, whole = command(off, f"{scratch}/{index}-{int(off)}")
                firsts[off].append(first)
                wholes[off].append(whole)
    return {"mechanism": "prestart", "what": f"raysim run quickstart, {cpus} CPUs reported",
            "on_first_round_s": round(statistics.median(firsts[False]), 2),
            "off_first_round_s": round(statistics.median(firsts[True]), 2),
            "on_command_s": round(statistics.median(wholes[False]), 2),
            "off_command_s": round(statistics.median(wholes[True]), 2), "repeats": repeats,
            **paired_ratios(wholes[False], wholes[True])}


_HEAD_SERVICES = """
import contextlib, json, os, sys, threading, time
started = time.perf_counter()
import ray
from raysim.engine.launch.warm_cluster import PRELOAD_VARIABLE, WORKER_MODULES
from raysim.engine.launch.ray_internals import without_unused_ray_services

os.environ[PRELOAD_VARIABLE] = ",".join(WORKER_MODULES)
engine = threading.Thread(target=lambda: __import__("raysim.engine.runner"))
engine.start()
with without_unused_ray_services() if sys.argv[1] == "on" else contextlib.nullcontext():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")

@ray.remote(num_cpus=0)
class Pooled:
    def __init__(self):
        import raysim.engine.run.worker  # noqa: F401  (preloaded: a no-op on a preloaded process)
    def pid(self):
        return os.getpid()

actors = [Pooled.remote() for _ in range(3)]
ray.get([actor.pid.remote() for actor in actors])
print(json.dumps({"ready_s": time.perf_counter() - started}))
engine.join()
ray.shutdown()
"""


def head_services(repeats: int) -> dict[str, Any]:
    """Seconds until three engine actors answer, a local Ray started without the unused head
    services and with them (see the module docstring)."""
    ready: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(repeats):
        for variant in ("on", "off"):
            done = subprocess.run([sys.executable, "-c", _HEAD_SERVICES, variant], check=True,
                                  capture_output=True, text=True, cwd=REPOSITORY)
            ready[variant].append(json.loads(done.stdout.strip().splitlines()[-1])["ready_s"])
    return {"mechanism": "head_services", "what": "local Ray to three engine actors ready, s",
            "on": round(statistics.median(ready["on"]), 3),
            "off": round(statistics.median(ready["off"]), 3), "repeats": repeats,
            **paired_ratios(ready["on"], ready["off"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpus", type=int, default=16)
    parser.add_argument("--only", choices=["first_step", "compiled_step", "prestart",
                                           "head_services"])
    parser.add_argument("--records", help="append the rows to this JSON-lines file (e.g. "
                        "records/speed_mechanisms_<device>_<commit>.jsonl)")
    args = parser.parse_args()
    at_commit = commit()
    rows = []
    if args.only in (None, "first_step"):
        rows.append(first_step(args.repeats))
    if args.only in (None, "compiled_step"):
        rows.append(compiled_step(args.repeats))
    if args.only in (None, "prestart"):
        rows.append(prestart(args.repeats, args.cpus))
    if args.only in (None, "head_services"):
        rows.append(head_services(args.repeats))
    for row in rows:
        row.update(commit=at_commit, device=cpu_device())
        print(json.dumps(row), flush=True)
        if args.records:
            with open(args.records, "a") as file:
                file.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
