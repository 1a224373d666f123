"""The Flower side of the server-optimizer comparison (``server_optimizers.py``): Flower's own
FedAvgM, FedAdagrad, FedAdam and FedYogi strategies (``flwr.server.strategy``) fed the same
round means as raysim's server step, one client per round whose model is that mean, so that
each strategy's FedAvg step returns it and the strategy's own update rule makes the next model.

It runs under a Python that has ``flwr==1.41.*`` (Flower pins its own Ray, so it lives in its
own environment); ``server_optimizers.py`` starts it:

    FLOWER_PYTHON flower_server_optimizers.py --means MEANS.npz --settings '[...]' --out OUT.npz

``MEANS.npz`` holds ``start`` (the initial model, one float32 vector) and ``means`` (rounds x
entries); ``--settings`` a JSON list of {"label", "name", "lr", "momentum", "beta1", "beta2",
"tau"}; ``OUT.npz`` gets each label's trajectory (rounds x entries).
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

import numpy as np
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.logger import FLOWER_LOGGER
from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi


def strategy(setting: dict[str, Any], start: np.ndarray) -> Any:
    """Flower's strategy for one raysim setting, from the initial model ``start``."""
    initial = ndarrays_to_parameters([start])
    if setting["name"] == "sgd":
        return FedAvgM(initial_parameters=initial, server_learning_rate=setting["lr"],
                       server_momentum=setting["momentum"])
    if setting["name"] == "adagrad":  # FedAdagrad fixes beta_1 = beta_2 = 0
        return FedAdagrad(initial_parameters=initial, eta=setting["lr"], tau=setting["tau"])
    chosen = FedAdam if setting["name"] == "adam" else FedYogi
    return chosen(initial_parameters=initial, eta=setting["lr"], beta_1=setting["beta1"],
                  beta_2=setting["beta2"], tau=setting["tau"])


def trajectory(setting: dict[str, Any], start: np.ndarray, means: np.ndarray) -> np.ndarray:
    """The models Flower's strategy produces, one per round (server_round from 1)."""
    chosen, models = strategy(setting, start), []
    for server_round, mean in enumerate(means, start=1):
        reply = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([mean]), 1, {})
        parameters, _ = chosen.aggregate_fit(server_round, [(None, reply)], [])
        models.append(np.asarray(parameters_to_ndarrays(parameters)[0], dtype=np.float64))
    return np.stack(models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--means", required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    FLOWER_LOGGER.setLevel(logging.ERROR)  # (its FedAvg warns of no metrics aggregation)
    with np.load(args.means) as arrays:
        start, means = arrays["start"], arrays["means"]
    results = {setting["label"]: trajectory(setting, start, means)
               for setting in json.loads(args.settings)}
    np.savez(args.out, **results)


if __name__ == "__main__":
    main()
