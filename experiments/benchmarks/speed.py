"""raysim's speed against a plain PyTorch loop and the on-device reference, and optionally
against raysim from another checkout, on the named workloads of ``workloads.py`` (FedAvg,
FedDC, FedVCK and MH-pFLID shapes).

For each workload and repeat, the sides run one after another in an order that alternates
between repeats (A B C, C B A, ...), so that the machine's drift between minutes falls on
every side:

- ``raysim``: ``raysim run`` of the workload's config as a whole process, from this checkout
  (on a GPU machine each configuration of ``--engines``; on CPUs two workers of one CPU);
- ``raysim_baseline`` (with ``--baseline-tree DIR``, another checkout, e.g. ``git worktree add
  /tmp/base main``): the same config run from that tree, to measure a change;
- ``plain_pytorch_loop`` and ``on_device_vmap_reference``: the method's plain loop and
  reference (``baselines.py``) in this process on the same device (FedVCK and MH-pFLID have no
  reference; their loops run on the CPU), on CPUs at one torch thread (what each of raysim's
  ``raysim_2x1cpu`` workers uses) and, as ``<side>_<n>threads``, at every other count up to the
  machine's CPUs, so that each side is compared at an equal thread budget and at its best.

raysim's rate is one over its median round (the rounds after the first, from its results);
the others' the rounds after a warm-up round over their time. Each measurement is one JSON
record (suite ``speed``; workload, side, repeat, rounds/s, device, commit), and each workload
ends with a summary record: the median rate of every side and, per repeat pair, raysim over
each other side (the mean of the per-repeat ratios and its t against 1, n - 1 degrees of
freedom). Records go to ``--records`` (default
``records/speed_<device>_<commit>.jsonl``).

    python experiments/benchmarks/speed.py --workloads mlp1024-1000x4-synthetic \\
        [--rounds 40] [--repeats 3] [--baseline-tree /tmp/base] [--data-root DIR]
        [--profile STACKS --py-spy PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from baselines import BASELINES  # noqa: E402
from harness import (  # noqa: E402
    CPU_ENGINES,
    GPU_ENGINES,
    Records,
    bench_config,
    commit,
    cpu_device,
    paired_ratios,
    raysim_process,
    record_path,
    thread_counts,
    threads_side,
    torch_threads,
    workload_dataset,
)
from profiling import profile_side  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

PLAIN_ROUNDS = {"fedvck": 3, "mhpflid": 3}
"""At most this many timed rounds of a method's plain loop (default 60): slow loops."""


def raysim_rate(measured: dict) -> float | None:
    """One over the median round of a raysim measurement (None when it failed)."""
    split = measured.get("round_split_ms") or {}
    return 1e3 / split["round"] if split.get("round") else None


def measure_workload(name: str, args: argparse.Namespace, device: torch.device,
                     records: Records, scratch: Path) -> None:
    """Every side of workload ``name``, ``args.repeats`` times alternating, then the
    summary record."""
    spec = WORKLOADS[name]
    rounds = args.rounds or spec.rounds
    dataset, real = workload_dataset(name, args.data_root, scratch)
    plain, reference = BASELINES[spec.algorithm["name"]]
    engines = GPU_ENGINES if device.type == "cuda" else CPU_ENGINES
    engines = {k: v for k, v in engines.items() if not args.engines or k in args.engines}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    sides: dict[str, Callable[[], dict | float]] = {}
    threads_of: dict[str, int] = {}  # a baseline side's torch threads
    for label, engine in engines.items():
        raw = bench_config(name, dataset, rounds, engine)
        sides[label] = lambda raw=raw: raysim_process(raw, scratch, env, args.timeout)
        if args.baseline_tree:
            sides[f"{label}_baseline"] = lambda raw=raw: raysim_process(
                raw, scratch, env, args.timeout, tree=Path(args.baseline_tree))
    raw = bench_config(name, dataset, rounds, next(iter(engines.values())))
    plain_rounds = min(rounds, PLAIN_ROUNDS.get(spec.algorithm["name"], 60))
    for threads in thread_counts(device):
        def at(baseline: Callable[..., float], threads: int = threads) -> Callable[[], float]:
            def measured() -> float:
                with torch_threads(threads):
                    return baseline(spec, raw, plain_rounds, device)
            return measured

        sides[threads_side("plain_pytorch_loop", threads)] = at(plain)
        threads_of[threads_side("plain_pytorch_loop", threads)] = threads
        if reference is not None:
            sides[threads_side("on_device_vmap_reference", threads)] = at(reference)
            threads_of[threads_side("on_device_vmap_reference", threads)] = threads
    rates: dict[str, list[float]] = {side: [] for side in sides}
    measured: dict[str, dict] = {}  # each raysim side's last measurement
    order = list(sides)
    for repeat in range(args.repeats):
        for side in order if repeat % 2 == 0 else reversed(order):
            result = sides[side]()
            if isinstance(result, dict):
                measured[side] = result
                rate = raysim_rate(result)
                records.add(workload=name, side=side, repeat=repeat, rounds=rounds,
                            real_data=real, **{**result, "rounds_per_s": round(rate, 3)
                                               if rate else None})
            else:
                rate = float(result)
                records.add(workload=name, side=side, repeat=repeat, rounds=plain_rounds,
                            real_data=real, rounds_per_s=round(rate, 3),
                            threads=threads_of[side])
            if rate:
                rates[side].append(rate)
    summary: dict[str, object] = {side: round(statistics.median(r), 3)
                                  for side, r in rates.items() if r}
    for label in engines:  # against the plain loop, the reference and its own baseline
        others = [s for s in rates if not s.startswith("raysim_") or s == f"{label}_baseline"]
        for other in others:
            if len(rates[label]) == len(rates[other]) > 0:
                summary[f"{label}_over_{other}"] = paired_ratios(rates[other], rates[label])
    records.add(workload=name, side="summary", repeats=args.repeats, medians=summary)
    if args.profile:
        label = next(iter(engines))
        records.add(workload=name, **profile_side(
            name, dataset, label, measured.get(label, {}), rounds, scratch, env, args.py_spy,
            Path(args.profile)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", required=True, choices=list(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds of every raysim run (default: the workload's)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", nargs="+", default=None,
                        choices=[*GPU_ENGINES, *CPU_ENGINES],
                        help="raysim configurations (default: all of this device's)")
    parser.add_argument("--baseline-tree", default=None,
                        help="another checkout whose raysim runs alternate with this one's")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--records", default=None,
                        help="append the records here (default: records/speed_<device>_<commit>"
                             ".jsonl)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per raysim run")
    parser.add_argument("--profile", metavar="STACKS",
                        help="also, per workload, one untimed run of raysim's first "
                             "configuration, its driver and workers sampled by py-spy: a "
                             "record (side <configuration>_profile), and the sampled stacks "
                             "appended to this file")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else cpu_device()
    import ray

    common = {"device": device_name, "cpus": os.cpu_count(), "commit": commit(),
              "date": date.today().isoformat(),
              "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
              "versions": {"torch": torch.__version__, "ray": ray.__version__}}
    if args.baseline_tree:
        common["baseline_commit"] = commit(Path(args.baseline_tree))
    path = args.records or record_path("speed", device_name.lower().replace(" ", "-"),
                                       common["commit"])
    records = Records("speed", path, common)
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.workloads:
            measure_workload(name, args, device, records, Path(scratch))


if __name__ == "__main__":
    main()
