"""The driver's reduction threads on the pfl shape (issue #32, session 29): raysim's pfl run on
one engine with ``engine.reduction_threads: 1`` and with the default (the driver node's spare
CPUs), alternated in one process (one Ray, the same pooled workers), one JSON line per run with
the threads the driver used (from the run's manifest). Run from the repository root:

    python3 experiments/benchmarks/device/reduction_threads_ab.py ENGINE ROUNDS PAIRS [CLIENTS]

ENGINE is one of ``gpu_vectorized.ENGINES`` (e.g. raysim_vectorized_4x0.25gpu); CLIENTS (default
1,000) shrinks the generated 50-images-per-client file for a CPU dry run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import measure_raysim
from fixtures import write_medmnist_npz
from gpu_vectorized import ENGINES, WORKLOADS, config

from raysim.results.manifest import MANIFEST, read_manifest


def main() -> None:
    spec = dict(WORKLOADS["pfl"])
    if len(sys.argv) > 4:
        spec["clients"] = int(sys.argv[4])
    engine, rounds, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with tempfile.TemporaryDirectory() as scratch_dir:
        root = Path(scratch_dir) / "pfl"
        write_medmnist_npz(root, "pathmnist", n_train=spec["clients"] * spec["samples"],
                           n_test=200, channels=3, num_classes=9)
        dataset = {"name": "pathmnist", "root": str(root), "download": False,
                   "verify_checksum": False}
        for pair in range(pairs):
            for threads in (1, None):
                raw = config(spec, dataset, rounds,
                             {**ENGINES[engine], "reduction_threads": threads})
                output = Path(scratch_dir) / f"out{pair}_{threads}"
                measured = measure_raysim(raw, output)
                used = [read_manifest(path.parent)["driver"]["reduction_threads"]
                        for path in output.rglob(MANIFEST)]
                print(json.dumps({"engine": engine, "pair": pair, "reduction_threads": threads,
                                  "used": used,
                                  **{k: round(v, 3) for k, v in measured.items()}}), flush=True)


if __name__ == "__main__":
    main()
