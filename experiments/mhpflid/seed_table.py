"""Own-share metrics per seed, and their mean ± std per experiment, from a ``raysim report``
CSV directory.

``raysim report --csv DIR``'s ``per_seed.csv`` keeps a personalised method's ``personal_*`` apart
from a global model's ``own_*``; this table puts both in one ``own_*`` column, so that the paired
per-seed comparisons of docs/mhpflid.md compare the two. It reads only the committed CSV, so the
tables re-derive without the runs' Parquet. For example (the PneumoniaMNIST task)::

    raysim report <root> [<root> ...] --per-client --communication \\
        --metrics personal_accuracy,personal_macro_f1,own_accuracy,own_macro_f1,accuracy \\
        --csv docs/results/mhpflid/pneumonia
    python experiments/mhpflid/seed_table.py docs/results/mhpflid/pneumonia
    python experiments/mhpflid/seed_table.py docs/results/segmentation/table4 --metrics dice,iou

writes ``own_share_per_seed.csv`` and ``own_share_summary.csv`` beside the report's CSVs (and,
from each ``per_client_<metric>.csv``, ``own_share_per_client_<metric>.csv``, where a
fine-tuned model's row is the experiment ``<experiment>+ft``).
Columns: ``own_accuracy`` / ``own_macro_f1``, each client's evaluated model on its own test
share, mean over clients (the personal model for personalised methods: ``personal_*``; the
global model for FedAvg/FedProx: ``own_*``), and ``accuracy``, the pooled test set. Runs
that fine-tuned their global model after training (``evaluation.fine_tune_epochs``: the
report's ``ft_own_*`` and ``ft_global_*`` columns) add rows ``<experiment>+ft``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

CLASSIFICATION = ("accuracy", "macro_f1")
SEGMENTATION = ("dice", "iou")
"""``--metrics dice,iou``: a segmentation study's own-share Dice and IoU (pooled: ``dice``)."""


def metric_columns(metrics: tuple[str, ...]) -> list[str]:
    """The table's columns: each metric on the clients' own shares, then the pooled first."""
    return [*(f"own_{m}" for m in metrics), metrics[0]]


def report_columns(metrics: tuple[str, ...]) -> list[str]:
    """The per_seed.csv columns the table needs."""
    return ["experiment", "seed", metrics[0], *(f"personal_{m}" for m in metrics),
            *(f"own_{m}" for m in metrics)]


def own_share_rows(per_seed: pd.DataFrame, metrics: tuple[str, ...] = CLASSIFICATION
                   ) -> pd.DataFrame:
    """One row per experiment and seed with the own-share metrics in one column each
    (``personal_*`` where the run has personal models, else ``own_*``) and the pooled first
    metric (``accuracy``)."""
    rows = per_seed[["experiment", "seed", metrics[0]]].copy()
    for metric in metrics:
        rows[f"own_{metric}"] = per_seed[f"personal_{metric}"].fillna(per_seed[f"own_{metric}"])
    tuned = fine_tuned_rows(per_seed, metrics)
    return pd.concat([rows, tuned])[["experiment", "seed", *metric_columns(metrics)]].sort_values(
        ["experiment", "seed"])


def fine_tuned_rows(per_seed: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """The runs that fine-tuned their global model after training (``ft_own_*``, +FT) as
    experiments of their own, ``<experiment>+ft``: each client's fine-tuned model on its own
    share, and (the pooled column) on the pooled test set, mean over clients."""
    columns = [f"ft_own_{m}" for m in metrics]
    if not set(columns) <= set(per_seed.columns):
        return pd.DataFrame(columns=["experiment", "seed"])
    tuned = per_seed.dropna(subset=columns[:1])
    rows = tuned[["experiment", "seed"]].copy()
    rows["experiment"] = rows["experiment"] + "+ft"
    pooled = f"ft_global_{metrics[0]}"
    rows[metrics[0]] = tuned[pooled] if pooled in tuned else float("nan")
    for metric in metrics:
        rows[f"own_{metric}"] = tuned[f"ft_own_{metric}"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", help="a `raysim report --csv` directory (its per_seed.csv "
                                           "has the metrics of REPORT_COLUMNS); the tables are "
                                           "written there")
    parser.add_argument("--metrics", default=",".join(CLASSIFICATION),
                        help="the metrics, pooled first (default accuracy,macro_f1; a "
                        "segmentation study: dice,iou)")
    args = parser.parse_args()
    metrics = tuple(args.metrics.split(","))
    directory = Path(args.report_dir)
    per_seed = pd.read_csv(directory / "per_seed.csv")
    needed = report_columns(metrics)
    missing = [column for column in needed if column not in per_seed.columns]
    if missing:
        print(f"{directory / 'per_seed.csv'} has no column {', '.join(missing)}: make it with "
              f"`raysim report ... --metrics {','.join(needed[2:])} --csv {directory}`.",
              file=sys.stderr)
        sys.exit(2)
    rows = own_share_rows(per_seed, metrics).reset_index(drop=True)
    summary = rows.groupby("experiment")[metric_columns(metrics)].agg(["mean", "std", "count"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format="%.4f"))
    print()
    print(summary.to_string(float_format="%.4f"))
    rows.to_csv(directory / "own_share_per_seed.csv", index=False)
    summary.to_csv(directory / "own_share_summary.csv")
    for metric in metrics:  # the per-client tables, a fine-tuned model's row as <exp>+ft
        per_client = directory / f"per_client_{metric}.csv"
        if per_client.is_file():
            table = pd.read_csv(per_client)
            if "model" in table:
                tuned = table["model"] == "fine-tuned"
                table.loc[tuned, "experiment"] = table.loc[tuned, "experiment"] + "+ft"
            table.to_csv(directory / f"own_share_per_client_{metric}.csv", index=False)


if __name__ == "__main__":
    main()
