"""The example plug-in from Python, as a notebook would use it: FedTrim against FedAvg on the
plug-in's dataset, every seed, and the comparison as a pandas table with Welch's t.

    python experiments/plugins/compare_with_fedavg.py [--rounds 20] [--seeds 0 1 2 3 4]

On a cluster, add `--set engine.address=auto` (or set RAY_ADDRESS): the plug-in's module
travels to the nodes with the job.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scipy import stats

import raysim

CONFIG = Path(__file__).with_name("fedtrim.yaml")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--output", default="results")
    args = parser.parse_args()
    results = raysim.run(CONFIG, overrides=[f"training.rounds={args.rounds}",
                                            f"seeds={args.seeds}", *args.overrides],
                         output=args.output)
    assert results is not None
    print(results.summary(["accuracy", "macro_f1"]).to_string(index=False))
    rounds = results.table("rounds")
    final = rounds[rounds["round"] == rounds["round"].max()]
    by_method = {name: group["accuracy"].to_numpy() for name, group in final.groupby("experiment")}
    test = stats.ttest_ind(by_method["fedtrim"], by_method["fedavg"], equal_var=False)
    print(f"fedtrim - fedavg accuracy: {by_method['fedtrim'].mean() - by_method['fedavg'].mean():+.3f}"
          f" (Welch's t = {test.statistic:.2f}, p = {test.pvalue:.3f}, "
          f"{len(by_method['fedtrim'])} seeds each)")


if __name__ == "__main__":
    main()
