"""MH-pFLID rounds per second: raysim against a plain PyTorch loop.

Workload: 8 clients with 8 architectures (resnet17, shufflenetv2, resnext, squeezenet, senet,
mobilenetv2, densenet, vgg), 60 BreastMNIST-sized 28 px images each (iid), MH-pFLID's default
round: 4 injection + 2 distillation epochs at batch 8 with the Appendix-E messenger (its input
resized to 112 px) and the spatial-token receiver/transmitter, the default learning rates, then
messenger averaging. Uses the real BreastMNIST from --data-root when
present, else a generated file of that layout.

raysim places the clients on its workers by FLOPs x samples (`raysim costs`). The plain loop
runs in one process (all threads): per client it keeps the local model, receiver,
transmitter and both Adam optimizers, takes the same steps with the same losses on the same
modules (raysim's model classes) and averages the messengers after each round. raysim runs with
2 workers x 1 CPU and no evaluation; its rate is measured from the first to the last round's
completion (start-up excluded and reported separately), with its default
``engine.memory_format: auto`` (channels-last convolutions on CPUs). The plain loop is measured
twice: with PyTorch's default (contiguous) layout, as a plain loop is written, and with its
models converted to channels-last, which isolates what raysim's two workers add beyond the
layout (``raysim_over_plain_channels_last``).

    python experiments/benchmarks/mhpflid_throughput.py [--rounds 4] [--data-root DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from harness import measure_raysim, medmnist_source, print_ratio

from raysim.algorithms.mhpflid import MHpFLIDParams
from raysim.config import parse_config
from raysim.data import load_dataset, to_tensor
from raysim.models import MODELS, build_model
from raysim.models.messenger import InformationExchange, Messenger

ARCHITECTURES = ["resnet17", "shufflenetv2", "resnext", "squeezenet", "senet", "mobilenetv2",
                 "densenet", "vgg"]
PER_CLIENT = 60


def config(dataset: dict, rounds: int) -> dict:
    return {
        "name": "mhpflid-bench", "dataset": dataset,
        "partition": {"scheme": "iid", "num_clients": 8, "samples_per_client": PER_CLIENT},
        "model": {"name": "resnet17"},
        "clients": {"architectures": ARCHITECTURES},
        "algorithm": {"name": "mhpflid"},
        "training": {"rounds": rounds, "batch_size": 8},
        "evaluation": {"every": 0},
        "engine": {"num_workers": 2, "cpus_per_worker": 1, "flush_seconds": 5.0},
    }


def measure_plain(raw: dict, data_root: str, rounds: int, channels_last: bool = False) -> float:
    parsed = parse_config(raw)
    dataset = load_dataset(parsed.dataset, data_root)
    info = dataset.info
    rng = np.random.default_rng(0)
    chosen = rng.permutation(len(dataset.train_y))[: 8 * PER_CLIENT].reshape(8, PER_CLIENT)
    xs = [to_tensor(dataset.train_x[c], info) for c in chosen]
    ys = [torch.from_numpy(dataset.train_y[c]) for c in chosen]
    torch.manual_seed(0)
    locals_ = [build_model(MODELS[a].params(), info) for a in ARCHITECTURES]
    p = MHpFLIDParams()
    global_messenger = Messenger(info.input_shape[0], info.num_classes,
                                 input_size=p.messenger_input_size)
    messengers = [Messenger(info.input_shape[0], info.num_classes,
                            input_size=p.messenger_input_size) for _ in ARCHITECTURES]
    receivers = [InformationExchange(m.feature_channels, 512, query_from="messenger",
                                     mode="attention") for m in locals_]
    transmitters = [InformationExchange(m.feature_channels, 512, query_from="local",
                                        mode="attention") for m in locals_]
    injection = [torch.optim.Adam([*m.parameters(), *r.parameters()], lr=p.injection_lr)
                 for m, r in zip(locals_, receivers, strict=True)]
    if channels_last:
        for module in [*locals_, *messengers]:
            module.to(memory_format=torch.channels_last)
    distillation = [torch.optim.Adam([*m.parameters(), *t.parameters()], lr=p.distillation_lr)
                    for m, t in zip(messengers, transmitters, strict=True)]
    started = None
    for t in range(rounds + 1):
        if t == 1:
            started = time.perf_counter()  # round 0 is warm-up
        for i in range(8):
            local, messenger = locals_[i], messengers[i]
            messenger.load_state_dict(global_messenger.state_dict())
            for stage, epochs in (("inject", p.injection_epochs),
                                  ("distill", p.distillation_epochs)):
                messenger.requires_grad_(stage == "distill")  # the frozen side takes no grads
                local.requires_grad_(stage == "inject")
                local.train(stage == "inject")
                messenger.train(stage == "distill")
                for _ in range(epochs):
                    for batch in torch.randperm(PER_CLIENT).split(8):
                        x, y = xs[i][batch], ys[i][batch]
                        if stage == "inject":
                            features = local.body(x)
                            with torch.no_grad():
                                mes = messenger.feature_map(x)
                            loss = 0.9 * F.cross_entropy(local.head(features), y) + 0.1 * (
                                F.cross_entropy(messenger.head(receivers[i](features, mes)), y))
                            optimizer = injection[i]
                        else:
                            with torch.no_grad():
                                features = local.body(x)
                                target = F.log_softmax(local.head(features), 1)
                            logits = messenger.head(transmitters[i](features,
                                                                     messenger.feature_map(x)))
                            loss = 0.9 * F.cross_entropy(logits, y) + 0.1 * F.kl_div(
                                F.log_softmax(logits, 1), target, reduction="batchmean",
                                log_target=True)
                            optimizer = distillation[i]
                        optimizer.zero_grad()
                        loss.backward()
                        optimizer.step()
        with torch.no_grad():
            states = [m.state_dict() for m in messengers]
            global_messenger.load_state_dict(
                {k: torch.stack([s[k].double() for s in states]).mean(0).to(states[0][k].dtype)
                 for k in states[0]})
    return rounds / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=str(Path(__file__).resolve().parents[3] /
                                                   "shared" / "data" / "medmnist"))
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dataset, data_root, real = medmnist_source(args.data_root, "breastmnist", Path(tmp),
                                                   n_train=546, n_test=64)
        raw = config(dataset, args.rounds)
        result = {"workload": "mhpflid-8-architectures", "rounds": args.rounds,
                  "real_data": real}
        result.update(measure_raysim(raw, Path(tmp) / "out"))
        result["plain_rounds_per_s"] = measure_plain(raw, data_root, min(args.rounds, 3))
        result["plain_channels_last_rounds_per_s"] = measure_plain(
            raw, data_root, min(args.rounds, 3), channels_last=True)
        result["raysim_over_plain_channels_last"] = (
            result["raysim_rounds_per_s"] / result["plain_channels_last_rounds_per_s"])
        print_ratio(result)


if __name__ == "__main__":
    main()
