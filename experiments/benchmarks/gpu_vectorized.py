"""Vectorised clients against the per-client loop and a plain PyTorch loop, on a GPU.

Workloads (FedAvg, no evaluation, rounds per second from the first to the last round's end,
start-up reported separately):

(i)  ``convnet32-150x8-pneumonia``: 150 clients x 8 PneumoniaMNIST images (28 px), ConvNet
     width 32 depth 3 (GroupNorm), one local SGD step per round on the client's 8 images, lr
     0.01, all clients every round. The real file from --data-root when present, else a
     generated file of that layout.
(ii) ``cnn-1000x50-cifar-shape``: the pfl-research CIFAR-10 benchmark's shape on 28x28x3
     inputs: 1,000 clients x 50 samples (a generated 50,000-image file in the MedMNIST
     layout; throughput does not depend on the pixels), 50 clients per round, the 2-conv CNN
     32/64 + dense 128 (``model: cnn``), batch 10, SGD lr 0.1, one local epoch (5 steps).

(iii) ``feddc-resnet18-150x8-pneumonia224``: the FedDC paper slice
     (``experiments/feddc/pneumonia_paper.yaml``, variant feddc): 150 clients x 8
     PneumoniaMNIST images at 224 px, ResNet-18 with BatchNorm, one
     local SGD step of batch 8 (lr 0.1), daisy-chaining every round and averaging every 10,
     every client every round. BatchNorm keeps it on the per-client path by default, so
     raysim runs ``vectorize: never`` (one worker on the GPU, four at 0.25) and ``always``
     (the batched path, each client with its own running statistics); the plain loop keeps every
     client's model as a state dict on the device and loads it per client; the reference keeps
     every client's parameters and buffers as rows of two matrices on the device, trains each
     client on views of its rows (``torch.func.functional_call``, no copy), daisy-chains by
     gathering the rows and averages by their mean. Without a GPU its defaults shrink to 20
     clients at 28 px (``--feddc-clients``, ``--feddc-size``).

For each workload, in one invocation: raysim with one worker on the whole GPU and the
per-client loop (``engine.vectorize: never``), the same worker on the vectorised path
(``always``), four workers at ``gpus_per_worker: 0.25`` on the vectorised path, and a plain
PyTorch loop in this process on the same device (one model, weights loaded per client, one
fresh SGD per client, sample-weighted averaging) and the on-device reference, the best
in-process shape of the same round (one process, every sampled client's weights on the
device, all clients of a round in one ``torch.func`` vmap call per step, the new global the
mean of the stacked rows; weights never leave the device), and (except for FedDC) the
plain loop again inside a Ray worker process with the resources of the one-worker
configurations, which separates what the Ray worker costs from raysim's own code. Prints one JSON line per
configuration with rounds/s, ``over_plain`` and ``over_limit`` (the ratio to the reference),
and for raysim's the seconds between consecutive rounds (``round_seconds``) and the median
time per round of the workers' local updates (``local_update_ms_median``, the clients'
``train_seconds`` summed: the rest of a round is hand-offs, reductions and the driver).
Without a GPU every configuration runs on the CPU (``gpus_per_worker`` ignored; use fewer
``--rounds``), so the ratios are measured on every machine.

    python experiments/benchmarks/gpu_vectorized.py [--workload NAME ...] [--rounds 100]
        [--data-root DIR] [--model '{"name": "mlp", "hidden": [8]}']

``--model`` replaces every workload's model: with a model this small the training is cheap
and a round shows what raysim costs around it (the same round shapes, clients and batches).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import measure_raysim, medmnist_source
from workloads import WORKLOADS as ALL_WORKLOADS

from raysim.data import load_dataset, to_tensor
from raysim.data.generated import write_medmnist_npz
from raysim.errors import ConfigError
from raysim.models import build_model
from raysim.schema import DatasetConfig

WORKLOADS = {name: {"flag": spec.data, "clients": spec.clients, "samples": spec.samples,
                    "per_round": spec.per_round, "model": spec.model, "batch": spec.batch,
                    "lr": spec.lr, "steps": spec.steps, "size": spec.size,
                    "algorithm": spec.algorithm}
             for name, spec in ALL_WORKLOADS.items()
             if name in ("convnet32-150x8-pneumonia", "cnn-1000x50-cifar-shape",
                         "feddc-resnet18-150x8-pneumonia224")}
"""This script's workloads (``workloads.py``), as the fields its configs and loops read."""
PFL_SHAPE = "cnn-1000x50-cifar-shape"
FEDDC_SLICE = "feddc-resnet18-150x8-pneumonia224"
BATCHNORM_ENGINES = {  # BatchNorm: the per-client path, and the batched one on request
    "raysim_loop_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "never"},
    "raysim_loop_4x0.25gpu": {"num_workers": 4, "gpus_per_worker": 0.25, "vectorize": "never"},
    "raysim_vectorized_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "always"},
    "raysim_vectorized_4x0.25gpu": {"num_workers": 4, "gpus_per_worker": 0.25,
                                    "vectorize": "always"},
}
ENGINES = {
    "raysim_loop_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "never"},
    "raysim_vectorized_1gpu": {"num_workers": 1, "gpus_per_worker": 1.0, "vectorize": "always"},
    "raysim_vectorized_4x0.25gpu": {"num_workers": 4, "gpus_per_worker": 0.25,
                                    "vectorize": "always"},
}


def pfl_dataset(root: Path) -> dict:
    """The pfl shape's generated file (CIFAR-10-shaped: 28x28x3 images in PathMNIST's layout)
    written under ``root``; returns the config's dataset section for it."""
    spec = WORKLOADS[PFL_SHAPE]
    write_medmnist_npz(root, "pathmnist", n_train=spec["clients"] * spec["samples"],
                       n_test=200, channels=3, num_classes=9)
    return {"name": "pathmnist", "root": str(root), "download": False, "verify_checksum": False}


def config(spec: dict, dataset: dict, rounds: int, engine: dict) -> dict:
    """The workload as a raysim config on ``engine`` (1 CPU per worker unless it says)."""
    training = {"rounds": rounds, "batch_size": spec["batch"],
                "clients_per_round": spec["per_round"],
                "optimizer": {"name": "sgd", "lr": spec["lr"]}}
    training.update({"local_steps": spec["steps"]} if spec["steps"] else {"local_epochs": 1})
    return {"name": "gpu-bench", "dataset": dataset,
            "partition": {"scheme": "iid", "num_clients": spec["clients"],
                          "samples_per_client": spec["samples"]},
            "model": spec["model"], "algorithm": spec.get("algorithm", {"name": "fedavg"}),
            "training": training,
            "evaluation": {"every": 0}, "seeds": [0],
            "engine": {"cpus_per_worker": 1, "flush_seconds": 5.0, **engine}}


def rounds_per_second(one_round: Callable[[], None], rounds: int,
                      device: torch.device) -> float:
    """Rounds per second of ``one_round`` after one warm-up round (kernels, allocator)."""
    one_round()
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(rounds):
        one_round()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return rounds / (time.perf_counter() - started)


def _client_data(spec: dict, dataset: dict, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.nn.Module]:
    """Every client's samples as (clients, samples, ...) tensors on ``device`` and the
    workload's model there."""
    from raysim.models import MODELS

    data = load_dataset(DatasetConfig(**dataset))
    order = np.random.default_rng(0).permutation(len(data.train_y))[
        : spec["clients"] * spec["samples"]]
    x = to_tensor(data.train_x[order], data.info).to(device)
    x = x.reshape(spec["clients"], spec["samples"], *x.shape[1:])
    y = torch.from_numpy(data.train_y[order]).to(device).reshape(spec["clients"], -1)
    model = build_model(MODELS[spec["model"]["name"]].params(**spec["model"]), data.info)
    return x, y, model.to(device)


def plain_loop(spec: dict, dataset: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of a plain single-process FedAvg loop on ``device``."""
    x, y, model = _client_data(spec, dataset, device)
    rng = np.random.default_rng(0)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    loss_fn = torch.nn.CrossEntropyLoss()
    per_round = spec["per_round"] or spec["clients"]
    steps = spec["steps"] or spec["samples"] // spec["batch"]

    def one_round() -> None:
        total = {k: torch.zeros_like(v) for k, v in global_state.items()}
        for client in rng.choice(spec["clients"], per_round, replace=False):
            model.load_state_dict(global_state)
            optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"])
            perm = torch.randperm(spec["samples"], device=device)
            for step in range(steps):
                batch = perm[step * spec["batch"]:(step + 1) * spec["batch"]]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x[client, batch]), y[client, batch]).backward()
                optimizer.step()
            for k, v in model.state_dict().items():
                total[k] += v
        for k in global_state:
            global_state[k] = total[k] / per_round

    return rounds_per_second(one_round, rounds, device)


def plain_loop_in_ray_worker(spec: dict, dataset: dict, rounds: int, device: torch.device,
                             cpus: int) -> float:
    """:func:`plain_loop` run inside a Ray worker process with the resources of raysim's
    one-worker configurations (``cpus`` CPUs and, on a GPU, the whole GPU), on a Ray of its
    own: beside the plain loop in this process, what running in a Ray worker (its threads,
    ``OMP_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES``) alone costs the same loop. Run in a child
    process, so that its Ray is never the one raysim's runs of an earlier workload left up."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as child:
        return child.submit(_plain_loop_on_own_ray, spec, dataset, rounds, device.type,
                            cpus).result()


def _plain_loop_on_own_ray(spec: dict, dataset: dict, rounds: int, device_type: str,
                           cpus: int) -> float:
    """(In the child process.) The Ray's workers import this script's module by name."""
    import gpu_vectorized
    import ray
    folder = Path(__file__).resolve().parent
    here = [str(folder)]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        here + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    gpus = 1 if device_type == "cuda" else 0
    ray.init(address="local", num_cpus=max(cpus, 1), num_gpus=gpus, include_dashboard=False,
             log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=cpus, num_gpus=gpus)(gpu_vectorized._plain_loop_with_threads)
        return float(ray.get(remote.remote(spec, dataset, rounds, device_type, cpus)))
    finally:
        ray.shutdown()


def _plain_loop_with_threads(spec: dict, dataset: dict, rounds: int, device_type: str,
                             threads: int) -> float:
    """:func:`plain_loop` with ``threads`` torch threads, as a raysim worker sets them."""
    torch.set_num_threads(threads)
    return plain_loop(spec, dataset, rounds, torch.device(device_type))


def feddc_plain_loop(spec: dict, dataset: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of a plain FedDC loop: every client's model a state dict on the
    device, loaded into one model per client, one SGD step, stored back; the models
    permuted every ``daisy_period`` rounds and averaged every ``aggregation_period``."""
    x, y, model = _client_data(spec, dataset, device)
    algorithm, clients = spec["algorithm"], spec["clients"]
    states = [{k: v.clone() for k, v in model.state_dict().items()} for _ in range(clients)]
    generator = torch.Generator(device="cpu").manual_seed(0)
    loss_fn = torch.nn.CrossEntropyLoss()
    done = [0]

    def one_round() -> None:
        for client in range(clients):
            model.load_state_dict(states[client])
            model.train()
            optimizer = torch.optim.SGD(model.parameters(), lr=spec["lr"])
            batch = torch.randperm(spec["samples"], generator=generator)[:spec["batch"]]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[client, batch]), y[client, batch]).backward()
            optimizer.step()
            states[client] = {k: v.clone() for k, v in model.state_dict().items()}
        done[0] += 1
        if done[0] % algorithm["aggregation_period"] == 0:
            mean = {k: torch.stack([s[k].double() for s in states]).mean(0).to(v.dtype)
                    for k, v in states[0].items()}
            states[:] = [{k: v.clone() for k, v in mean.items()} for _ in range(clients)]
        elif done[0] % algorithm["daisy_period"] == 0:
            order = torch.randperm(clients, generator=generator).tolist()
            states[:] = [states[i] for i in order]

    return rounds_per_second(one_round, rounds, device)


def feddc_reference(spec: dict, dataset: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the in-process on-device FedDC reference (see the module
    docstring): parameters and float buffers as rows of two matrices on the device, each
    client trained on views of its rows, daisy-chaining by a row gather, averaging by a row
    mean."""
    from torch.func import functional_call

    x, y, model = _client_data(spec, dataset, device)
    algorithm, clients = spec["algorithm"], spec["clients"]
    names = [k for k, _ in model.named_parameters()]
    shapes = [p.shape for _, p in model.named_parameters()]
    float_buffers = [(k, b.shape) for k, b in model.named_buffers() if b.is_floating_point()]
    other_buffers = {k: b for k, b in model.named_buffers() if not b.is_floating_point()}
    theta = torch.cat([p.detach().reshape(-1) for _, p in model.named_parameters()])
    theta = theta.unsqueeze(0).repeat(clients, 1).contiguous()
    state = torch.cat([model.get_buffer(k).reshape(-1) for k, _ in float_buffers])
    state = state.unsqueeze(0).repeat(clients, 1).contiguous()
    generator = torch.Generator(device="cpu").manual_seed(0)
    done = [0]

    def views(row: torch.Tensor, layout: list[tuple[str, torch.Size]]) -> dict[str, torch.Tensor]:
        out, start = {}, 0
        for name, shape in layout:
            size = int(np.prod(shape))
            out[name] = row[start:start + size].view(shape)
            start += size
        return out

    model.train()

    def one_round() -> None:
        nonlocal theta, state
        for client in range(clients):
            params = {k: v.requires_grad_() for k, v in views(
                theta[client].detach(), list(zip(names, shapes, strict=True))).items()}
            buffers = {**views(state[client], float_buffers), **other_buffers}
            batch = torch.randperm(spec["samples"], generator=generator)[:spec["batch"]]
            loss = torch.nn.functional.cross_entropy(
                functional_call(model, (params, buffers), (x[client, batch],)), y[client, batch])
            grads = torch.autograd.grad(loss, list(params.values()))
            with torch.no_grad():
                theta[client].sub_(spec["lr"] * torch.cat([g.reshape(-1) for g in grads]))
        done[0] += 1
        if done[0] % algorithm["aggregation_period"] == 0:
            theta[:] = theta.double().mean(0).to(theta.dtype)
            state[:] = state.double().mean(0).to(state.dtype)
        elif done[0] % algorithm["daisy_period"] == 0:
            order = torch.randperm(clients, generator=generator).to(device)
            theta, state = theta[order], state[order]

    return rounds_per_second(one_round, rounds, device)


def on_device_reference(spec: dict, dataset: dict, rounds: int, device: torch.device) -> float:
    """Rounds per second of the in-process on-device reference (see the module docstring)."""
    from torch.func import functional_call, grad, vmap

    x, y, model = _client_data(spec, dataset, device)
    global_params = {k: v.detach().clone() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    per_round = spec["per_round"] or spec["clients"]
    steps = spec["steps"] or spec["samples"] // spec["batch"]
    generator = torch.Generator(device=device).manual_seed(0)

    def client_loss(params: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(functional_call(model, (params, buffers),
                                                                 (xb,)), yb)

    step = vmap(grad(client_loss), in_dims=(0, 0, 0))

    def one_round() -> None:
        sampled = torch.randperm(spec["clients"], device=device, generator=generator)[:per_round]
        params = {k: v.unsqueeze(0).repeat(per_round, *[1] * v.ndim)
                  for k, v in global_params.items()}
        orders = torch.argsort(torch.rand(per_round, spec["samples"], device=device,
                                          generator=generator), dim=1)
        rows = sampled[:, None]
        for k in range(steps):
            batch = orders[:, k * spec["batch"]:(k + 1) * spec["batch"]]
            grads = step(params, x[rows, batch], y[rows, batch])
            with torch.no_grad():
                for name in params:
                    params[name].sub_(spec["lr"] * grads[name])
        for name in global_params:
            global_params[name] = params[name].mean(0)

    return rounds_per_second(one_round, rounds, device)


EXTRA: dict = {}
"""Fields every printed line carries (the model section, where ``--model`` replaced it)."""


def emit(record: dict) -> None:
    """Print one result line as JSON, with :data:`EXTRA`."""
    print(json.dumps({**record, **EXTRA}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--engines", nargs="+", choices=list(ENGINES), default=list(ENGINES))
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--no-plain-in-ray", dest="plain_in_ray", action="store_false",
                        help="skip the plain loop run inside a Ray worker process")
    parser.add_argument("--data-root", default=str(Path("~/.medmnist").expanduser()))
    parser.add_argument("--feddc-clients", type=int, default=None,
                        help="FedDC slice clients (default 150 on a GPU, 20 on a CPU)")
    parser.add_argument("--feddc-size", type=int, default=None,
                        help="FedDC slice image size (default 224 on a GPU, 28 on a CPU)")
    parser.add_argument("--model", type=json.loads, default=None, metavar="JSON",
                        help="replace every workload's model section, e.g. "
                        "'{\"name\": \"mlp\", \"hidden\": [8]}': with a model this small the "
                        "rounds measure what raysim costs around the training")
    args = parser.parse_args()
    if args.model is not None:
        for spec in WORKLOADS.values():
            spec["model"] = args.model
        EXTRA["model"] = args.model
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    WORKLOADS[FEDDC_SLICE].update(
        clients=args.feddc_clients or (150 if device.type == "cuda" else 20),
        size=args.feddc_size or (224 if device.type == "cuda" else 28))
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for workload in args.workload:
            spec = WORKLOADS[workload]
            if workload == PFL_SHAPE:
                dataset, real = pfl_dataset(scratch / "pfl"), False
            elif spec.get("size", 28) != 28:  # (no real file at this size here)
                root = scratch / workload
                write_medmnist_npz(root, spec["flag"], n_train=spec["clients"] * spec["samples"],
                                   n_test=50, size=spec["size"])
                dataset = {"name": spec["flag"], "size": spec["size"], "root": str(root),
                           "download": False, "verify_checksum": False}
                real = False
            else:
                dataset, _, real = medmnist_source(args.data_root, spec["flag"], scratch,
                                                   n_train=2000, n_test=200)
            feddc = workload == FEDDC_SLICE
            plain = (feddc_plain_loop if feddc else plain_loop)(spec, dataset, args.rounds,
                                                                device)
            emit({"workload": workload, "device": name, "real_data": real,
                  "configuration": "plain_pytorch_loop",
                  "rounds_per_s": round(plain, 3)})
            limit = (feddc_reference if feddc else on_device_reference)(spec, dataset,
                                                                         args.rounds, device)
            emit({"workload": workload, "device": name,
                  "configuration": "on_device_vmap_reference",
                  "rounds_per_s": round(limit, 3),
                  "over_plain": round(limit / plain, 3)})
            if not feddc and args.plain_in_ray:
                cpus = 1 if device.type == "cuda" else (os.cpu_count() or 1)
                in_ray = plain_loop_in_ray_worker(spec, dataset, args.rounds, device, cpus)
                emit({"workload": workload, "device": name,
                      "configuration": "plain_pytorch_loop_in_ray_worker",
                      "rounds_per_s": round(in_ray, 3),
                      "over_plain": round(in_ray / plain, 3)})
            engines = BATCHNORM_ENGINES if feddc else {k: ENGINES[k] for k in args.engines}
            for label, engine in engines.items():
                if device.type == "cpu":  # the workers share the machine's cores, as the
                    engine = {**engine, "cpus_per_worker": max(  # plain loop's threads do
                        1, (os.cpu_count() or 1) // engine["num_workers"])}
                try:
                    measured = measure_raysim(config(spec, dataset, args.rounds, engine),
                                              scratch / label, intervals=True)
                except (RuntimeError, ConfigError) as error:  # (4 workers on a 2-CPU machine)
                    emit({"workload": workload, "configuration": label,
                          "error": str(error)})
                    continue
                rate = measured["raysim_rounds_per_s"]
                emit({"workload": workload, "device": name, "configuration": label,
                      "rounds_per_s": round(rate, 3),
                      "seconds_per_round": round(1 / rate, 3),
                      "startup_s": round(measured["raysim_startup_s"], 1),
                      "over_plain": round(rate / plain, 3),
                      "over_limit": round(rate / limit, 3),
                      "local_update_ms_median": round(
                          1000 * measured["raysim_local_update_s"], 2),
                      "round_seconds": measured["raysim_round_seconds"]})


if __name__ == "__main__":
    main()
