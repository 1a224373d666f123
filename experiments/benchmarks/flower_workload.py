"""The Flower side of a peer benchmark (``peers.py``): one workload as a
Flower 1.41 simulation (Message API, ``FedAvg`` strategy, ``run_simulation`` on Ray), in plain
PyTorch with the same model (``peer_models.py``), data, partition, batch size, optimizer,
clients per round and rounds as the raysim run. On a GPU (``"device": "cuda"`` in the spec)
each client actor takes ``gpus_per_client`` of it (pfl-research's setup for Flower: 1 CPU and
0.1 GPU per client). Prints when each round ended, so that its steady rounds per second can be
read beside its whole-process time.

It runs under a Python that has ``flwr[simulation]==1.41.*`` and torch (Flower pins ray 2.55.1,
raysim another Ray, so they live in separate environments); ``peers.py`` starts it and
times the whole process. The data comes from ``peers.py`` as one npz file (the clients'
samples already normalised as raysim normalises them, and the test set), so both sides train
on the same arrays.

    FLOWER_PYTHON workload.py --data WORKLOAD.npz --spec '{"model": ...}'
"""

from __future__ import annotations

import argparse
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
from peer_models import build_model  # noqa: E402
from torch import nn  # noqa: E402

SPEC: dict = {}
"""The workload (set from the command line before the simulation; pickled into the actors)."""
_DATA: dict = {}


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
    device = torch.device(SPEC.get("device", "cpu"))
    client = int(context.node_config["partition-id"])
    arrays = data()
    start, stop = arrays["offsets"][client], arrays["offsets"][client + 1]
    x = torch.tensor(arrays["x_train"][start:stop], device=device)
    y = torch.tensor(arrays["y_train"][start:stop], device=device)
    model = build_model(SPEC).to(device)
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=SPEC["lr"])
    generator = torch.Generator().manual_seed(SPEC["seed"] * 1_000_003 + client)
    batch = SPEC["batch_size"]
    steps, total = 0, 0.0
    model.train()
    epochs = SPEC["local_epochs"] or 10**9
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator).to(device)
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
ROUND_ENDS: list[float] = []
"""When each round's aggregate reached the server (perf_counter seconds)."""


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """FedAvg for ``rounds`` rounds; the global model is evaluated on the test set after the
    last round (as the raysim run is)."""
    torch.manual_seed(SPEC["seed"])
    model = build_model(SPEC)

    def evaluate(round_: int, arrays: ArrayRecord) -> MetricRecord | None:
        if round_ >= 1:
            ROUND_ENDS.append(time.perf_counter())
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
    parser.add_argument("--data", required=True, help="the workload's npz (from peers.py)")
    parser.add_argument("--spec", required=True, help="the workload as JSON (from peers.py)")
    parser.add_argument("--seeds", type=int, default=1, help="simulations run one after another")
    args = parser.parse_args()
    SPEC.update(json.loads(args.spec), data=args.data)
    imported = time.perf_counter() - STARTED
    gpus = SPEC.get("gpus_per_client", 0.0) if SPEC.get("device", "cpu") != "cpu" else 0.0
    init_args = {"num_cpus": SPEC["cpus"], **({"num_gpus": 1} if gpus else {})}
    for seed in range(args.seeds):
        SPEC["seed"] = seed
        ROUND_ENDS.clear()
        run_simulation(server_app=server_app, client_app=client_app,
                       num_supernodes=SPEC["num_clients"],
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": gpus},
                                       "init_args": init_args})
    steady = (len(ROUND_ENDS) - 1) / (ROUND_ENDS[-1] - ROUND_ENDS[0]) if len(ROUND_ENDS) > 1 \
        else None
    print(json.dumps({"flower_imports_s": round(imported, 3),
                      "flower_rounds_per_s": steady,
                      "flower_accuracy": ACCURACY[-1] if ACCURACY else None}), flush=True)


if __name__ == "__main__":
    cli()
