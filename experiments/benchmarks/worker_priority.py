"""Worker priority: a raysim run whose Ray workers run at niceness 0 (what a raysim Ray sets)
against Ray's default 15, on a quiet machine and beside other work, under the machine's scheduler setting and
with Linux's session autogroups off.

For each condition (``quiet``; ``loaded``: ``--load`` busy processes at niceness 0, a user's
other programs, started before and stopped after the condition's runs), ``--repeats``
alternated pairs of whole-process ``raysim run`` of one workload (``RAY_worker_niceness`` 0
and 15, the order reversed every other pair). Each run records its seconds, steady rounds per
second, the load average when it started and the niceness its Ray worker processes were seen
at (sampled from /proc while it ran); each condition closes with a summary record: the mean
over pairs of the wall time at 15 over the time at 0, and its t.

Under autogroups (on in many desktop kernels) the CPUs are shared between sessions before
niceness counts, and Ray's raylet runs in a session of its own, so a user's programs in
another session meet the run's workers as one group whatever their niceness; with autogroups
off (``--autogroup off``: the loaded condition with ``/proc/sys/kernel/sched_autogroup_enabled``
set to 0, restored after; needs root) niceness orders every process on the machine.

    python experiments/benchmarks/worker_priority.py [--workload NAME] [--repeats 3]
        [--load 4] [--autogroup machine|off] [--conditions quiet loaded] [--records FILE]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    CPU_ENGINES,
    Records,
    Sampler,
    bench_config,
    commit,
    cpu_device,
    paired_ratios,
    process_stats,
    raysim_process,
    workload_dataset,
)
from workloads import WORKLOADS  # noqa: E402

NICENESS = ("0", "15")
"""raysim's setting, then Ray's default."""


class NicenessSampler(Sampler):
    """The niceness values of Ray worker processes (``ray::`` in their command line) seen
    while it runs, sampled from /proc every half second."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def sample(self) -> None:
        for pid, fields in process_stats():
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(b"ray::"):
                self.seen.add(int(fields[16]))  # stat's 19th field


AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
"""Linux's session autogroups: where on (1), the scheduler shares the CPUs fairly between
sessions first and niceness only orders the processes within one session; Ray's raylet starts
a session of its own, so its workers' niceness then matters only among Ray's processes."""


def autogroup() -> str:
    """The machine's autogroup setting ("1", "0", or "absent")."""
    try:
        return AUTOGROUP.read_text().strip()
    except OSError:
        return "absent"


@contextmanager
def autogroup_set(value: str | None) -> Iterator[str]:
    """The autogroup setting ``value`` for the block (None: as the machine has it), restored
    after; yields the setting in force."""
    before = autogroup()
    if value is None or value == before:
        yield before
        return
    AUTOGROUP.write_text(value)  # needs root; a PermissionError says so
    try:
        yield value
    finally:
        AUTOGROUP.write_text(before)


def busy_processes(count: int) -> list[subprocess.Popen]:
    """``count`` processes that spin on a CPU at niceness 0 until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="convnet32-150x8-pneumonia", choices=WORKLOADS)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load", type=int, default=4,
                        help="busy processes beside the runs in the loaded condition")
    parser.add_argument("--conditions", nargs="+", default=["quiet", "loaded"],
                        choices=["quiet", "loaded"])
    parser.add_argument("--autogroup", choices=["machine", "off"], default="machine",
                        help="the loaded condition under the machine's scheduler setting, or "
                             "with Linux's session autogroups off (as on many servers; needs "
                             "root, restored after)")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--records", help="append the records (JSON lines) to this file")
    args = parser.parse_args()
    rounds = args.rounds or WORKLOADS[args.workload].rounds
    records = Records("worker_priority", args.records, {
        "device": cpu_device(), "commit": commit(), "date": date.today().isoformat(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "workload": args.workload, "rounds": rounds, "engine": "raysim_2x1cpu"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        dataset = workload_dataset(args.workload, args.data_root, scratch)[0]
        for condition in args.conditions:
            loaded = condition == "loaded"
            with autogroup_set("0" if loaded and args.autogroup == "off" else None) as group:
                measure_condition(condition, busy_processes(args.load) if loaded else [],
                                  group, args, rounds, dataset, scratch, env, records)


def measure_condition(condition: str, load: list[subprocess.Popen], group: str,
                      args: argparse.Namespace, rounds: int, dataset: dict, scratch: Path,
                      env: dict[str, str], records: Records) -> None:
    """The alternated pairs of one condition and its summary; ``load`` killed after."""
    try:
        time.sleep(5 if load else 0)  # let the load average see them
        walls: dict[str, list[float]] = {n: [] for n in NICENESS}
        for repeat in range(args.repeats):
            for niceness in NICENESS if repeat % 2 == 0 else NICENESS[::-1]:
                raw = bench_config(args.workload, dataset, rounds,
                                   CPU_ENGINES["raysim_2x1cpu"])
                raw.update(name=f"priority-{condition}-{niceness}",
                           evaluation={"every": rounds, "clients": False})
                load_at_start = round(os.getloadavg()[0], 2)
                with NicenessSampler() as sampler:
                    measured = raysim_process(
                        raw, scratch, {**env, "RAY_worker_niceness": niceness},
                        args.timeout)
                walls[niceness].append(measured["wall_s"])
                records.add(condition=condition, busy_processes=len(load),
                            autogroup=group, repeat=repeat, worker_niceness=niceness,
                            seen_niceness=sorted(sampler.seen),
                            load_at_start=load_at_start,
                            **{k: measured.get(k) for k in
                               ("wall_s", "rounds_per_s", "first_round_s", "error")
                               if measured.get(k) is not None})
        records.add(condition=condition, busy_processes=len(load), side="summary",
                    autogroup=group,
                    pairs=args.repeats,
                    wall_s={n: walls[n] for n in NICENESS},
                    **{f"wall_15_over_0_{k}": v for k, v in
                       paired_ratios(walls["0"], walls["15"]).items()})
    finally:
        for process in load:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
