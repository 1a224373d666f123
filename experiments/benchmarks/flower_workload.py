"""The Flower side of ``vs_flower.py``: one workload as a Flower 1.41 simulation (Message API,
``FedAvg`` strategy, ``run_simulation`` on Ray), in plain PyTorch with the same model, data,
partition, batch size, optimizer, clients per round and rounds as the raysim run.

It runs under a Python that has ``flwr[simulation]==1.41.*`` and torch (Flower pins ray 2.55.1,
raysim another Ray, so they live in separate environments); ``vs_flower.py`` starts it and
times the whole process. The data comes from ``vs_flower.py`` as one npz file (the clients'
samples already normalised as raysim normalises them, and the test set), so both sides train
on the same arrays.

    FLOWER_PYTHON workload.py --data W1.npz --spec '{"model": ...}'
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

STARTED = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402
from torch import nn  # noqa: E402

SPEC: dict = {}
"""The workload (set from the command line before the simulation; pickled into the actors)."""
_DATA: dict = {}


def build_model(spec: dict) -> nn.Module:
    """raysim's ConvNet (conv3x3 - GroupNorm per channel - ReLU - avgpool2, x depth, then a
    linear classifier) or MLP (hidden layers with ReLU), in plain torch."""
    model = spec["model"]
    if model["name"] == "convnet":
        channels, size = spec["input_shape"][0], spec["input_shape"][1]
        layers: list[nn.Module] = []
        for _ in range(model["depth"]):
            layers += [nn.Conv2d(channels, model["width"], 3, padding=1),
                       nn.GroupNorm(model["width"], model["width"], affine=True),
                       nn.ReLU(inplace=True), nn.AvgPool2d(2)]
            channels, size = model["width"], size // 2
        return nn.Sequential(*layers, nn.Flatten(),
                             nn.Linear(channels * size * size, spec["num_classes"]))
    widths = [spec["input_shape"][0], *model["hidden"]]
    layers = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(widths[-1], spec["num_classes"]))


def data() -> dict:
    """The workload's arrays, loaded once per process."""
    if not _DATA:
        with np.load(SPEC["data"]) as arrays:
            _DATA.update({k: arrays[k] for k in arrays.files})
    return _DATA


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    """Local SGD on one client's samples: ``local_epochs`` epochs or ``local_steps`` steps."""
    torch.set_num_threads(1)
    client = int(context.node_config["partition-id"])
    arrays = data()
    start, stop = arrays["offsets"][client], arrays["offsets"][client + 1]
    x = torch.tensor(arrays["x_train"][start:stop])
    y = torch.tensor(arrays["y_train"][start:stop])
    model = build_model(SPEC)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=SPEC["lr"])
    generator = torch.Generator().manual_seed(SPEC["seed"] * 1_000_003 + client)
    batch = SPEC["batch_size"]
    steps, total = 0, 0.0
    model.train()
    epochs = SPEC["local_epochs"] or 10**9
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for first in range(0, len(x), batch):
            index = order[first:first + batch]
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            loss.backward()
            optimizer.step()
            steps, total = steps + 1, total + loss.item()
            if SPEC["local_steps"] and steps >= SPEC["local_steps"]:
                break
        if SPEC["local_steps"] and steps >= SPEC["local_steps"]:
            break
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "metrics": MetricRecord({"train_loss": total / max(steps, 1),
                                                   "num-examples": len(x)})})
    return Message(content=content, reply_to=msg)


server_app = ServerApp()
ACCURACY: list[float] = []


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg for ``rounds`` rounds; the global model is evaluated on the test set after the
    last round (as the raysim run is)."""
    torch.manual_seed(SPEC["seed"])
    model = build_model(SPEC)

    def evaluate(round_: int, arrays: ArrayRecord) -> MetricRecord | None:
        if round_ != SPEC["rounds"]:
            return None
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        test = data()
        with torch.no_grad():
            predicted = model(torch.from_numpy(test["x_test"])).argmax(1).numpy()
        accuracy = float((predicted == test["y_test"]).mean())
        ACCURACY.append(accuracy)
        return MetricRecord({"accuracy": accuracy})

    strategy = FedAvg(fraction_train=SPEC["clients_per_round"] / SPEC["num_clients"],
                      fraction_evaluate=0.0, min_available_nodes=SPEC["num_clients"])
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                   num_rounds=SPEC["rounds"], evaluate_fn=evaluate)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the workload's npz (from vs_flower.py)")
    parser.add_argument("--spec", required=True, help="the workload as JSON (from vs_flower.py)")
    parser.add_argument("--seeds", type=int, default=1, help="simulations run one after another")
    args = parser.parse_args()
    SPEC.update(json.loads(args.spec), data=args.data)
    imported = time.perf_counter() - STARTED
    for seed in range(args.seeds):
        SPEC["seed"] = seed
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=SPEC["num_clients"],
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                       "init_args": {"num_cpus": SPEC["cpus"]}})
    print(json.dumps({"flower_imports_s": round(imported, 3),
                      "flower_accuracy": ACCURACY[-1] if ACCURACY else None}), flush=True)


if __name__ == "__main__":
    cli()
