"""Per-seed final metrics of finished runs, optionally with seeds from an earlier run's
committed ``raysim report`` summary, and the mean ± std over all seeds per experiment.

For experiments whose seeds ran in separate invocations (the Parquet of an earlier one is not
in the repository, its ``raysim report --per-client --csv`` directory is): that directory's
single-seed rows are that seed's values. Example (the PneumoniaMNIST task of docs/mhpflid.md)::

    python experiments/mhpflid/seed_table.py results/mh-pneu/<root> [<root> ...] \\
        --earlier docs/results/mhpflid/pneumonia_seed0 --earlier-seed 0 \\
        --per-client docs/results/mhpflid/pneumonia_seed0 docs/results/mhpflid/pneumonia_seeds12 \\
        --csv docs/results/mhpflid/pneumonia

Columns: ``own_accuracy`` / ``own_macro_f1``, each client's evaluated model on its own test
share, mean over clients (the personal model for personalised methods: the rounds table's
``personal_*``; the global model for FedAvg/FedProx: ``own_*``; the report's per-client
``average``), and ``accuracy``, the pooled test set.
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


def earlier_rows(report_dir: str, seed: int) -> pd.DataFrame:
    """One seed's rows from an earlier ``raysim report --per-client --csv`` directory
    (single-seed experiments only)."""
    directory = Path(report_dir)
    summary = pd.read_csv(directory / "summary.csv")
    summary = summary[summary["seeds"] == 1]
    rows = pd.DataFrame({"experiment": summary["experiment"].to_numpy(), "seed": seed,
                         "accuracy": summary["accuracy_mean"].to_numpy()})
    for metric in ("accuracy", "macro_f1"):
        per_client = pd.read_csv(directory / f"per_client_{metric}.csv")
        average = per_client.set_index("experiment")["average"]
        rows[f"own_{metric}"] = rows["experiment"].map(average).to_numpy()
    return rows[["experiment", "seed", *METRICS]]


def pooled_per_client(report_dirs: list[str]) -> dict[str, pd.DataFrame]:
    """Per-client tables (``per_client_accuracy.csv``, ``per_client_macro_f1.csv``) of several
    ``raysim report --per-client --csv`` directories over disjoint seeds, combined into the mean
    over all their seeds (each directory's row weighted by its ``seeds`` in summary.csv)."""
    directories = [Path(d) for d in report_dirs]
    seeds = [pd.read_csv(d / "summary.csv").set_index("experiment")["seeds"] for d in directories]
    tables: dict[str, pd.DataFrame] = {}
    for metric in ("accuracy", "macro_f1"):
        parts = [pd.read_csv(d / f"per_client_{metric}.csv").set_index("experiment")
                 for d in directories]
        weights = pd.concat([n.reindex(part.index) for n, part in zip(seeds, parts, strict=True)])
        numeric = [c for c in parts[0].columns if c != "algorithm"]
        sums = pd.concat([part[numeric] for part in parts]).mul(weights, axis=0)
        combined = sums.groupby(level=0).sum().div(weights.groupby(level=0).sum(), axis=0)
        algorithms = pd.concat([part["algorithm"] for part in parts]).groupby(level=0).first()
        combined.insert(0, "algorithm", algorithms)
        combined.insert(1, "seeds", weights.groupby(level=0).sum())
        tables[f"per_client_{metric}.csv"] = combined.reset_index()
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="results directories (runs or trees)")
    parser.add_argument("--earlier", help="an earlier invocation's report CSV directory")
    parser.add_argument("--earlier-seed", type=int, default=0)
    parser.add_argument("--per-client", nargs="+", metavar="REPORT_DIR",
                        help="report CSV directories over disjoint seeds whose per-client "
                             "tables are combined (e.g. the earlier one and this one's)")
    parser.add_argument("--csv", help="directory for per_seed.csv, seed_summary.csv and the "
                                      "combined per-client tables")
    args = parser.parse_args()
    rows = final_rows(args.paths)
    if args.earlier:
        rows = pd.concat([earlier_rows(args.earlier, args.earlier_seed), rows], ignore_index=True)
    rows = rows.sort_values(["experiment", "seed"]).reset_index(drop=True)
    summary = rows.groupby("experiment")[METRICS].agg(["mean", "std", "count"])
    summary.columns = [f"{metric}_{stat}" for metric, stat in summary.columns]
    pd.set_option("display.width", 200)
    print(rows.to_string(index=False, float_format="%.4f"))
    print()
    print(summary.to_string(float_format="%.4f"))
    per_client = pooled_per_client(args.per_client) if args.per_client else {}
    for name, table in per_client.items():
        print(f"\n{name} (mean over seeds)")
        print(table.to_string(index=False, float_format="%.3f"))
    if args.csv:
        Path(args.csv).mkdir(parents=True, exist_ok=True)
        rows.to_csv(Path(args.csv) / "per_seed.csv", index=False)
        summary.to_csv(Path(args.csv) / "seed_summary.csv")
        for name, table in per_client.items():
            table.to_csv(Path(args.csv) / name, index=False)


if __name__ == "__main__":
    main()
