"""raysim against its peers on one machine, in one run: raysim (``raysim run``, one process per
configuration), Flower 1.41 and pfl-research 0.6 (each in its own Python), a plain PyTorch loop
and the on-device reference (in this process), on the same workloads, the same data and model.

Workloads (``workloads.py``; FedAvg, SGD, evaluated after the last round):

- ``cnn-1000x50-cifar-shape``: the pfl-research CIFAR-10 benchmark's shape: 1,000 clients x 50
  images of 28x28x3, 50 clients per round, the 2-conv CNN 32/64 + dense 128, one epoch of
  batch 10, lr 0.1;
- ``convnet32-150x8-pneumonia``: 150 clients x 8 PneumoniaMNIST images (a generated file of
  its layout when the real one is absent), ConvNet width 32 depth 3, one step of batch 8, lr
  0.01, every client every round.

For each workload and round count: whole-process seconds (the command, start-up included) and
steady rounds per second (from the end of the first round to the end of the last, the final
evaluation left out) of each side:

- raysim on the GPU: vectorised clients with one worker on the whole card, four at 0.25 and
  eight at 0.125 of it, and the per-client loop with one worker (on a CPU-only machine: two
  workers of one CPU each);
- Flower: ``run_simulation`` with 1 CPU and 0.1 GPU per client actor (pfl-research's setup for
  Flower in its paper), the model on the GPU (``flower_workload.py``);
- pfl-research: ``torchrun`` with 1, 2, ... processes sharing the card (its recommended
  multi-process mode; ``pfl_workload.py``); the best is the one to beat;
- the plain PyTorch loop and the on-device reference (``torch.func`` vmap over the round's
  clients; the median of three measurements), rounds per second only.

Optionally (``--seeds-check``) three seeds of the pfl shape with ``engine.merge_seeds`` auto and
never (4 x 0.25 GPU each: the seeds cannot run side by side, so auto puts them on shared
workers and never runs them one after another).

A raysim record also splits its rounds (``round_split_ms``: the median round, dispatch to the
last reply, a worker's own local updates, aggregation, evaluation), and ``--profile STACKS``
adds, per workload, an untimed longer run of raysim at 4 x 0.25 GPU (2 x 1 CPU without one)
whose driver and workers py-spy samples (``profiling.py``).

Every measurement is one JSON record (suite ``peers``; commit, device, CPUs, versions, when)
printed and appended to ``--records``.

    python experiments/benchmarks/peers.py --flower-python PY --pfl-python PY \\
        [--workloads NAME ...] [--rounds 20 120] [--pfl-processes 1 2 4] [--records FILE] \\
        [--profile STACKS --py-spy PATH]
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
    last_json,
    raysim_process,
    run_process,
    workload_dataset,
)
from profiling import profile_raysim  # noqa: E402
from vs_flower import export_for_flower  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

PFL_SHAPE = "cnn-1000x50-cifar-shape"
CONVNET = "convnet32-150x8-pneumonia"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=[PFL_SHAPE, CONVNET],
                        choices=[PFL_SHAPE, CONVNET],
                        help="none with --seeds-check: the seeds alone")
    parser.add_argument("--rounds", nargs="+", type=int, default=[20, 120])
    parser.add_argument("--engines", nargs="+", default=None,
                        help="raysim configurations (default: all of this device's)")
    parser.add_argument("--flower-python", default=os.environ.get("FLOWER_PYTHON"))
    parser.add_argument("--flower-rounds", type=int, default=None,
                        help="round counts at or below this only, for Flower (slow on GPUs)")
    parser.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"))
    parser.add_argument("--pfl-processes", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--seeds-check", action="store_true",
                        help="also 3 seeds of the pfl shape, merge_seeds auto against never")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--records", help="append the records (JSON lines) to this file")
    parser.add_argument("--skip", nargs="+", default=[], metavar="SIDE",
                        help="sides not to measure (plain_pytorch_loop, flower, ...)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per process")
    parser.add_argument("--profile", metavar="STACKS",
                        help="also, per workload, one untimed run of raysim with 4 x 0.25 GPU "
                             "(2 x 1 CPU without one) of 10x the last round count, its driver "
                             "and workers sampled by py-spy: a summary record, and the sampled "
                             "stacks appended to this file")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    args = parser.parse_args()
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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for workload in args.workloads:
            spec = WORKLOADS[workload]
            dataset = workload_dataset(workload, args.data_root, scratch)[0]
            profiled: dict[str, dict] = {}  # each raysim side's last measurement
            dataset_raw = {"dataset": dataset}
            for rounds in args.rounds:
                common = {"workload": workload, "rounds": rounds}
                if "plain_pytorch_loop" not in args.skip:
                    plain = fedavg_plain_loop(spec, dataset_raw, rounds, device)
                    records.add(**common, side="plain_pytorch_loop",
                                rounds_per_s=round(plain, 3))
                # the median of three: one measurement of a few rounds varies by tens of %
                repeats = [fedavg_reference(spec, dataset_raw, rounds, device) for _ in range(3)]
                limit = statistics.median(repeats)
                records.add(**common, side="on_device_vmap_reference",
                            rounds_per_s=round(limit, 3),
                            repeats=[round(rate, 3) for rate in repeats])
                for label, engine in engines.items():
                    raw = bench_config(workload, dataset, rounds, engine)
                    raw["name"] = f"{workload}-{label}-{rounds}"
                    raw["evaluation"] = {"every": rounds, "clients": False}
                    measured = raysim_process(raw, scratch, env, args.timeout)
                    profiled[label] = measured
                    ratio = {"over_reference": round(measured["rounds_per_s"] / limit, 3)} \
                        if isinstance(measured.get("rounds_per_s"), float) else {}
                    records.add(**common, side=label, **measured, **ratio)
                raw = bench_config(workload, dataset, rounds, next(iter(engines.values()), {}))
                raw["evaluation"] = {"every": rounds, "clients": False}
                peer_spec = export_for_flower(raw, scratch / f"{workload}.npz", write=rounds
                                              == args.rounds[0])  # the arrays once
                peer_spec.update(device=device.type, gpus_per_client=0.1 if cuda else 0.0,
                                 cpus=os.cpu_count() or 1)
                if args.flower_python and "flower" not in args.skip and (
                        args.flower_rounds is None or rounds <= args.flower_rounds):
                    seconds, out, error = run_process(
                        [args.flower_python, str(HERE / "flower_workload.py"), "--data",
                         str(scratch / f"{workload}.npz"), "--spec", json.dumps(peer_spec)],
                        env, args.timeout)
                    result = last_json(out)
                    records.add(**common, side="flower", wall_s=round(seconds, 2),
                                rounds_per_s=result.get("flower_rounds_per_s"),
                                **({"error": error} if error else {}))
                for processes in args.pfl_processes if args.pfl_python else []:
                    seconds, out, error = run_process(
                        [args.pfl_python, "-m", "torch.distributed.run", "--standalone",
                         "--nnodes=1", f"--nproc_per_node={processes}",
                         str(HERE / "pfl_workload.py"), "--data",
                         str(scratch / f"{workload}.npz"), "--spec", json.dumps(peer_spec)],
                        {**env, "OMP_NUM_THREADS": "1"}, args.timeout)
                    result = last_json(out)
                    records.add(**common, side=f"pfl_research_{processes}proc",
                                wall_s=round(seconds, 2),
                                rounds_per_s=result.get("pfl_rounds_per_s"),
                                **({"error": error} if error else {}))
            if args.profile:  # as long as the first round's start-up and 1.5x the sampling
                label = "raysim_vectorized_4x0.25gpu" if cuda else "raysim_2x1cpu"
                timed = profiled.get(label, {})
                after = (timed.get("first_round_s") or 15.0) + 2.0
                rate = timed.get("rounds_per_s")
                rounds = max(args.rounds[-1], int(15 * rate) if isinstance(rate, float) else 300)
                raw = bench_config(workload, dataset, rounds, {**GPU_ENGINES, **CPU_ENGINES}[label])
                raw.update(name=f"{workload}-profile", evaluation={"every": 0})
                records.add(workload=workload, rounds=rounds, side=f"{label}_profile",
                            profile=profile_raysim(raw, scratch, env, args.py_spy,
                                                   Path(args.profile), after))
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


if __name__ == "__main__":
    main()
