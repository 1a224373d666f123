"""Per-seed final metrics of finished runs, optionally with seeds from an earlier session's
committed ``raysim report`` summary, and the mean ± std over all seeds per experiment.

For tasks whose seeds ran in different sessions (the Parquet of an earlier session is not in
the repository, its ``raysim report`` CSV is): the CSV's rows with ``seeds == 1`` are that
seed's values. Example (the PneumoniaMNIST task of docs/mhpflid.md)::

    python experiments/mhpflid/seed_table.py results/mh-pneu \\
        --earlier docs/results/mhpflid/pneumonia_seed0/summary.csv --earlier-seed 0 \\
        --csv docs/results/mhpflid/pneumonia
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from raysim.results import load

METRICS = ["personal_accuracy", "personal_macro_f1", "own_accuracy", "own_macro_f1", "accuracy"]
"""Personal models on their own test shares (personal_*), a global model on them (own_*: FedAvg,
FedProx), and the pooled test set (accuracy)."""


def final_rows(paths: list[str]) -> pd.DataFrame:
    """One row per completed run: experiment (variant), seed and the metrics of its last
    evaluated round."""
    rounds = pd.concat([load(path) for path in paths], ignore_index=True)
    rounds = rounds[rounds["status"] == "completed"].dropna(subset=["accuracy"])
    last = rounds.sort_values("round").groupby("run").tail(1)
    return last[["experiment", "seed", *[m for m in METRICS if m in last]]].reset_index(drop=True)


def earlier_rows(summary_csv: str, seed: int) -> pd.DataFrame:
    """The single-seed rows of an earlier ``raysim report --csv`` summary as per-seed rows."""
    summary = pd.read_csv(summary_csv)
    summary = summary[summary["seeds"] == 1]
    rows = pd.DataFrame({"experiment": summary["experiment"], "seed": seed})
    for metric in METRICS:
        if f"{metric}_mean" in summary:
            rows[metric] = summary[f"{metric}_mean"].to_numpy()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="results directories (runs or trees)")
    parser.add_argument("--earlier", help="an earlier session's summary.csv (single-seed rows)")
    parser.add_argument("--earlier-seed", type=int, default=0)
    parser.add_argument("--csv", help="directory for per_seed.csv and seed_summary.csv")
    args = parser.parse_args()
    rows = final_rows(args.paths)
    if args.earlier:
        rows = pd.concat([earlier_rows(args.earlier, args.earlier_seed), rows], ignore_index=True)
    rows = rows.sort_values(["experiment", "seed"]).reset_index(drop=True)
    metrics = [m for m in METRICS if m in rows]
    summary = rows.groupby("experiment")[metrics].agg(["mean", "std", "count"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format="%.4f"))
    print()
    print(summary.to_string(float_format="%.4f"))
    if args.csv:
        Path(args.csv).mkdir(parents=True, exist_ok=True)
        rows.to_csv(Path(args.csv) / "per_seed.csv", index=False)
        summary.to_csv(Path(args.csv) / "seed_summary.csv")


if __name__ == "__main__":
    main()
