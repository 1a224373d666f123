"""Start-up of ``raysim run`` as a user runs it: the whole command and its phases.

By default the pfl-research CIFAR-10 benchmark's shape (``cnn-1000x50-cifar-shape``: 1,000
clients x 50 samples of 28x28x3, 50 per round, ``model: cnn``, batch 10, lr 0.1, one local
epoch) as a YAML config on a generated 50,000-image file in the MedMNIST layout; on a GPU it
runs 4 workers x 0.25 GPU (the shape measured), without one 2 workers on the CPUs.
``--workload NAME`` runs a workload of ``workloads.py`` instead, on each of ``--engines`` (the
configurations of ``peers.py``, e.g. ``raysim_2x1cpu``: what ``peers.py``'s whole-process rows
time); ``--config PATH`` runs that config (e.g. the quickstart).

Each of ``--repeats`` commands is a new process (``python -m raysim.cli run``) with a fresh
output folder. For each: the wall time of the whole command, the start-up phases its manifest
records (:func:`raysim.engine.startup_phases.startup_phases`: imports, data, Ray, workers and
the first round's dispatch after the command) and, on Linux, the CPU seconds the whole machine
spent while it ran (every process: the command, Ray's own, the workers; on a quiet machine,
what the command costs). Prints one JSON line per command and the medians; ``--records FILE``
appends the lines to a records file (BENCHMARKS.md's start-up table, ``report.py``).
``--baseline-tree DIR`` alternates every command with one that runs another checkout of raysim
(``DIR`` first on ``PYTHONPATH``, e.g. a ``git worktree`` of the commit before a change), on
the same config, so before and after are measured in one invocation on one machine.

    python experiments/benchmarks/startup.py [--repeats 3] [--rounds 5] [--baseline-tree DIR]
        [--config PATH | --workload NAME [--engines E ...]] [--records FILE]
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
from datetime import UTC, date, datetime
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    CPU_ENGINES,
    Records,
    bench_config,
    commit,
    cpu_device,
    machine_cpu,
    workload_dataset,
)
from workloads import WORKLOADS  # noqa: E402

from raysim.data.generated import write_medmnist_npz  # noqa: E402
from raysim.engine.startup_phases import startup_phases  # noqa: E402
from raysim.results.manifest import read_manifest  # noqa: E402

PFL_SHAPE = "cnn-1000x50-cifar-shape"


def pfl_config(root: Path, rounds: int, gpu: bool) -> dict:
    """The pfl shape as a raysim config reading ``root/pathmnist.npz``."""
    engine = ({"num_workers": 4, "gpus_per_worker": 0.25, "cpus_per_worker": 1} if gpu
              else {"num_workers": 2, "cpus_per_worker": 1})
    return {"name": "pfl-startup",
            "dataset": {"name": "pathmnist", "root": str(root), "download": False,
                        "verify_checksum": False},
            "partition": {"scheme": "iid", "num_clients": 1000, "samples_per_client": 50},
            "model": {"name": "cnn", "channels": [32, 64], "hidden": 128},
            "algorithm": {"name": "fedavg"},
            "training": {"rounds": rounds, "batch_size": 10, "clients_per_round": 50,
                         "local_epochs": 1, "optimizer": {"name": "sgd", "lr": 0.1}},
            "evaluation": {"every": 0}, "seeds": [0], "engine": engine}


def configs_to_run(args: argparse.Namespace, scratch: Path, gpu: bool) -> dict[str, Path]:
    """The configs to time, by the label of their rows: (workload, engine) names or the
    config's file name."""
    if args.config:
        return {Path(args.config).stem: Path(args.config).resolve()}
    if args.workload:
        dataset = workload_dataset(args.workload, args.data_root, scratch)[0]
        rounds = args.rounds or WORKLOADS[args.workload].rounds
        paths = {}
        for engine in args.engines:
            path = scratch / f"{args.workload}_{engine}.yaml"
            raw = bench_config(args.workload, dataset, rounds, CPU_ENGINES[engine])
            path.write_text(yaml.safe_dump(raw))
            paths[f"{args.workload} {engine}"] = path
        return paths
    write_medmnist_npz(scratch / "data", "pathmnist", n_train=50_000, n_test=200, channels=3,
                       num_classes=9)
    path = scratch / "pfl.yaml"
    path.write_text(yaml.safe_dump(pfl_config(scratch / "data", args.rounds or 5, gpu)))
    return {f"{PFL_SHAPE} {'raysim_4x0.25gpu' if gpu else 'raysim_2x1cpu'}": path}


def timed_command(config: Path, output: Path, cwd: Path, env: dict[str, str]) -> dict:
    """One ``raysim run`` of ``config``: its seconds, phases and the machine's busy CPU
    seconds meanwhile."""
    used: dict[str, float] = {"load_at_start": round(os.getloadavg()[0], 2)}
    started = time.perf_counter()
    with machine_cpu(used):
        subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(config), "--output",
                        str(output), "--no-progress"], check=True, cwd=cwd,
                       stdout=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - started
    manifests = sorted(output.rglob("manifest.json"))
    phases = startup_phases(read_manifest(manifests[0].parent)) or {}
    return {"command_s": round(wall, 2), **{k: round(v, 2) for k, v in phases.items()},
            **used}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, help="rounds (default: the workload's; 5 for "
                        "the pfl shape; a --config's own)")
    parser.add_argument("--baseline-tree", help="another raysim checkout to alternate with")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--config", help="run this config instead of the pfl shape (e.g. "
                        "experiments/quickstart.yaml)")
    chosen.add_argument("--workload", choices=sorted(WORKLOADS),
                        help="run this workload of workloads.py on each of --engines")
    parser.add_argument("--engines", nargs="+", choices=sorted(CPU_ENGINES),
                        default=sorted(CPU_ENGINES), help="raysim's configurations for "
                        "--workload (default: both)")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--records", help="append the records (JSON lines) to this file")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    common = {"device": "cuda" if gpu else cpu_device(), "commit": commit(),
              "date": date.today().isoformat(),
              "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ")}
    records = Records("startup", args.records, common)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        configs = configs_to_run(args, scratch, gpu)
        trees = {"this": None}
        if args.baseline_tree:
            trees = {"baseline": str(Path(args.baseline_tree).resolve()), "this": None}
        rows = []
        for repeat in range(args.repeats):
            for label, config in configs.items():
                for tree, path in trees.items():
                    env = dict(os.environ)
                    if path is not None:
                        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
                    output = scratch / f"results_{len(rows)}"
                    row = {"label": label, "tree": tree, "repeat": repeat,
                           **timed_command(config, output, scratch, env)}
                    rows.append(row)
                    records.add(**row)
        for label in configs:
            for tree in trees:
                mine = [r for r in rows if r["tree"] == tree and r["label"] == label]
                keys = [k for k in mine[0] if k not in ("label", "tree", "repeat")
                        and isinstance(mine[0][k], int | float)]
                medians = {k: round(statistics.median(r[k] for r in mine), 3) for k in keys}
                print(json.dumps({"label": label, "tree": tree, "median": medians}),
                      flush=True)


if __name__ == "__main__":
    main()
