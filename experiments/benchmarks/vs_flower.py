"""raysim against Flower 1.41 end to end: whole-process wall clock of ``raysim run`` and of a
Flower simulation (``flower_workload.py``) on the same workloads, interleaved, with ratios.

Workloads (``workloads.py``; 2 workers / 2 Flower client actors of 1 CPU, evaluation of the
global model after the last round only): ``convnet128-70x64-pneumonia``,
``convnet32-150x8-pneumonia``, ``mlp32-1000x4-synthetic``, and
``mlp32-1000x4-synthetic-3-seeds``, the last with 3 seeds (raysim: one invocation, the seeds on
shared workers with their clients in one vectorised call, ``engine.merge_seeds=auto``; Flower:
three simulations one after another in one process).

Both sides train on the same arrays: this script prepares each workload with raysim (data,
partition) and hands Flower the clients' samples, normalised as raysim normalises them, in an
npz file (written before the clock starts; Flower does not pay for loading, checking or
partitioning the data, raysim does). PneumoniaMNIST comes from ``--data-root`` (a generated
file of its layout when absent, said in the output).

Flower lives in its own environment (it pins ray 2.55.1):

    python -m venv ../flwr-venv
    ../flwr-venv/bin/pip install "flwr[simulation]==1.41.*" "torch>=2.3,<2.14" numpy
    python experiments/benchmarks/vs_flower.py --flower-python ../flwr-venv/bin/python \\
        [--workloads convnet32-150x8-pneumonia,mlp32-1000x4-synthetic] [--repeats 2]

``--warm-cluster`` also measures raysim on a warm cluster (``raysim cluster start`` before the
clock, then one untimed run per workload so that its worker processes exist): the way a user
who runs many invocations on one machine works. The cold side never joins it.

Without ``--flower-python`` (or ``FLOWER_PYTHON``) only raysim runs, with a message saying how
to add Flower. Measure on a quiet machine: a raysim run waits while another raysim invocation
holds the CPUs (Flower does not), and anything else running skews both sides.
Prints one JSON line per measurement and a table of medians with raysim/Flower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np
import yaml
from workloads import dataset_section, raysim_config

from raysim.config import parse_config
from raysim.data.dataset import to_tensor
from raysim.preparation import prepare

THREE_SEEDS = "mlp32-1000x4-synthetic-3-seeds"
"""The tabular workload with 3 seeds in one invocation."""


def workloads(data_root: str, real: bool) -> dict[str, dict]:
    """The raysim config of every workload this comparison runs (``workloads.py``)."""
    names = ["convnet128-70x64-pneumonia", "convnet32-150x8-pneumonia", "mlp32-1000x4-synthetic"]
    configs = {name: raysim_config(name, dataset_section(name, data_root, real))
               for name in names}
    configs[THREE_SEEDS] = raysim_config("mlp32-1000x4-synthetic", {"name": "synthetic"},
                                         seeds=(0, 1, 2))
    return configs


def export_for_flower(raw: dict, path: Path, write: bool = True) -> dict:
    """Write the workload's client samples (in client order, normalised) and test set to
    ``path`` (unless ``write`` is false: written before); returns the workload spec that
    ``flower_workload.py`` and ``pfl_workload.py`` read."""
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
            "lr": training.optimizer.lr, "cpus": 2}


def _commit() -> str:
    """The measured tree's commit (``RAYSIM_COMMIT`` for a copy whose history differs)."""
    if os.environ.get("RAYSIM_COMMIT"):
        return os.environ["RAYSIM_COMMIT"]
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def _versions(flower_python: str | None, pfl_python: str | None) -> dict[str, str]:
    """torch, Ray and the peers' versions (each peer asked in its own Python)."""
    import ray
    import torch

    versions = {"torch": torch.__version__, "ray": ray.__version__}
    for name, python in (("flwr", flower_python), ("pfl", pfl_python)):
        if python:
            asked = subprocess.run([python, "-c", f"import {name}; print({name}.__version__)"],
                                   capture_output=True, text=True)
            versions[name] = asked.stdout.strip() or "unknown"
    return versions


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall clock of a whole process; its output (raises with it on failure)."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:3])} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flower-python", default=os.environ.get("FLOWER_PYTHON"),
                        help="a Python with flwr[simulation]==1.41.* and torch")
    parser.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"),
                        help="a Python with pfl==0.6.0 and torch: pfl-research as a second peer")
    parser.add_argument("--pfl-processes", type=int, default=2,
                        help="pfl-research's torchrun processes (default: one per CPU of the "
                        "2-CPU comparison)")
    parser.add_argument("--workloads", default=",".join(workloads(".", False)),
                        help="comma-separated names (default: all of them)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--records", help="append every measurement as a JSON record (suite "
                        "`peers`; commit, device, versions) to this file")
    parser.add_argument("--warm-cluster", action="store_true",
                        help="also measure raysim joining a warm `raysim cluster`")
    args = parser.parse_args()
    here = Path(__file__).resolve().parent
    raysim_cli = [sys.executable, "-c", "import sys; from raysim.cli import main; "
                  "sys.exit(main())"]
    if not args.flower_python:
        print("Flower is not measured: no --flower-python (or FLOWER_PYTHON). Install it in "
              "its own environment (it pins ray 2.55.1): python -m venv ../flwr-venv && "
              "../flwr-venv/bin/pip install 'flwr[simulation]==1.41.*' 'torch>=2.3,<2.14' "
              "numpy; then pass --flower-python ../flwr-venv/bin/python.", flush=True)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        real = (Path(args.data_root) / "pneumoniamnist.npz").exists()
        data_root = args.data_root
        if not real:
            from raysim.data.generated import write_medmnist_npz

            data_root = str(scratch / "data")
            write_medmnist_npz(Path(data_root), "pneumoniamnist", n_train=12000, n_test=600)
        print(json.dumps({"pneumoniamnist": "real" if real else "generated"}), flush=True)
        chosen = {k: v for k, v in workloads(data_root, real).items()
                  if k in args.workloads.split(",")}
        specs = {}
        for name, raw in chosen.items():
            (scratch / f"{name}.yaml").write_text(yaml.safe_dump(raw))
            if args.flower_python or args.pfl_python:
                specs[name] = export_for_flower(raw, scratch / f"{name}.npz")
        times: dict[tuple[str, str], list[float]] = {}
        common = {"device": "CPU", "cpus": os.cpu_count(), "commit": _commit(),
                  "date": date.today().isoformat(),
                  "versions": _versions(args.flower_python, args.pfl_python)}
        env = {**os.environ, "RAY_DEDUP_LOGS": "0",
               "RAYSIM_CLUSTER_DIR": str(scratch / "no-cluster")}
        # the warm cluster holds CPU slots of its own: the cold side must not wait for them
        warm_env = {**env, "RAYSIM_CLUSTER_DIR": str(scratch / "cluster"),
                    "RAYSIM_CPU_SLOTS": str(scratch / "cluster-slots")}

        def raysim_run(name: str) -> list[str]:
            return [*raysim_cli, "run", str(scratch / f"{name}.yaml"), "--no-progress",
                    "--output", str(scratch / "results")]

        if args.warm_cluster:
            timed([*raysim_cli, "cluster", "start"], warm_env)
            for name in chosen:  # untimed: the cluster's worker processes start here
                timed(raysim_run(name), warm_env)
        try:
            for repeat in range(args.repeats):
                for name in chosen:
                    sides = ["raysim", *(["flower"] if args.flower_python else []),
                             *(["pfl"] if args.pfl_python and name != THREE_SEEDS else [])]
                    sides += ["raysim-warm"] if args.warm_cluster else []
                    if repeat % 2:
                        sides.reverse()  # interleaved: neither side always goes first
                    for side in sides:
                        if side == "pfl":  # its idiomatic multi-process mode
                            command = [args.pfl_python, "-m", "torch.distributed.run",
                                       "--standalone", "--nnodes=1",
                                       f"--nproc_per_node={args.pfl_processes}",
                                       str(here / "pfl_workload.py"), "--data",
                                       str(scratch / f"{name}.npz"), "--spec",
                                       json.dumps(specs[name])]
                        elif side == "flower":
                            seeds = len(chosen[name]["seeds"])
                            command = [args.flower_python, str(here / "flower_workload.py"),
                                       "--data", str(scratch / f"{name}.npz"),
                                       "--spec", json.dumps(specs[name]), "--seeds", str(seeds)]
                        else:
                            command = raysim_run(name)
                        side_env = warm_env if side == "raysim-warm" else env
                        if side == "pfl":  # one thread per process, as torchrun sets by default
                            side_env = {**env, "OMP_NUM_THREADS": "1"}
                        seconds, _ = timed(command, side_env)
                        times.setdefault((name, side), []).append(seconds)
                        record = {"suite": "peers", "workload": name, "side": side,
                                  "repeat": repeat, "wall_s": round(seconds, 2), **common}
                        print(json.dumps(record), flush=True)
                        if args.records:
                            with open(args.records, "a") as handle:
                                handle.write(json.dumps(record) + "\n")
        finally:
            if args.warm_cluster:
                timed([*raysim_cli, "cluster", "stop"], warm_env)
        print_table(chosen, times)


def print_table(chosen: dict[str, dict], times: dict[tuple[str, str], list[float]]) -> None:
    """Medians per workload and side, and raysim's (cold, warm) over Flower's."""
    print("\n| workload | raysim (median s) | raysim, warm cluster | Flower (median s) "
          "| pfl-research (median s) | raysim / Flower | raysim / pfl-research |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in chosen:
        medians = {side: statistics.median(times[(name, side)])
                   for side in ("raysim", "raysim-warm", "flower", "pfl")
                   if (name, side) in times}
        shown = {side: f"{medians[side]:.1f}" if side in medians else "not measured"
                 for side in ("raysim", "raysim-warm", "flower", "pfl")}
        ratio = {peer: f"{medians['raysim'] / medians[peer]:.2f}"
                 if peer in medians and "raysim" in medians else "-" for peer in ("flower", "pfl")}
        print(f"| {name} | {shown['raysim']} | {shown['raysim-warm']} | {shown['flower']} | "
              f"{shown['pfl']} | {ratio['flower']} | {ratio['pfl']} |")


if __name__ == "__main__":
    main()
