"""Channels-last vs contiguous convolutions on this CPU, per model (``engine.memory_format``).

For each model: one training step (forward, cross-entropy, backward) on a batch of 28 px
images with one thread, in the contiguous layout and channels-last, interleaved, best of
``--repeats`` timings of ``--steps`` steps each. Prints one JSON line per model with both
times and contiguous / channels-last (> 1: channels-last is faster), and whether
``engine.memory_format: auto`` picks channels-last for it.

    python experiments/benchmarks/memory_format.py [--batch 8] [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

from raysim.data.dataset import DataInfo
from raysim.models import MODELS, build_model
from raysim.models.messenger import Messenger
from raysim.training.memory_format import uses_channels_last

INFO = DataInfo("breastmnist", "image", 2, (1, 28, 28))
MH_PFLID_ARCHITECTURES = ["resnet17", "shufflenetv2", "resnext", "squeezenet", "senet",
                          "mobilenetv2", "densenet", "vgg"]


class _MessengerAt112(nn.Module):
    """MH-pFLID's messenger as a classifier (its body at 112 px, then its head)."""

    def __init__(self) -> None:
        super().__init__()
        self.messenger = Messenger(1, 2, input_size=112)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.messenger.head(self.messenger.feature_map(x).mean((2, 3)))


def models() -> dict[str, nn.Module]:
    """The measured models, by name."""
    chosen: dict[str, nn.Module] = {}
    for name in MH_PFLID_ARCHITECTURES:
        chosen[name] = build_model(MODELS[name].params(), INFO)
    chosen["messenger@112px"] = _MessengerAt112()
    for norm in ("none", "batch", "instance"):
        chosen[f"convnet-w128-{norm}"] = build_model(MODELS["convnet"].params(norm=norm), INFO)
    return chosen


def step_seconds(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> float:
    """Mean seconds of one forward + backward step."""
    F.cross_entropy(model(x), y).backward()  # warm-up
    started = time.perf_counter()
    for _ in range(steps):
        F.cross_entropy(model(x), y).backward()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 2, (args.batch,))
    for name, model in models().items():
        best = {"contiguous": float("inf"), "channels_last": float("inf")}
        for _ in range(args.repeats):
            for layout, memory_format in (("contiguous", torch.contiguous_format),
                                          ("channels_last", torch.channels_last)):
                model.to(memory_format=memory_format)  # type: ignore[call-overload]
                best[layout] = min(best[layout], step_seconds(model, x, y, args.steps))
        print(json.dumps({"model": name, "batch": args.batch,
                          "contiguous_ms": round(best["contiguous"] * 1000, 1),
                          "channels_last_ms": round(best["channels_last"] * 1000, 1),
                          "contiguous_over_channels_last":
                              round(best["contiguous"] / best["channels_last"], 2),
                          "auto_picks_channels_last":
                              uses_channels_last(model, torch.device("cpu"), "auto")}), flush=True)


if __name__ == "__main__":
    main()
