"""Why W2's clients train one by one on a CPU: 75 clients x 8 PneumoniaMNIST-shaped images,
one SGD step of a ConvNet (width 32, depth 3, instance norm) each, from the same global
weights (FedAvg's first local step), on one thread, three ways:

- ``loop``: the plain PyTorch loop raysim's per-client path runs (forward, backward, step);
- ``one_batch``: forward and backward of all 600 images as one batch (a lower bound for any
  batching that shares the weights: it does not even separate the clients' gradients);
- ``vmap``: ``torch.func.vmap(grad(loss))`` over the clients with the weights shared, which
  gives each client's gradient from one call.

Prints one JSON line with the milliseconds per 75 clients (best of ``--repeats``):

    python experiments/benchmarks/small_client_batching.py [--clients 75] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from raysim.data.dataset import DataInfo
from raysim.models import MODELS, build_model

INFO = DataInfo("pneumoniamnist", "image", 2, (1, 28, 28))


def best_ms(work: Callable[[], object], repeats: int) -> float:
    """The fastest of ``repeats`` timings of ``work()`` after one untimed call, in ms."""
    work()
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        timings.append(time.perf_counter() - start)
    return round(min(timings) * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=75)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(MODELS["convnet"].params(width=32, depth=3), INFO)
    x = torch.randn(args.clients, args.samples, 1, 28, 28)
    y = torch.randint(0, 2, (args.clients, args.samples))
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop() -> None:
        for k in range(args.clients):
            optimizer.zero_grad()
            loss_fn(model(x[k]), y[k]).backward()
            optimizer.step()

    def one_batch() -> None:
        optimizer.zero_grad()
        loss_fn(model(x.flatten(0, 1)), y.flatten()).backward()

    shared = {name: p.detach() for name, p in model.named_parameters()}
    per_client = vmap(grad(lambda params, xb, yb: loss_fn(functional_call(model, params, (xb,)),
                                                          yb)), in_dims=(None, 0, 0))
    print(json.dumps({"clients": args.clients, "samples": args.samples,
                      "loop_ms": best_ms(loop, args.repeats),
                      "one_batch_ms": best_ms(one_batch, args.repeats),
                      "vmap_ms": best_ms(lambda: per_client(shared, x, y), args.repeats)}))


if __name__ == "__main__":
    main()
