"""Where a raysim run's time goes: its driver and worker processes sampled by py-spy while it
runs (``peers.py --profile``, ``speed.py --profile``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml
from harness import CPU_ENGINES, GPU_ENGINES, bench_config

RAY_ROLES = {"ray::DriverHost": "driver", "ray::WorkerHost": "worker",
             "ray::ClientWorker": "worker"}
"""raysim's Ray processes by the start of their title, and the role each plays."""


def _ray_processes() -> dict[int, str]:
    """This machine's raysim driver and worker processes, by pid (from ``ps``)."""
    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = {}
    for line in listing.splitlines():
        pid, _, args = line.strip().partition(" ")
        for prefix, role in RAY_ROLES.items():
            if args.startswith(prefix):
                found[int(pid)] = role
    return found


def profile_raysim(raw: dict, scratch: Path, env: dict[str, str], py_spy: str, stacks: Path,
                   after: float, seconds: int = 10, rate: int = 100) -> dict:
    """One untimed ``raysim run`` of ``raw`` with py-spy sampling each driver and worker
    process for ``seconds``, from ``after`` seconds after the command (when its first round has
    been dispatched; busy threads only). Returns, per role, its busy share of the sampled time,
    the functions with the most samples of their own (the leaf frames) and the raysim functions
    under which the most samples fell (the deepest raysim frame of each stack); every sampled
    stack is appended to ``stacks`` (py-spy's raw format, each line prefixed by role and pid)."""
    path = scratch / f"{raw['name']}.yaml"
    path.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "raysim.cli", "run", str(path), "--no-progress",
               "--output", str(scratch / "profiled")]
    started = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env=env) as run:
        time.sleep(max(0.0, after - (time.perf_counter() - started)))
        processes = _ray_processes()
        samplers = {pid: subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--nonblocking", "--format", "raw",
             "--rate", str(rate), "-d", str(seconds), "-o", str(scratch / f"stacks_{pid}.txt")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for pid in processes}
        for sampler in samplers.values():
            sampler.wait(timeout=seconds + 60)
        run.wait(timeout=600)
    summary: dict[str, dict] = {}
    for role in sorted(set(processes.values())):
        own: dict[str, int] = {}
        under: dict[str, int] = {}  # by the deepest raysim frame on the stack
        busy = 0
        pids = [pid for pid, r in processes.items() if r == role]
        for pid in pids:
            sampled = scratch / f"stacks_{pid}.txt"
            lines = sampled.read_text().splitlines() if sampled.exists() else []
            with open(stacks, "a") as handle:
                handle.writelines(f"{role} {pid};{line}\n" for line in lines)
            for line in lines:
                frames, _, count = line.rpartition(" ")
                stack = frames.split(";")
                own[stack[-1]] = own.get(stack[-1], 0) + int(count)
                ours = [frame for frame in stack if "raysim/" in frame]
                if ours:
                    under[ours[-1]] = under.get(ours[-1], 0) + int(count)
                busy += int(count)
        total = max(busy, 1)
        summary[role] = {
            "processes": len(pids),
            "busy_share": round(busy / (len(pids) * seconds * rate), 3),
            "top_own": [[name, round(n / total, 3)] for name, n in
                        sorted(own.items(), key=lambda item: -item[1])[:10]],
            "top_under_raysim": [[name, round(n / total, 3)] for name, n in
                                 sorted(under.items(), key=lambda item: -item[1])[:10]]}
    return summary


def profile_side(workload: str, dataset: dict, label: str, timed: dict, rounds: int,
                 scratch: Path, env: dict[str, str], py_spy: str, stacks: Path) -> dict:
    """An untimed run of raysim side ``label`` (a key of ``GPU_ENGINES`` or ``CPU_ENGINES``)
    on ``workload``, as long as its first round's start-up and 1.5x the sampling (from
    ``timed``, that side's last measurement: its first-round seconds and rate; at least
    ``rounds`` rounds), its driver and workers sampled by py-spy (:func:`profile_raysim`).
    Returns the fields of its record (``side`` is ``<label>_profile``)."""
    after = (timed.get("first_round_s") or 15.0) + 2.0
    rate = timed.get("rounds_per_s")
    rounds = max(rounds, int(15 * rate) if isinstance(rate, float) else 300)
    raw = bench_config(workload, dataset, rounds, {**GPU_ENGINES, **CPU_ENGINES}[label])
    raw.update(name=f"{workload}-profile", evaluation={"every": 0})
    return {"rounds": rounds, "side": f"{label}_profile",
            "profile": profile_raysim(raw, scratch, env, py_spy, stacks, after)}
