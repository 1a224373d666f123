"""How cost grows with clients: raysim and pfl-research 0.6 at 1,000 to 1,000,000 virtual
clients, whole process, start-up, steady seconds per round and peak memory of the whole
process tree.

Workload: FedAvg, an MLP (hidden 32) on generated tabular data (30 standardised features, two
classes from a random linear teacher; 4 rows per client, as many clients as asked, and 10,000
test rows), 100 clients a round, one local SGD step of batch 4, lr 0.1. Both sides read the same
arrays: raysim from the dataset file through ``dataset.path`` (loading and partitioning inside
its timed command), pfl-research from the clients' rows written before its clock starts
(``pfl_workload.py``, ``torchrun`` with one process per CPU, one thread each); raysim runs two
workers of one CPU.

For each client count and round count (``--rounds``), ``--repeats`` alternated runs of each
side, each a JSON record: ``wall_s`` (the command), ``steady_s_per_round`` (the rounds after
the first), ``startup_s`` (the wall time less the steady rounds: start-up, data, the first
round and the exit), and ``peak_memory_mb``: the largest sum, sampled every 0.2 s, of the
proportional set size (PSS: shared pages divided among the processes that map them, so the
object store and the libraries count once) over the command's process and every process
below it (raysim's driver and workers, Ray's own processes; pfl-research's ranks).

    python experiments/benchmarks/client_scale.py --pfl-python ../pfl-venv/bin/python \\
        [--clients 1000 10000 100000 1000000] [--rounds 20 200] [--repeats 1] [--records FILE]
    python experiments/benchmarks/client_scale.py --plot RECORDS PNG   # the figure
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import UTC, date, datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harness import (  # noqa: E402
    CPU_ENGINES,
    Records,
    Sampler,
    commit,
    cpu_device,
    export_for_peers,
    last_json,
    process_stats,
    raysim_process,
    run_process,
)

FEATURES, TEST_ROWS, ROWS_PER_CLIENT, PER_ROUND = 30, 10_000, 4, 100


def write_dataset(path: Path, clients: int) -> None:
    """``clients`` x 4 training rows and 10,000 test rows of the generated task (seed 0)."""
    rng = np.random.default_rng(0)
    teacher = rng.standard_normal(FEATURES)
    arrays = {}
    for split, rows in (("train", clients * ROWS_PER_CLIENT), ("test", TEST_ROWS)):
        x = rng.standard_normal((rows, FEATURES), dtype=np.float32)
        noise = rng.standard_normal(rows).astype(np.float32)
        arrays[f"{split}_images"] = x
        arrays[f"{split}_labels"] = (x @ teacher + noise > 0).astype(np.int64)
    np.savez(path, **arrays)


def raysim_config(data: Path, clients: int, rounds: int) -> dict:
    """The workload as a raysim config."""
    return {"name": f"scale-{clients}-{rounds}",
            "dataset": {"name": "scale", "path": str(data)},
            "partition": {"scheme": "iid", "num_clients": clients,
                          "samples_per_client": ROWS_PER_CLIENT},
            "model": {"name": "mlp", "hidden": [32]}, "algorithm": {"name": "fedavg"},
            "training": {"rounds": rounds, "clients_per_round": PER_ROUND, "local_steps": 1,
                         "batch_size": ROWS_PER_CLIENT, "optimizer": {"name": "sgd", "lr": 0.1}},
            "evaluation": {"every": rounds, "clients": False}, "seeds": [0],
            "engine": {**CPU_ENGINES["raysim_2x1cpu"], "flush_seconds": 5.0}}


class TreeMemory(Sampler):
    """The peak, over samples every 0.2 s, of the summed PSS of this process's descendants
    (the measured command and everything it started), in MB."""

    interval = 0.2

    def __init__(self) -> None:
        super().__init__()
        self.peak_mb = 0.0

    def sample(self) -> None:
        parents = {pid: int(fields[1]) for pid, fields in process_stats()}
        below = {os.getpid()}
        grown = True
        while grown:
            more = {pid for pid, parent in parents.items() if parent in below} - below
            below |= more
            grown = bool(more)
        total_kb = 0
        for pid in below - {os.getpid()}:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
            except OSError:
                continue
            total_kb += next((int(line.split()[1]) for line in rollup.splitlines()
                              if line.startswith("Pss:")), 0)
        self.peak_mb = max(self.peak_mb, total_kb / 1024)


def measure(side: str, clients: int, rounds: int, data: Path, peer_data: Path, spec: dict,
            args: argparse.Namespace, scratch: Path, env: dict[str, str]) -> dict:
    """One whole-process run of ``side`` (raysim or pfl_research)."""
    with TreeMemory() as memory:
        if side == "raysim":
            measured = raysim_process(raysim_config(data, clients, rounds), scratch, env,
                                      args.timeout,
                                      tree=Path(args.tree) if args.tree else None)
            rate = measured.get("rounds_per_s")
        else:
            cpus = os.cpu_count() or 1
            command = [args.pfl_python, "-m", "torch.distributed.run", "--standalone",
                       "--nnodes=1", f"--nproc_per_node={cpus}", str(HERE / "pfl_workload.py"),
                       "--data", str(peer_data), "--spec",
                       json.dumps({**spec, "rounds": rounds})]
            seconds, out, error = run_process(command, {**env, "OMP_NUM_THREADS": "1"},
                                              args.timeout)
            rate = last_json(out).get("pfl_rounds_per_s")
            measured = {"wall_s": round(seconds, 2), **({"error": error} if error else {})}
    steady = 1 / rate if isinstance(rate, float) and rate > 0 else None
    return {"wall_s": measured["wall_s"],
            "steady_s_per_round": round(steady, 5) if steady else None,
            "startup_s": round(measured["wall_s"] - (rounds - 1) * steady, 2) if steady else None,
            "first_round_s": measured.get("first_round_s"),
            "peak_memory_mb": round(memory.peak_mb, 1),
            **({"error": measured["error"]} if measured.get("error") else {})}


def plot(records_path: Path, out: Path) -> None:
    """Whole-process time (each round count) and peak memory against clients for both sides,
    from the newest commit's records in ``records_path``, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in records_path.read_text().splitlines()
               if line.strip()]
    newest = max((r["date"], r["measured_at"], r["commit"]) for r in records)[2]
    records = [r for r in records if r["commit"] == newest and not r.get("error")]
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(10, 4))
    names = {"raysim": "raysim", "pfl_research": "pfl-research 0.6"}
    for side, colour in (("raysim", "tab:blue"), ("pfl_research", "tab:orange")):
        mine = [r for r in records if r["side"] == side]
        for rounds, style in zip(sorted({r["rounds"] for r in mine}), ("-", "--", ":"),
                                 strict=False):
            points = sorted((r["clients"], r["wall_s"]) for r in mine if r["rounds"] == rounds)
            time_axis.plot(*zip(*points, strict=True), style, marker="o", color=colour,
                           label=f"{names[side]}, {rounds} rounds")
        peaks: dict[int, float] = {}
        for r in mine:
            peaks[r["clients"]] = max(peaks.get(r["clients"], 0.0), r["peak_memory_mb"])
        memory_axis.plot(*zip(*sorted(peaks.items()), strict=True), marker="o", color=colour,
                         label=names[side])
    for axis, label in ((time_axis, "whole process (s)"), (memory_axis,
                                                           "peak memory, process tree (MB)")):
        axis.set_xscale("log")
        axis.set_xlabel("virtual clients (100 per round)")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"MLP, 4 rows per client, 2 CPUs ({newest})", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", type=int,
                        default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--rounds", nargs="+", type=int, default=[20, 200])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pfl-python", default=os.environ.get("PFL_PYTHON"),
                        help="a Python with pfl==0.6.0 and torch (without it: raysim only)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--tree", help="run raysim from this checkout (e.g. the commit before a "
                                       "change; its commit is recorded as raysim_commit)")
    parser.add_argument("--records", help="append the records (JSON lines) to this file")
    parser.add_argument("--plot", nargs=2, metavar=("RECORDS", "PNG"),
                        help="draw time and memory against clients from a records file, and "
                             "measure nothing")
    args = parser.parse_args()
    if args.plot:
        plot(Path(args.plot[0]), Path(args.plot[1]))
        return
    records = Records("client_scale", args.records, {
        "device": cpu_device(), "commit": commit(), "date": date.today().isoformat(),
        "measured_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "load_at_start": round(os.getloadavg()[0], 2), "per_round": PER_ROUND,
        **({"raysim_commit": commit(Path(args.tree))} if args.tree else {})})
    sides = ["raysim", *(["pfl_research"] if args.pfl_python else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for clients in args.clients:
            data, peer_data = scratch / f"scale_{clients}.npz", scratch / f"peer_{clients}.npz"
            write_dataset(data, clients)
            spec = (export_for_peers(raysim_config(data, clients, 1), peer_data)
                    if args.pfl_python else {})
            spec.update(device="cpu", gpus_per_client=0.0)
            for rounds in args.rounds:
                for repeat in range(args.repeats):
                    for side in sides if repeat % 2 == 0 else sides[::-1]:
                        records.add(side=side, clients=clients, rounds=rounds, repeat=repeat,
                                    **measure(side, clients, rounds, data, peer_data, spec,
                                              args, scratch, env))
            data.unlink()
            peer_data.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
