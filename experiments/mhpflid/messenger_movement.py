"""Mean messenger movement per round of MH-pFLID runs: the clients table's messenger_change
(||M_after - M_received|| / ||M_received|| over the messenger's trainable tensors), averaged
over clients and seeds, for every run under the given results directories. Prints CSV.

    python experiments/mhpflid/messenger_movement.py results/mhpflid-lr-study
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from raysim.results import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args()
    rows = []
    for root in args.paths:
        for manifest in sorted(Path(root).rglob("manifest.json")):
            clients = load(manifest.parent, "clients")
            if "messenger_change" not in clients:
                continue
            label = manifest.parent.parent.name
            per_round = clients.groupby("round")["messenger_change"].mean()
            algorithm = json.loads(manifest.read_text())["config"]["algorithm"]
            rows.append({"run": label, "seed": manifest.parent.name,
                         "injection_lr": algorithm["injection_lr"],
                         "distillation_lr": algorithm["distillation_lr"],
                         "distillation_epochs": algorithm["distillation_epochs"],
                         "round_0": per_round.iloc[0], "round_1": per_round.iloc[1],
                         "last_round": per_round.iloc[-1],
                         "mean_rounds_1_on": per_round.iloc[1:].mean()})
    frame = pd.DataFrame(rows)
    print(frame.groupby(["run", "injection_lr", "distillation_lr", "distillation_epochs"])
          [["round_0", "round_1", "last_round", "mean_rounds_1_on"]].mean().round(4)
          .reset_index().to_csv(index=False), end="")


if __name__ == "__main__":
    main()
