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

writes ``own_share_per_seed.csv`` and ``own_share_summary.csv`` beside the report's CSVs.
Columns: ``own_accuracy`` / ``own_macro_f1``, each client's evaluated model on its own test
share, mean over clients (the personal model for personalised methods: ``personal_*``; the
global model for FedAvg/FedProx: ``own_*``), and ``accuracy``, the pooled test set.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

METRICS = ["own_accuracy", "own_macro_f1", "accuracy"]
REPORT_COLUMNS = ["experiment", "seed", "accuracy", "personal_accuracy", "personal_macro_f1",
                  "own_accuracy", "own_macro_f1"]


def own_share_rows(per_seed: pd.DataFrame) -> pd.DataFrame:
    """One row per experiment and seed with the own-share metrics in one column each
    (``personal_*`` where the run has personal models, else ``own_*``) and ``accuracy``."""
    rows = per_seed[["experiment", "seed", "accuracy"]].copy()
    for metric in ("accuracy", "macro_f1"):
        rows[f"own_{metric}"] = per_seed[f"personal_{metric}"].fillna(per_seed[f"own_{metric}"])
    return rows[["experiment", "seed", *METRICS]].sort_values(["experiment", "seed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", help="a `raysim report --csv` directory (its per_seed.csv "
                                           "has the metrics of REPORT_COLUMNS); the tables are "
                                           "written there")
    args = parser.parse_args()
    directory = Path(args.report_dir)
    per_seed = pd.read_csv(directory / "per_seed.csv")
    missing = [column for column in REPORT_COLUMNS if column not in per_seed.columns]
    if missing:
        print(f"{directory / 'per_seed.csv'} has no column {', '.join(missing)}: make it with "
              "`raysim report ... --metrics personal_accuracy,personal_macro_f1,own_accuracy,"
              f"own_macro_f1,accuracy --csv {directory}`.", file=sys.stderr)
        sys.exit(2)
    rows = own_share_rows(per_seed).reset_index(drop=True)
    summary = rows.groupby("experiment")[METRICS].agg(["mean", "std", "count"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format="%.4f"))
    print()
    print(summary.to_string(float_format="%.4f"))
    rows.to_csv(directory / "own_share_per_seed.csv", index=False)
    summary.to_csv(directory / "own_share_summary.csv")


if __name__ == "__main__":
    main()
