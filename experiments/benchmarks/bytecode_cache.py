"""A client worker's import chain (torch, the engine, ``torch._dynamo``) in a fresh process, in
an environment that keeps no compiled bytecode, against the same with raysim's bytecode cache
(:mod:`raysim.engine.bytecode`), alternated.

The environment without bytecode is made here with an empty bytecode prefix of its own and
``PYTHONDONTWRITEBYTECODE=1`` (nothing read, nothing written: every module compiled from source,
as in an image whose packages were installed without bytecode). raysim's cache is a prefix its
processes write on first use and read afterwards: timed from the second use. The packages' own
bytecode (as pip installs it) is the third line, for reference. Prints one JSON line per
process and the medians. Run from the repository root:

    python experiments/benchmarks/bytecode_cache.py [--repeats 5]
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

CHAIN = "import torch, raysim.engine.worker, raysim.engine.driver, torch._dynamo"


def timed(environment: dict[str, str]) -> float:
    """Seconds for a fresh process to import the chain and exit."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHAIN], env=environment, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory() as scratch:
        cache = Path(scratch) / "raysim-cache"
        environments = {
            "no_bytecode": {**base, "PYTHONPYCACHEPREFIX": str(Path(scratch) / "empty"),
                            "PYTHONDONTWRITEBYTECODE": "1"},
            "raysim_cache": {**base, "PYTHONPYCACHEPREFIX": str(cache / "bytecode"),
                             "PYTHONDONTWRITEBYTECODE": ""},
            "packages_bytecode": {**base, "PYTHONDONTWRITEBYTECODE": "1"},
        }
        first_use = timed(environments["raysim_cache"])  # compiles and writes the cache
        print(json.dumps({"condition": "raysim_cache_first_use", "s": round(first_use, 3)}))
        times: dict[str, list[float]] = {name: [] for name in environments}
        for repeat in range(args.repeats):
            for name, environment in environments.items():
                seconds = timed(environment)
                times[name].append(seconds)
                print(json.dumps({"condition": name, "repeat": repeat, "s": round(seconds, 3)}),
                      flush=True)
        print(json.dumps({"median_s": {name: round(statistics.median(values), 3)
                                       for name, values in times.items()},
                          "python": sys.version.split()[0], "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
