"""A local Ray's start with Ray's default wait between a raylet's attempts to connect to its own
object store (1 s) against raysim's (``raysim.engine.cluster.STORE_CONNECT_SETTINGS``: 50 ms).

The raylet starts its object store in a thread and connects to it at once. When the store is
not listening yet, the raylet waits the whole interval before it tries again. Each
measurement is a fresh Python process that starts a local Ray with raysim's raylet settings
(the preload list, the early prestart), once with Ray's default interval and once with
raysim's, alternated. It reports:
- ``ray.init``'s seconds;
- the raylet's stall: the seconds between the store's first log line and the object manager's
  start, from the raylet's log (about 1 s when the first attempt missed).

Prints one JSON line per start, then per variant the median ``ray.init`` and the number of
starts whose raylet stalled for 0.5 s or more:

    python experiments/benchmarks/ray_store_connect.py [--repeats 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_MEASURE = """
import json, os, re, sys, time
from datetime import datetime
from raysim.engine.cluster import STORE_CONNECT_SETTINGS, raylet_environment  # (before ray)
import ray

settings = raylet_environment()
if sys.argv[1] == "ray_default":
    for name in STORE_CONNECT_SETTINGS:
        settings.pop(name)
os.environ.update(settings)
started = time.perf_counter()
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
         logging_level="ERROR")
init_s = time.perf_counter() - started
logs = ray._private.worker.global_worker.node.get_logs_dir_path()
ray.shutdown()
stamps = {}
for line in open(os.path.join(logs, "raylet.out")):
    found = re.match(r"\\[(\\S+ \\S+) I \\d+ \\d+\\] \\(raylet\\) (\\S+):", line)
    if found and found.group(2).split(":")[0] in ("store.cc", "grpc_server.cc"):
        stamps.setdefault(found.group(2).split(":")[0], datetime.strptime(
            found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp())
stall = stamps["grpc_server.cc"] - stamps["store.cc"]
print(json.dumps({"variant": sys.argv[1], "ray_init_s": round(init_s, 2),
                  "raylet_store_stall_s": round(stall, 3)}))
"""

VARIANTS = ("ray_default", "raysim")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("RAY_raylet_client_")}
    rows: list[dict] = []
    for _ in range(args.repeats):
        for variant in VARIANTS:
            done = subprocess.run([sys.executable, "-c", _MEASURE, variant], capture_output=True,
                                  text=True, timeout=120, env=environment, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    for variant in VARIANTS:
        mine = [row for row in rows if row["variant"] == variant]
        print(json.dumps({"variant": variant, "starts": len(mine),
                          "median_ray_init_s": round(statistics.median(r["ray_init_s"] for r in mine), 3),
                          "stalled_starts": sum(r["raylet_store_stall_s"] >= 0.5 for r in mine)}),
              flush=True)


if __name__ == "__main__":
    main()
