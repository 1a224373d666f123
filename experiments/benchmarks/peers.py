"""raysim against its peers on one machine, in one run: raysim (``raysim run``, one process per
configuration), Flower 1.41 and pfl-research 0.6 (each in its own Python), a plain PyTorch loop
and the on-device reference (in this process), on the same workloads, data and model.

Workloads (``workloads.py``; FedAvg with SGD, the global model evaluated after the last round;
any workload of a ConvNet, the small CNN or an MLP, e.g.):

- ``convnet32-150x8-pneumonia``: 150 clients x 8 PneumoniaMNIST images (a generated file of
  its layout when the real one is absent), ConvNet width 32 depth 3, one step of batch 8, lr
  0.01, every client every round, 30 rounds;
- ``mlp32-1000x4-synthetic``: 1,000 clients x 4 rows of the built-in synthetic set, 100 per
  round, one step, 50 rounds;
- ``cnn-1000x50-cifar-shape``: the pfl-research CIFAR-10 benchmark's shape: 1,000 clients x 50
  images of 28x28x3, 50 clients per round, the 2-conv CNN 32/64 + dense 128, one epoch of
  batch 10, lr 0.1.

For each workload and round count (``--rounds``; default the workload's own), every side runs
``--repeats`` times as a whole process, the sides' order reversed on every other repeat so that
the machine's drift falls on all of them. Each measurement records the whole-process seconds
(the command, start-up included: what a researcher waits for) and the steady rounds per second
(the rounds after the first; raysim's final evaluation left out):

- raysim: on a GPU, vectorised clients with one worker on the whole card, four at 0.25 and
  eight at 0.125 of it, and the per-client loop with one worker; on a CPU-only machine two
  workers of one CPU each (one torch thread each) and one worker of two;
- Flower: ``run_simulation`` with one client actor of 1 CPU (and 0.1 GPU on a GPU machine,
  pfl-research's setup for Flower in its paper) per simultaneous client
  (``flower_workload.py``);
- pfl-research: ``torchrun`` with ``--pfl-processes`` processes (its recommended multi-process
  mode; default one per CPU and one process on a CPU machine, the machine's threads shared
  out among them (``OMP_NUM_THREADS``), 1, 2 and 4 sharing the card on a GPU;
  ``pfl_workload.py``); the best is the one to beat;
- the plain PyTorch loop and the on-device reference (``torch.func`` vmap over the round's
  clients; the median of three measurements), rounds per second only, once per round count;
  on CPUs at one torch thread (what each of raysim's two workers uses) and at every other
  thread count up to the machine's CPUs (``plain_pytorch_loop_<n>threads``).

Every record says how many threads each of its side's processes ran (``threads``): the CPU
rows of BENCHMARKS.md compare the sides at one thread per process (raysim's two workers,
pfl-research's two ranks, Flower's client actors of 1 CPU, the in-process loops) and, in a
second row, each side at its own best of the thread counts measured.

Both peers read the clients' samples, normalised as raysim normalises them, from one npz file
written before any clock starts (they do not pay for loading, checking or partitioning the
data; raysim does, inside its timed command).

Optionally (``--seeds-check``) three seeds of the pfl shape with ``engine.merge_seeds`` auto and
never (4 x 0.25 GPU each: the seeds cannot run side by side, so auto puts them on shared
workers and never runs them one after another).

A raysim record also splits its rounds (``round_split_ms``: the median round, dispatch to the
last reply, a worker's own local updates, aggregation, evaluation), and ``--profile STACKS``
adds, per workload, an untimed longer run of raysim at 4 x 0.25 GPU (2 x 1 CPU without one)
whose driver and workers py-spy samples (``profiling.py``).

Every measurement is one JSON record (suite ``peers``; commit, device, CPUs, versions, when)
printed and appended to ``--records``. Flower and pfl-research live in environments of their
own (Flower pins ray 2.55.1):

    python -m venv ../flwr-venv && ../flwr-venv/bin/pip install "flwr[simulation]==1.41.0" \\
        "torch==2.13.0"
    python -m venv ../pfl-venv && ../pfl-venv/bin/pip install "pfl==0.6.0" "torch==2.13.0"
    python experiments/benchmarks/peers.py --flower-python ../flwr-venv/bin/python \\
        --pfl-python ../pfl-venv/bin/python [--workloads NAME ...] [--rounds 20 120] \\
        [--repeats 3] [--pfl-processes 1 2 4] [--records FILE] [--profile STACKS --py-spy PATH]

Without ``--flower-python`` (or ``FLOWER_PYTHON``) and ``--pfl-python`` (``PFL_PYTHON``) only
raysim and the in-process baselines run. Measure on a quiet machine: a raysim run waits while
another raysim invocation holds the CPUs, and anything else running skews every side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from baselines import fedavg_plain_loop, fedavg_reference  # noqa: E402
from harness import (  # noqa: E402
    CPU_ENGINES,
    GPU_ENGINES,
    Records,
    bench_config,
    commit,
    export_for_peers,
    last_json,
    machine_cpu,
    raysim_process,
    run_process,
    thread_counts,
    threads_side,
    torch_threads,
    workload_dataset,
)
from profiling import profile_side  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

PFL_SHAPE = "cnn-1000x50-cifar-shape"
CONVNET = "convnet32-150x8-pneumonia"
TABULAR = "mlp32-1000x4-synthetic"
PEER_WORKLOADS = [name for name, spec in WORKLOADS.items()
                  if spec.model["name"] in ("convnet", "cnn", "mlp")
                  and spec.algorithm["name"] == "fedavg"]
"""The workloads both peers can run (``peer_models.py`` has their models)."""


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    import ray

    versions = {"torch": torch.__version__, "ray": ray.__version__}
    for name, python in (("flwr", args.flower_python), ("pfl", args.pfl_python)):
        if python:
            asked = subprocess.run([python, "-c", f"import {name}; print({name}.__version__)"],
                                   capture_output=True, text=True)
            versions[name] = asked.stdout.strip() or "unknown"
    records = Records("peers", args.records, {
        "device": torch.cuda.get_device_name() if cuda else "CPU", "cpus": os.cpu_count(),
        "commit": commit(), "date": date.today().isoformat(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"), "versions": versions})
    engines = GPU_ENGINES if cuda else CPU_ENGINES
    if args.engines:
        engines = {k: v for k, v in engines.items() if k in args.engines}
    workloads = args.workloads if args.workloads is not None else \
        [PFL_SHAPE, CONVNET] if cuda else [CONVNET, TABULAR]
    processes = args.pfl_processes or ([1, 2, 4] if cuda else
                                       sorted({os.cpu_count() or 1, 1}, reverse=True))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for workload in workloads:
            dataset, real = workload_dataset(workload, args.data_root, scratch)
            print(json.dumps({"workload": workload, "data": "real" if real else "generated"}),
                  flush=True)
            profiled: dict[str, dict] = {}  # each raysim side's last measurement
            for number, rounds in enumerate(args.rounds or [WORKLOADS[workload].rounds]):
                common = {"workload": workload, "rounds": rounds}
                limit = measure_baselines(workload, dataset, rounds, device, args.skip, records)
                raw = bench_config(workload, dataset, rounds, next(iter(engines.values()), {}))
                raw["evaluation"] = {"every": rounds, "clients": False}
                peer_spec = export_for_peers(raw, scratch / f"{workload}.npz",
                                             write=number == 0)  # the arrays once
                peer_spec.update(device=device.type, gpus_per_client=0.1 if cuda else 0.0)
                sides = [*engines, *(["flower"] if args.flower_python and "flower" not in
                                     args.skip and (args.flower_rounds is None
                                                    or rounds <= args.flower_rounds) else []),
                         *([f"pfl_research_{n}proc" for n in processes]
                           if args.pfl_python else [])]
                for repeat in range(args.repeats):
                    # interleaved: no side always goes first
                    for side in sides if repeat % 2 == 0 else sides[::-1]:
                        used: dict[str, float] = {}  # the machine's CPU seconds meanwhile
                        with machine_cpu(used):
                            measured = measure_side(side, workload, dataset, rounds, engines,
                                                    args, peer_spec, scratch, env)
                        if side in engines:
                            profiled[side] = measured
                            rate = measured.get("rounds_per_s")
                            if limit and isinstance(rate, float):
                                measured["over_reference"] = round(rate / limit, 3)
                        records.add(**common, side=side, repeat=repeat, **measured, **used)
            if args.profile:
                label = "raysim_vectorized_4x0.25gpu" if cuda else "raysim_2x1cpu"
                records.add(workload=workload, **profile_side(
                    workload, dataset, label, profiled.get(label, {}),
                    (args.rounds or [WORKLOADS[workload].rounds])[-1], scratch, env,
                    args.py_spy, Path(args.profile)))
        if args.seeds_check:
            dataset = workload_dataset(PFL_SHAPE, args.data_root, scratch)[0]
            engine = GPU_ENGINES["raysim_vectorized_4x0.25gpu"] if cuda else CPU_ENGINES[
                "raysim_2x1cpu"]
            for merge in ("auto", "never"):
                raw = bench_config(PFL_SHAPE, dataset, 20, {**engine, "merge_seeds": merge})
                raw.update(name=f"seeds-{merge}", seeds=[0, 1, 2])
                measured = raysim_process(raw, scratch, env, args.timeout)
                records.add(workload=PFL_SHAPE, rounds=20, side=f"raysim_3_seeds_merge_{merge}",
                            **measured)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=None, choices=PEER_WORKLOADS,
                        help=f"default: {PFL_SHAPE} and {CONVNET} on a GPU, {CONVNET} and "
                             f"{TABULAR} on CPUs; none with --seeds-check: the seeds alone")
    parser.add_argument("--rounds", nargs="+", type=int, default=None,
                        help="round counts (default: each workload's own)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="whole-process runs of every side, alternating (default 1)")
    parser.add_argument("--engines", nargs="+", default=None,
                        help="raysim configurations (default: all of this device's)")
    parser.add_argument("--flower-python", default=os.environ.get("FLOWER_PYTHON"),
                        help="a Python with flwr[simulation]==1.41.0 and torch")
    parser.add_argument("--flower-rounds", type=int, default=None,
                        help="round counts at or below this only, for Flower (slow on GPUs)")
    parser.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"),
                        help="a Python with pfl==0.6.0 and torch")
    parser.add_argument("--pfl-processes", nargs="+", type=int, default=None,
                        help="pfl-research's torchrun process counts (default: one per CPU "
                             "on CPUs; 1 2 4 on a GPU)")
    parser.add_argument("--seeds-check", action="store_true",
                        help="also 3 seeds of the pfl shape, merge_seeds auto against never")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--records", help="append the records (JSON lines) to this file")
    parser.add_argument("--skip", nargs="+", default=[], metavar="SIDE",
                        help="sides not to measure (plain_pytorch_loop, "
                             "on_device_vmap_reference, flower)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per process")
    parser.add_argument("--profile", metavar="STACKS",
                        help="also, per workload, one untimed run of raysim with 4 x 0.25 GPU "
                             "(2 x 1 CPU without one) of 10x the last round count, its driver "
                             "and workers sampled by py-spy: a summary record, and the sampled "
                             "stacks appended to this file")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    args = parser.parse_args()
    if not args.flower_python:
        print("Flower is not measured: no --flower-python (or FLOWER_PYTHON); the module "
              "docstring says how to install it in its own environment.", flush=True)
    return args


def measure_baselines(workload: str, dataset: dict, rounds: int, device: torch.device,
                      skip: list[str], records: Records) -> float | None:
    """The plain loop's and the on-device reference's rounds per second (each recorded);
    returns the reference's (None when skipped)."""
    spec, raw = WORKLOADS[workload], {"dataset": dataset}
    common = {"workload": workload, "rounds": rounds}
    limit = None
    for threads in thread_counts(device):  # the equal budget first (its rate is returned)
        with torch_threads(threads):
            if "plain_pytorch_loop" not in skip:
                plain = fedavg_plain_loop(spec, raw, rounds, device)
                records.add(**common, side=threads_side("plain_pytorch_loop", threads),
                            threads=threads, rounds_per_s=round(plain, 3))
            if "on_device_vmap_reference" in skip:
                continue
            # the median of three: one measurement of a few rounds varies by tens of %
            repeats = [fedavg_reference(spec, raw, rounds, device) for _ in range(3)]
            rate = statistics.median(repeats)
            limit = rate if limit is None else limit
            records.add(**common, side=threads_side("on_device_vmap_reference", threads),
                        threads=threads, rounds_per_s=round(rate, 3),
                        repeats=[round(r, 3) for r in repeats])
    return limit


def measure_side(side: str, workload: str, dataset: dict, rounds: int,
                 engines: dict[str, dict], args: argparse.Namespace, peer_spec: dict,
                 scratch: Path, env: dict[str, str]) -> dict:
    """One whole-process run of ``side``: a raysim configuration of ``engines`` or a peer."""
    if side not in engines:
        return run_peer(side, args, peer_spec, scratch / f"{workload}.npz", env)
    raw = bench_config(workload, dataset, rounds, engines[side])
    raw["name"] = f"{workload}-{side}-{rounds}"
    raw["evaluation"] = {"every": rounds, "clients": False}
    measured = raysim_process(raw, scratch, env, args.timeout)
    measured["threads"] = engines[side].get("cpus_per_worker", 1)
    return measured


def run_peer(side: str, args: argparse.Namespace, spec: dict, data: Path,
             env: dict[str, str]) -> dict:
    """One whole-process run of Flower or of pfl-research (``pfl_research_<n>proc``): its
    seconds, its steady rounds per second, and why it failed where it did."""
    if side == "flower":
        command = [args.flower_python, str(HERE / "flower_workload.py"), "--data", str(data),
                   "--spec", json.dumps(spec)]
        key = "flower_rounds_per_s"
        threads = 1  # a client actor of 1 CPU: Ray sets its OMP_NUM_THREADS to 1
    else:  # its idiomatic multi-process mode; on CPUs the machine's threads shared out
        processes = int(side.removeprefix("pfl_research_").removesuffix("proc"))
        command = [args.pfl_python, "-m", "torch.distributed.run", "--standalone",
                   "--nnodes=1", f"--nproc_per_node={processes}", str(HERE / "pfl_workload.py"),
                   "--data", str(data), "--spec", json.dumps(spec)]
        threads = 1 if spec["device"] == "cuda" else max(1, (os.cpu_count() or 1) // processes)
        env = {**env, "OMP_NUM_THREADS": str(threads)}
        key = "pfl_rounds_per_s"
    seconds, out, error = run_process(command, env, args.timeout)
    return {"wall_s": round(seconds, 2), "rounds_per_s": last_json(out).get(key),
            "threads": threads, **({"error": error} if error else {})}


if __name__ == "__main__":
    main()
