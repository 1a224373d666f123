"""A measured slice of a paper-scale config: time per round and the projected time of a full run.

Runs the first variant of a paper-scale config (one seed) for a few rounds with the config's
model, data size, clients and local work, and prints one JSON line: seconds per round in
steady state (the first round, which pays for CUDA kernels and warm-up, reported apart), the
config's rounds, and the projected hours for one seed and for all seeds x variants at the
config's concurrency. MedMNIST files that are absent (e.g. 224 px PneumoniaMNIST) are replaced
by generated files of the same layout and size; throughput does not depend on the pixels.

    python experiments/benchmarks/paper_scale_slice.py experiments/feddc/pneumonia_paper.yaml \
        --rounds 20 --set engine.num_workers=4 --set engine.gpus_per_worker=0.25
    python experiments/benchmarks/paper_scale_slice.py experiments/fedvck/paper_scale.yaml \
        --rounds 1 --set engine.num_workers=4 --set engine.gpus_per_worker=0.25
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import yaml

from raysim.config import apply_overrides, parse_config
from raysim.data.generated import write_medmnist_npz
from raysim.data.medmnist_io import file_name
from raysim.engine.runner import run_experiment
from raysim.results import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    args = parser.parse_args()
    raw = yaml.safe_load(Path(args.config).read_text())
    variants = raw.pop("variants", None) or {"": {}}
    full_rounds, seeds = raw["training"]["rounds"], len(raw.get("seeds", [0]))
    first = next(iter(variants))
    raw = apply_overrides(raw, [f"{k}={json.dumps(v)}" for k, v in variants[first].items()]
                          + args.overrides)
    raw["training"]["rounds"], raw["seeds"] = args.rounds, [0]
    raw.setdefault("evaluation", {}).update({"every": 0, "membership_audit": 0})
    dataset = raw["dataset"]
    with tempfile.TemporaryDirectory() as scratch:
        size = dataset.get("size", 28)
        if not (Path(args.data_root) / file_name(dataset["name"], size)).exists():
            write_medmnist_npz(Path(scratch), dataset["name"], n_train=2000, n_test=200,
                               size=size)
            dataset.update(root=scratch, download=False, verify_checksum=False)
            real = False
        else:
            dataset.update(root=args.data_root, download=False)
            real = True
        config = parse_config(raw)
        started = time.perf_counter()
        outcome = run_experiment(config, output=str(Path(scratch) / "out"), progress=False)[0]
        total = time.perf_counter() - started
        if outcome.error is not None:
            raise SystemExit(f"the slice failed: {outcome.error}")
        rounds = load(outcome.run_dir)
    per_round = (rounds["seconds_train"] + rounds["seconds_aggregate"]).to_numpy()
    steady = float(per_round[1:].mean()) if len(per_round) > 1 else float(per_round[0])
    hours = steady * full_rounds / 3600
    print(json.dumps({
        "config": args.config, "variant": first, "overrides": args.overrides, "real_data": real,
        "rounds_measured": len(per_round), "first_round_s": round(float(per_round[0]), 2),
        "steady_round_s": round(steady, 3), "startup_s": round(total - per_round.sum(), 1),
        "seconds_train": round(float(rounds["seconds_train"].iloc[-1]), 2),
        "seconds_aggregate": round(float(rounds["seconds_aggregate"].iloc[-1]), 2),
        "config_rounds": full_rounds, "projected_hours_one_run": round(hours, 2),
        "runs_in_config": seeds * len(variants),
    }), flush=True)


if __name__ == "__main__":
    main()
