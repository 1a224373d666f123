"""The pfl-research side of a peer benchmark (``peers.py``): one workload as a pfl-research 0.6
simulation (``FederatedAveraging`` on a ``SimulatedBackend``, ``PyTorchModel``), with the same
model (``peer_models.py``), data, partition, batch size, local optimizer, clients per round and
rounds as the raysim run, written as pfl-research's own benchmarks are: users' data as tensors
on the training device (``FederatedDataset.from_slices``), SGD as the local optimizer, the
central optimizer SGD with learning rate 1 on the averaged model differences (FedAvg), users
weighted by their data points.

Its recommended mode is several processes (``torchrun --nproc_per_node N``): pfl shards each
cohort's users over them and sums their statistics with ``torch.distributed``. pfl 0.6 gives
rank r the device ``cuda:r`` and reduces with NCCL, which needs one GPU per process; with more
processes than GPUs this script maps rank r to GPU ``r % count`` and reduces with gloo (NCCL
refuses two ranks on one device) before pfl is imported, so N processes share the card, as
pfl-research's guide for multi-process training describes.

    torchrun --standalone --nnodes=1 --nproc_per_node=N pfl_workload.py --data W.npz --spec JSON

It runs under a Python with ``pfl==0.6.0`` and torch (pfl lives in an environment of its own,
as Flower does) and prints, from rank 0, one JSON line: import seconds, steady rounds per
second (from the end of the first round to the end of the last) and the final accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import time

STARTED = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from peer_models import build_model  # noqa: E402
from torch import nn  # noqa: E402


def _share_gpus_between_processes() -> None:
    """More processes than GPUs: rank r on GPU r % count, gloo between the processes."""
    count = torch.cuda.device_count()
    if not count or int(os.environ.get("LOCAL_WORLD_SIZE", "1")) <= count:
        return
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ["PFL_PYTORCH_DEVICE"] = f"cuda:{rank % count}"
    set_device, init_group = torch.cuda.set_device, torch.distributed.init_process_group
    torch.cuda.set_device = lambda device: set_device(int(str(device).split(":")[-1]) % count)
    torch.distributed.init_process_group = (  # type: ignore[assignment]
        lambda backend=None, **kwargs: init_group(backend="gloo", **kwargs))


_share_gpus_between_processes()

from pfl.aggregate.simulate import SimulatedBackend  # noqa: E402
from pfl.aggregate.weighting import WeightByDatapoints  # noqa: E402
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams  # noqa: E402
from pfl.callback.base import TrainingProcessCallback  # noqa: E402
from pfl.data.federated_dataset import FederatedDataset  # noqa: E402
from pfl.data.sampling import get_user_sampler  # noqa: E402
from pfl.hyperparam import NNTrainHyperParams  # noqa: E402
from pfl.internal.ops.pytorch_ops import get_default_device  # noqa: E402
from pfl.metrics import Metrics, Weighted  # noqa: E402
from pfl.model.pytorch import PyTorchModel  # noqa: E402


class Classifier(nn.Module):
    """A network with the ``loss`` and ``metrics`` that pfl's ``PyTorchModel`` asks for."""

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.network(inputs)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = False
             ) -> torch.Tensor:
        self.train(not eval)
        return F.cross_entropy(self(inputs), targets)

    @torch.no_grad()
    def metrics(self, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = True
                ) -> dict[str, Weighted]:
        self.train(not eval)
        logits = self(inputs)
        return {"loss": Weighted(F.cross_entropy(logits, targets, reduction="sum").item(),
                                 len(inputs)),
                "accuracy": Weighted((logits.argmax(1) == targets).sum().item(), len(inputs))}


class RoundEnds(TrainingProcessCallback):
    """When each central iteration ended (perf_counter seconds)."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def after_central_iteration(self, aggregate_metrics: Metrics, model: PyTorchModel, *,
                                central_iteration: int) -> tuple[bool, Metrics]:
        self.ends.append(time.perf_counter())
        return False, Metrics()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the workload's npz (from peers.py)")
    parser.add_argument("--spec", required=True, help="the workload as JSON (from peers.py)")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    imported = time.perf_counter() - STARTED
    torch.manual_seed(spec.get("seed", 0))
    np.random.seed(spec.get("seed", 0))
    device = get_default_device()
    with np.load(args.data) as arrays:
        data = {k: arrays[k] for k in arrays.files}
    x = torch.from_numpy(data["x_train"]).to(device)
    y = torch.from_numpy(data["y_train"]).to(device)
    offsets = data["offsets"]
    users = {user: (x[offsets[user]:offsets[user + 1]], y[offsets[user]:offsets[user + 1]])
             for user in range(spec["num_clients"])}
    federated = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))
    network = Classifier(build_model(spec)).to(device)
    model = PyTorchModel(model=network, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(network.parameters(), 1.0))
    backend = SimulatedBackend(training_data=federated, val_data=None,
                               postprocessors=[WeightByDatapoints()])
    rounds = spec["rounds"]
    train = NNTrainHyperParams(
        local_learning_rate=spec["lr"], local_batch_size=spec["batch_size"],
        local_num_epochs=spec["local_epochs"] if not spec["local_steps"] else None,
        local_num_steps=spec["local_steps"] or None)
    algorithm_params = NNAlgorithmParams(central_num_iterations=rounds,
                                         evaluation_frequency=rounds + 1,
                                         train_cohort_size=spec["clients_per_round"],
                                         val_cohort_size=None)
    ends = RoundEnds()
    FederatedAveraging().run(algorithm_params=algorithm_params, backend=backend, model=model,
                             model_train_params=train, model_eval_params=None,
                             callbacks=[ends])
    if int(os.environ.get("RANK", "0")) != 0:
        return
    with torch.no_grad():
        network.eval()
        predicted = network(torch.from_numpy(data["x_test"]).to(device)).argmax(1).cpu()
    accuracy = float((predicted.numpy() == data["y_test"]).mean())
    steady = (len(ends.ends) - 1) / (ends.ends[-1] - ends.ends[0]) if len(ends.ends) > 1 \
        else None
    print(json.dumps({"pfl_imports_s": round(imported, 3), "pfl_rounds_per_s": steady,
                      "pfl_rounds": len(ends.ends), "pfl_accuracy": accuracy,
                      "pfl_device": str(device),
                      "pfl_processes": int(os.environ.get("WORLD_SIZE", "1"))}), flush=True)


if __name__ == "__main__":
    main()
