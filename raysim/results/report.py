"""Summary tables (mean +- std over seeds) and learning-curve plots of results."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from raysim.results.load import load

SUMMARY_METRICS = ("accuracy", "macro_f1", "auc", "loss", "personal_accuracy")
_KEYS = ["experiment", "algorithm"]


def final_metrics(rounds: pd.DataFrame) -> pd.DataFrame:
    """The last evaluated round of every run."""
    evaluated = rounds.dropna(subset=["accuracy"])
    last = evaluated.sort_values("round").groupby("run", sort=False).tail(1)
    return last.sort_values([*_KEYS, "seed"]).reset_index(drop=True)


def summary_table(rounds: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of the final metrics, per experiment and algorithm; ``rounds``
    is the last evaluated round and ``completed`` how many of the runs have finished (a run
    still going, or stopped, is reported at its last evaluated round)."""
    final = final_metrics(rounds)
    metrics = [m for m in SUMMARY_METRICS if m in final and final[m].notna().any()]
    grouped = final.groupby(_KEYS, sort=True)
    table = grouped[metrics].agg(["mean", "std"])
    table.columns = [f"{metric}_{stat}" for metric, stat in table.columns]
    table.insert(0, "seeds", grouped["seed"].nunique())
    table.insert(1, "rounds", grouped["round"].max() + 1)
    table.insert(2, "completed", grouped["status"].apply(lambda s: int((s == "completed").sum())))
    return table.reset_index()


def format_summary(table: pd.DataFrame) -> str:
    """Render a summary table with ``mean ± std`` cells."""
    shown = table[[*_KEYS, "seeds", "completed", "rounds"]].copy()
    for column in table.columns:
        if column.endswith("_mean"):
            metric = column.removesuffix("_mean")
            std = table[f"{metric}_std"].fillna(0.0)
            shown[metric] = ["-" if m != m else f"{m:.4f} ± {s:.4f}"
                             for m, s in zip(table[column], std, strict=True)]
    return shown.to_string(index=False)


def plot_learning_curves(rounds: pd.DataFrame, path: Path, metric: str = "accuracy") -> Path:
    """Mean (line) and std (band) over seeds of ``metric`` against the round, one line per
    experiment and algorithm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evaluated = rounds.dropna(subset=[metric])
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for (experiment, algorithm), frame in evaluated.groupby(_KEYS, sort=True):
        curve = frame.groupby("round")[metric].agg(["mean", "std"]).fillna(0.0)
        x = curve.index.to_numpy() + 1
        axis.plot(x, curve["mean"], label=f"{experiment} / {algorithm}")
        axis.fill_between(x, curve["mean"] - curve["std"], curve["mean"] + curve["std"], alpha=0.2)
    axis.set_xlabel("round")
    axis.set_ylabel(f"test {metric}")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def report(paths: str | Path | list[str | Path], metric: str = "accuracy",
           output: str | Path | None = None) -> tuple[str, Path | None]:
    """The summary text of every run under ``paths`` and the learning-curve PNG, written to
    ``output`` (default: the first path)."""
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    rounds = pd.concat([load(path, "rounds") for path in paths], ignore_index=True)
    if rounds.empty or rounds["accuracy"].isna().all():
        return "No evaluated rounds yet.", None
    target = Path(output or paths[0])
    target.mkdir(parents=True, exist_ok=True)
    png = plot_learning_curves(rounds, target / f"learning_curves_{metric}.png", metric)
    return format_summary(summary_table(rounds)), png
