"""Where a client worker process's import chain goes (issue #32, item 6): ``import torch``, the
engine (Ray's preload list), then ``torch._dynamo`` (what a client worker imports when it is
created), each timed with ``python -X importtime`` in a fresh process, alone and five at once
(the processes of a pfl run at 4 x 0.25 GPU), with the slowest modules under each. Also
whether the interpreter can read and write compiled bytecode for torch's sources (a read-only
install without ``__pycache__`` compiles every module at every import). One JSON line per
process, then one for the bytecode. Run from the repository root:

    python3 experiments/benchmarks/device/import_times.py [--slowest 12]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHAIN = ("torch", "raysim.engine.worker", "raysim.engine.driver", "torch._dynamo")
PROGRAM = "; ".join(f"import {module}" for module in CHAIN)


def parse(report: str, slowest: int) -> dict:
    """The cumulative seconds of each step of the chain and the slowest modules under it."""
    rows = []  # (depth, module, cumulative microseconds), in the order they finished
    for line in report.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.split("|")
        depth = (len(name) - len(name.lstrip())) // 2
        rows.append((depth, name.strip(), int(cumulative)))
    steps: dict[str, dict] = {}
    children: list[tuple[int, str]] = []
    for depth, name, cumulative in rows:
        if depth == 0:
            if name in CHAIN:
                steps[name] = {"s": round(cumulative / 1e6, 3), "slowest": [
                    [child, round(us / 1e6, 3)] for us, child in sorted(children, reverse=True)
                    [:slowest]]}
            children = []
        elif depth <= 2:
            children.append((cumulative, name))
    return steps


def one(environment: dict[str, str], report: Path) -> subprocess.Popen[bytes]:
    """A process importing the chain, its ``-X importtime`` report written to ``report`` (a
    file, not a pipe: a pipe read one process after another stalls the processes whose
    reports fill its buffer first, which session 31's first run of this script mistook for
    the processes contending)."""
    with report.open("wb") as sink:
        return subprocess.Popen([sys.executable, "-X", "importtime", "-c", PROGRAM],
                                stderr=sink, stdout=subprocess.DEVNULL, env=environment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slowest", type=int, default=12)
    parser.add_argument("--together", type=int, default=5)
    args = parser.parse_args()
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get(
        "CUDA_VISIBLE_DEVICES", "0")}
    with tempfile.TemporaryDirectory() as scratch:
        for label, count in (("alone", 1), ("alone", 1), ("together", args.together)):
            reports = [Path(scratch) / f"{label}-{index}.txt" for index in range(count)]
            started = time.perf_counter()
            processes = [one(environment, report) for report in reports]
            ended = []
            for process in processes:
                process.wait()
                ended.append(time.perf_counter() - started)
            for index, report in enumerate(reports):
                print(json.dumps({"run": label, "process": index,
                                  "wall_s": round(ended[index], 3),
                                  "steps": parse(report.read_text(), args.slowest)}),
                      flush=True)
    import torch
    import torch._dynamo
    sources = [Path(torch.__file__), Path(torch._dynamo.__file__)]
    print(json.dumps({
        "bytecode": {str(source): {
            "compiled_exists": Path(importlib.util.cache_from_source(str(source))).exists(),
            "cache_writable": os.access(source.parent / "__pycache__", os.W_OK)
            or os.access(source.parent, os.W_OK)} for source in sources},
        "dont_write_bytecode": sys.dont_write_bytecode,
        "pycache_prefix": sys.pycache_prefix, "python": sys.version.split()[0],
        "cpus": os.cpu_count()}), flush=True)


if __name__ == "__main__":
    main()
