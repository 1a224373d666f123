"""Every registered algorithm on CUDA (2 workers x 0.25 GPU), then on CPUs, with the membership
audit: the device data plane's GPU paths (device weights, partials, relayed states, resident
data). One JSON line per algorithm (final accuracy, seconds, device, data residence).

    python experiments/benchmarks/cuda_smoke.py
"""
import json
import tempfile
import time
from pathlib import Path

from algorithm_configs import contract_raw

from raysim.algorithms import ALGORITHMS
from raysim.config import parse_config
from raysim.data.generated import write_medmnist_npz
from raysim.engine.runner import run_experiment
from raysim.results import load
from raysim.results.manifest import read_manifest

with tempfile.TemporaryDirectory() as scratch:
    root = Path(scratch) / "data"
    write_medmnist_npz(root, n_train=90, n_test=30)
    for name in sorted(ALGORITHMS):
        raw = contract_raw(root, name)
        out: dict = {}
        for gpus in (0.25, 0.0):
            raw["engine"] = {"num_workers": 2, "cpus_per_worker": 1, "gpus_per_worker": gpus}
            raw["evaluation"] = {"membership_audit": 8}
            started = time.time()
            outcome = run_experiment(parse_config(raw), output=str(Path(scratch) / f"{name}{gpus}"),
                                     progress=False)[0]
            if outcome.error is not None:
                out[gpus] = f"FAILED {outcome.error[:300]}"
                continue
            rounds = load(outcome.run_dir)
            manifest = read_manifest(outcome.run_dir)
            out[gpus] = {"acc": round(float(rounds["accuracy"].iloc[-1]), 4),
                         "s": round(time.time() - started, 1),
                         "device": sorted({w.get("device", "?") for w in manifest["workers"]}),
                         "data_on_device": [d.get("data_on_device")
                                            for d in manifest.get("worker_data", [])]}
        print(json.dumps({"algorithm": name, "cuda": out[0.25], "cpu": out[0.0]}), flush=True)
