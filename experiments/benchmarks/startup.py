"""Start-up of ``raysim run`` as a user runs it, on the pfl shape.

The pfl-research CIFAR-10 benchmark's shape (``cnn-1000x50-cifar-shape``: 1,000 clients x
50 samples of 28x28x3, 50 per round, ``model: cnn``, batch 10, lr 0.1, one local epoch) as a
YAML config on a generated 50,000-image file in the MedMNIST layout, run ``--repeats`` times as
a new process (``python -m raysim.cli run``), each from a fresh output folder. For each
command: the wall time of the whole command and the start-up phases its manifest records
(:func:`raysim.engine.startup_phases.startup_phases`: imports, data, Ray, workers and the first round's
dispatch after the command). Prints one JSON line per command and the medians. On a GPU the
config runs 4 workers x 0.25 GPU (the shape measured); without one, 2 workers on the CPUs.
``--baseline-tree DIR`` alternates every command with one that runs another checkout of raysim
(``DIR`` first on ``PYTHONPATH``, e.g. a ``git worktree`` of the commit before a change), on
the same file, so before and after are measured in one invocation on one machine.
``--config PATH`` runs that config instead (e.g. the quickstart).

    python experiments/benchmarks/startup.py [--repeats 3] [--rounds 5] [--baseline-tree DIR]
        [--config PATH]
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
from pathlib import Path

import yaml

from raysim.data.generated import write_medmnist_npz
from raysim.engine.startup_phases import startup_phases
from raysim.results.manifest import read_manifest


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-tree", help="another raysim checkout to alternate with")
    parser.add_argument("--config", help="run this config instead of the pfl shape (e.g. "
                        "experiments/quickstart.yaml; --rounds then does not apply)")
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        if args.config:
            config = Path(args.config).resolve()
        else:  # the pfl shape on a generated file
            write_medmnist_npz(scratch / "data", "pathmnist", n_train=50_000, n_test=200,
                               channels=3, num_classes=9)
            config = scratch / "pfl.yaml"
            config.write_text(yaml.safe_dump(pfl_config(scratch / "data", args.rounds, gpu)))
        trees = {"this": None}
        if args.baseline_tree:
            trees = {"baseline": str(Path(args.baseline_tree).resolve()), "this": None}
        rows = []
        for repeat in range(args.repeats):
            for tree, path in trees.items():
                env = dict(os.environ)
                if path is not None:
                    env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
                output = scratch / f"results_{tree}{repeat}"
                started = time.perf_counter()
                subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(config), "--output",
                                str(output), "--no-progress"], check=True, cwd=scratch,
                               stdout=subprocess.DEVNULL, env=env)
                wall = time.perf_counter() - started
                manifests = sorted(output.rglob("manifest.json"))
                phases = startup_phases(read_manifest(manifests[0].parent)) or {}
                row = {"tree": tree, "repeat": repeat, "device": "cuda" if gpu else "cpu",
                       "command_s": round(wall, 2), **{k: round(v, 2) for k, v in phases.items()}}
                rows.append(row)
                print(json.dumps(row), flush=True)
        keys = [k for k in rows[0] if k not in ("tree", "repeat", "device")]
        for tree in trees:
            mine = [r for r in rows if r["tree"] == tree]
            medians = {k: round(statistics.median(r[k] for r in mine), 3) for k in keys}
            print(json.dumps({"tree": tree, "median": medians}), flush=True)


if __name__ == "__main__":
    main()
