"""The driver's merge of the workers' partials: ``--partials`` float64 vectors of
``--values`` values, read-only as they arrive from Ray's object store, summed left to right
by :func:`raysim.algorithms.blocked_sum.evaluate` (what ``WeightedSum.vector`` does on the
driver), against a plain PyTorch loop over whole vectors (``clone`` the first, ``add_`` the
rest), then the mean's division into float32. Freed memory kept for reuse, as on a driver
host. ``--threads N``: raysim splits its blocks between N threads
(:func:`raysim.algorithms.blocked_sum.set_threads`, as a driver host with spare CPUs does), the
plain loop uses N torch threads. Prints one JSON line: median milliseconds of each, their
ratio, and whether both give the same bits.

    python experiments/benchmarks/partial_merge.py [--partials 4] [--values 1200000]
        [--repeats 60] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import numpy as np
import torch

from raysim.algorithms import blocked_sum
from raysim.engine.memory import keep_freed_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partials", type=int, default=4)
    parser.add_argument("--values", type=int, default=1_200_000)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    blocked_sum.set_threads(args.threads)
    torch.set_num_threads(1)
    keep_freed_memory()  # (as DriverHost does: no page faults from each round's new vectors)
    warnings.filterwarnings("ignore", "The given NumPy array is not writable")
    partials = []
    for seed in range(args.partials):
        array = np.random.default_rng(seed).normal(size=args.values)
        array.setflags(write=False)  # (as a partial read in place from the object store)
        partials.append(torch.from_numpy(array))

    def raysim_merge() -> torch.Tensor:
        expression: blocked_sum.Expression = blocked_sum.Dense(partials[0])
        for partial in partials[1:]:
            expression = blocked_sum.Merge(expression, blocked_sum.Dense(partial))
        total = blocked_sum.evaluate(expression, args.values, torch.device("cpu"))
        mean = torch.empty(args.values, dtype=torch.float32)
        blocked_sum.for_each_range(args.values, total.device, lambda lo, hi: torch.div(
            total[lo:hi], args.partials, out=mean[lo:hi]))
        return mean

    def plain_merge() -> torch.Tensor:
        torch.set_num_threads(args.threads)
        total = partials[0].clone()
        for partial in partials[1:]:
            total.add_(partial)
        mean = (total / args.partials).float()
        torch.set_num_threads(1)
        return mean

    timings: dict[str, list[float]] = {"raysim": [], "plain": []}
    for _ in range(args.repeats):
        for name, merge in (("raysim", raysim_merge), ("plain", plain_merge)):
            started = time.perf_counter()
            merge()
            timings[name].append(time.perf_counter() - started)
    raysim_ms = statistics.median(timings["raysim"]) * 1000
    plain_ms = statistics.median(timings["plain"]) * 1000
    print(json.dumps({"partials": args.partials, "values": args.values, "threads": args.threads,
                      "raysim_ms": round(raysim_ms, 3), "plain_ms": round(plain_ms, 3),
                      "raysim_over_plain_time": round(raysim_ms / plain_ms, 3),
                      "same_bits": bool(torch.equal(raysim_merge(), plain_merge()))}))


if __name__ == "__main__":
    main()
