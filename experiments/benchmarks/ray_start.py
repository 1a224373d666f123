"""A local Ray's start with and without the head processes raysim never uses (the API server,
the autoscaler monitor and the log monitor: ``raysim.engine.launch.local_ray.UNUSED_RAY_SERVICES``).

Each measurement is a fresh Python process that starts a local Ray the way ``raysim run`` does
(its CPU count, the engine preloaded in Ray's worker processes, the engine imported in a
background thread beside ``ray.init``), then asks for three actors that import the engine (two
client workers and a driver host, the shape of ``convnet128-70x64-pneumonia``) and waits until
all three answer. The two variants alternate. Prints one JSON line per measurement and the medians:

    python experiments/benchmarks/ray_start.py [--repeats 5]

Measure on a quiet machine: the figures are CPU-bound on a small one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys

_MEASURE = """
import contextlib, json, os, sys, threading, time
started = time.perf_counter()
import ray
from raysim.engine.launch.warm_cluster import PRELOAD_VARIABLE, WORKER_MODULES
from raysim.engine.launch.local_ray import _without_unused_ray_services

os.environ[PRELOAD_VARIABLE] = ",".join(WORKER_MODULES)
engine = threading.Thread(target=lambda: __import__("raysim.engine.runner"))
engine.start()
lean = sys.argv[1] == "without"
with _without_unused_ray_services() if lean else contextlib.nullcontext():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
ray_up = time.perf_counter()

@ray.remote(num_cpus=0)
class Pooled:
    def __init__(self):
        import raysim.engine.run.worker  # noqa: F401  (preloaded: a no-op on a preloaded process)
    def pid(self):
        return os.getpid()

actors = [Pooled.remote() for _ in range(3)]
ray.get([actor.pid.remote() for actor in actors])
ready = time.perf_counter()
engine.join()
print(json.dumps({"variant": sys.argv[1], "ray_init_s": round(ray_up - started, 2),
                  "three_actors_ready_s": round(ready - started, 2)}))
ray.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows: list[dict] = []
    for _ in range(args.repeats):
        for variant in ("with", "without"):
            done = subprocess.run([sys.executable, "-c", _MEASURE, variant], check=True,
                                  capture_output=True, text=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    for variant in ("with", "without"):
        mine = [row for row in rows if row["variant"] == variant]
        print(f"{variant} the unused services: ray.init median "
              f"{statistics.median(r['ray_init_s'] for r in mine):.2f} s, three engine actors "
              f"ready median {statistics.median(r['three_actors_ready_s'] for r in mine):.2f} s")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
