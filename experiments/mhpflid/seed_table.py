"""Per-seed final metrics of finished runs and the mean ± std over the seeds per experiment.

``raysim report``'s ``per_seed.csv`` keeps a personalised method's ``personal_*`` apart from a
global model's ``own_*``; this table puts both in one ``own_*`` column, so that the paired
per-seed comparisons of docs/mhpflid.md compare the two. For example (the PneumoniaMNIST task,
three invocations over the same seeds)::

    python experiments/mhpflid/seed_table.py results/mh-pneu/<root> [<root> ...] \\
        --csv docs/results/mhpflid/pneumonia

Columns: ``own_accuracy`` / ``own_macro_f1``, each client's evaluated model on its own test
share, mean over clients (the personal model for personalised methods: the rounds table's
``personal_*``; the global model for FedAvg/FedProx: ``own_*``), and ``accuracy``, the pooled
test set.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from raysim.results import load
from raysim.results.report import final_metrics

METRICS = ["own_accuracy", "own_macro_f1", "accuracy"]


def final_rows(paths: list[str]) -> pd.DataFrame:
    """One row per completed run at its last evaluated round (the report's
    :func:`~raysim.results.report.final_metrics`): experiment (variant), seed and the metrics
    (own-share metrics from ``personal_*`` where the run has personal models)."""
    rounds = pd.concat([load(path) for path in paths], ignore_index=True)
    last = final_metrics(rounds[rounds["status"] == "completed"])
    rows = last[["experiment", "seed", "accuracy"]].copy()
    for metric in ("accuracy", "macro_f1"):
        personal = last.get(f"personal_{metric}", pd.Series(float("nan"), index=last.index))
        rows[f"own_{metric}"] = personal.fillna(last.get(f"own_{metric}", float("nan")))
    return rows[["experiment", "seed", *METRICS]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="results directories (runs or trees)")
    parser.add_argument("--csv", help="directory for own_share_per_seed.csv and own_share_summary.csv")
    args = parser.parse_args()
    rows = final_rows(args.paths).sort_values(["experiment", "seed"]).reset_index(drop=True)
    summary = rows.groupby("experiment")[METRICS].agg(["mean", "std", "count"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format="%.4f"))
    print()
    print(summary.to_string(float_format="%.4f"))
    if args.csv:
        Path(args.csv).mkdir(parents=True, exist_ok=True)
        rows.to_csv(Path(args.csv) / "own_share_per_seed.csv", index=False)
        summary.to_csv(Path(args.csv) / "own_share_summary.csv")


if __name__ == "__main__":
    main()
