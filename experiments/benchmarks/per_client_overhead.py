"""raysim's per-client work on one worker against the plain PyTorch loop (the target:
<= 5 % overhead per client), on one thread, in one process (no Ray: what a client worker does
between receiving the broadcast and sending its partial), for the workloads of
``workloads.py``: ``convnet32-150x8-pneumonia``, ``mlp32-1000x4-synthetic``,
``mlp1024-1000x4-synthetic`` and ``cnn-1000x50-cifar-shape`` (on a generated file).

On a GPU (``--device cuda``, the default where one is) both sides run there, the clock read
after synchronising; with ``--vectorize never`` raysim takes the per-client loop there (the
path whose ratio to the plain loop we track). Beside ``speed.py``'s figures
for the same shapes through Ray, this splits a gap between raysim's per-client code and what
running in a Ray worker adds.

- ``raysim``: the algorithm's ``local_updates`` through :class:`ClientRuntime` (the path raysim
  chooses for the model: vectorised or per-client loop) for a worker's half of the round's
  clients, ``reduce`` per fixed client group (64 groups over all clients, as the engine) and
  the merge of the groups into the worker's subtrees of the reduction tree;
- ``plain``: the same clients' data as tensors, the global weights copied into one model per
  client, the round's local steps (SGD, the same batch size), and the trained state added to a
  float64 sum in place.

Rounds alternate between the two (this machine's speed drifts); prints one JSON line per
workload with the median ms per client of each, and ``overhead`` = raysim / plain - 1.

    python experiments/benchmarks/per_client_overhead.py [--workloads NAME ...] [--rounds 7]
        [--data-root DIR] [--device cpu|cuda] [--vectorize auto|never|always]
        [--profile TOP]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import workload_dataset
from workloads import raysim_config

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import parse_config
from raysim.data.generated import write_medmnist_npz
from raysim.preparation import initial_weights, prepare, run_context
from raysim.rounds.placement import client_groups
from raysim.rounds.process_memory import keep_freed_memory
from raysim.training.context import ClientData, RunContext
from raysim.training.runtime import ClientRuntime
from raysim.vectors.reduction_tree import subtree_roots
from raysim.vectors.weighted_sum import merge_partials, settle

CPU = torch.device("cpu")


DEFAULT_WORKLOADS = ["convnet32-150x8-pneumonia", "mlp32-1000x4-synthetic",
                     "mlp1024-1000x4-synthetic"]
PFL_SHAPE = "cnn-1000x50-cifar-shape"


def configs(root: str, real: bool, scratch: Path, names: list[str]) -> dict[str, dict]:
    """The raysim config of each named workload (``workloads.py``), without evaluation; the
    pfl shape on a generated file under ``scratch``."""
    return {name: raysim_config(name, workload_dataset(name, root, scratch)[0],
                                rounds=40 if name == PFL_SHAPE else None, evaluate_last=False)
            for name in names}


def synchronise(device: torch.device) -> None:
    """Wait for the device's queued work (a GPU's clock is read after it)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Worker:
    """One worker's round of a config, two ways."""

    def __init__(self, raw: dict[str, Any], vectorize: str = "auto",
                 device: torch.device = CPU):
        config = parse_config(raw)
        dataset, partition = prepare(config, None)[0]
        self.context = run_context(config, dataset, 0, partition.num_clients)
        self.start = initial_weights(config, dataset, 0)
        self.runtime = ClientRuntime(
            RunContext(0, dataset.info, config.model, config.training, partition.num_clients,
                       self.context.clients_per_round),
            ClientData(dataset.train_x, dataset.train_y, partition.train, self.start),
            device, vectorize=vectorize)
        self.algorithm = ALGORITHMS["fedavg"](config.algorithm, self.context)
        per_round = self.context.clients_per_round
        self.clients = list(range(0, per_round, 2))  # one of two workers' share
        self.runtime.keep_rows_on_device(self.clients)  # the worker's clients' rows resident, as the engine
        group_of = np.zeros(partition.num_clients, dtype=np.int64)
        for index, members in enumerate(client_groups(partition.num_clients, 64)):
            group_of[members] = index
        self.group_of = group_of
        self.training = config.training
        self.data = [self.runtime.client_data(c) for c in self.clients]
        self.model = self.runtime.model
        self.global_state = {k: v.clone() for k, v in self.model.state_dict().items()}

    def raysim(self, round_: int) -> None:
        message = self.algorithm.broadcast(self.start, round_)
        results = self.algorithm.local_updates(self.runtime, self.clients, round_, message,
                                               [None] * len(self.clients))
        groups = sorted(set(self.group_of[self.clients].tolist()))
        partials = {group: self.algorithm.reduce(
            [(c, r) for c, r in zip(self.clients, results, strict=True)
             if self.group_of[c] == group]) for group in groups}
        # the worker's subtrees of the reduction tree, computed (as the engine's worker does)
        settle(subtree_roots(partials, groups[0], groups[-1] + 1, merge_partials))

    def plain(self, round_: int) -> None:
        state = dict(self.model.state_dict())
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        loss_fn = torch.nn.CrossEntropyLoss()
        batch = self.training.batch_size
        steps = self.training.local_steps or -(-len(self.data[0][1]) // batch)
        for x, y in self.data:
            with torch.no_grad():
                for k, v in state.items():
                    v.copy_(self.global_state[k])
            optimizer = torch.optim.SGD(self.model.parameters(),
                                        lr=self.training.optimizer.lr)
            self.model.train()
            for step in range(steps):
                start = (step * batch) % len(y)
                optimizer.zero_grad(set_to_none=True)
                loss_fn(self.model(x[start:start + batch]), y[start:start + batch]).backward()
                optimizer.step()
            for k, v in state.items():
                total[k].add_(v)


def measure(name: str, raw: dict[str, Any], rounds: int, vectorize: str = "auto",
            device: torch.device = CPU, profile: int = 0) -> dict[str, Any]:
    """Median ms per client of raysim's worker round and the plain loop, alternating
    (``vectorize``: the runtime's path setting, auto/always/never). ``profile`` > 0: then one
    more round of each side under cProfile and one under torch's profiler, printed as
    :func:`profile_round` lines."""
    worker = Worker(raw, vectorize, device)
    timings: dict[str, list[float]] = {"raysim": [], "plain": []}
    for round_ in range(rounds + 1):
        for label in ("raysim", "plain"):
            synchronise(device)
            started = time.perf_counter()
            getattr(worker, label)(round_)
            synchronise(device)
            if round_:  # the first round warms up
                timings[label].append((time.perf_counter() - started) * 1000
                                      / len(worker.clients))
    raysim, plain = (float(np.median(timings[k])) for k in ("raysim", "plain"))
    for label in ("raysim", "plain") if profile else ():
        print(json.dumps({"workload": name, "side": label,
                          **profile_round(worker, label, rounds + 1, device, profile)}),
              flush=True)
    return {"workload": name, "device": str(device), "path": worker.runtime.path,
            "clients": len(worker.clients),
            "raysim_ms_per_client": round(raysim, 3), "plain_ms_per_client": round(plain, 3),
            "overhead": round(raysim / plain - 1, 3)}


def profile_round(worker: Worker, label: str, round_: int, device: torch.device, top: int
                  ) -> dict[str, Any]:
    """Where one round of a side goes, per client: the ``top`` functions by their own time
    under cProfile (calls and ms per client), and the operations torch ran: kernels launched
    on a GPU (what a launch-bound loop pays for), top-level aten operations on a CPU."""
    clients = len(worker.clients)
    work = getattr(worker, label)
    profiler = cProfile.Profile()
    profiler.enable()
    work(round_)
    synchronise(device)
    profiler.disable()
    table = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(((own, calls, f"{Path(file).name}:{line}({function})")
                   for (file, line, function), (_, calls, own, _, _) in table.items()),
                  reverse=True)[:top]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as traced:
        work(round_ + 1)
        synchronise(device)
    events = traced.events()
    if device.type == "cuda":
        operations = sum(1 for e in events if e.device_type == DeviceType.CUDA)
    else:
        operations = sum(1 for e in events if e.name.startswith("aten::") and (
            e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    return {"operations_per_client": round(operations / clients, 2),
            "operations": "kernels" if device.type == "cuda" else "aten",
            "own_time_ms_per_client": [[name, round(calls / clients, 2),
                                        round(own * 1000 / clients, 4)]
                                       for own, calls, name in rows]}


@contextlib.contextmanager
def benchmark_data(requested: str, file: str, write: Callable[[Path], Any], threads: int
                   ) -> Iterator[tuple[str, bool]]:
    """(data root, real): ``requested`` where it holds ``file``, else a scratch directory
    where ``write`` generated a file of the same layout; the process set up as a client worker
    (``threads`` torch threads, freed memory kept)."""
    torch.set_num_threads(threads)
    keep_freed_memory()
    real = (Path(requested) / file).exists()
    with tempfile.TemporaryDirectory() as scratch:
        if not real:
            write(Path(scratch))
        yield (requested if real else scratch), real


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=DEFAULT_WORKLOADS)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vectorize", choices=["auto", "never", "always"], default="auto")
    parser.add_argument("--profile", type=int, default=0, metavar="TOP",
                        help="also print where a round of each side goes: the TOP functions "
                        "by own time (cProfile) and the kernels (GPU) or aten operations "
                        "(CPU) per client")
    args = parser.parse_args()
    device = torch.device(args.device)
    with benchmark_data(args.data_root, "pneumoniamnist.npz",
                        lambda d: write_medmnist_npz(d, n_train=1200, n_test=50), 1
                        ) as (root, real), tempfile.TemporaryDirectory() as scratch:
        chosen = configs(root, real, Path(scratch), args.workloads)
        for name in args.workloads:
            measured = measure(name, chosen[name], args.rounds, args.vectorize, device,
                               args.profile)
            uses_file = chosen[name]["dataset"]["name"] == "pneumoniamnist"
            print(json.dumps({**measured, "real_data": real and uses_file}), flush=True)


if __name__ == "__main__":
    main()
