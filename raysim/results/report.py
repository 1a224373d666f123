"""Summary tables (mean +- std over seeds) and learning-curve plots of results."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from raysim.errors import RaysimError, ResultsNotWritable
from raysim.results.atomic import write_atomically
from raysim.results.load import load
from raysim.results.manifest import read_manifest

SUMMARY_METRICS = ("dice", "accuracy", "macro_f1", "auc", "loss", "own_accuracy",
                   "personal_accuracy", "unseen_accuracy", "own_dice", "personal_dice",
                   "unseen_dice")
"""The summary's columns, those the runs recorded (``dice``: segmentation tasks)."""
_KEYS = ["experiment", "algorithm"]


def final_metrics(rounds: pd.DataFrame, checkpoint: str = "last",
                  select_by: str = "val_accuracy", window: int = 1) -> pd.DataFrame:
    """One row per run: its last evaluated round (``checkpoint="last"``), or
    (``checkpoint="best"``) its evaluated round of highest ``select_by``, a validation metric
    (the earliest such round on ties), as papers that report the best validation checkpoint
    do. ``window`` > 1 (with "last"): every numeric metric is the mean over the run's last
    ``window`` evaluated rounds, robust to a metric that alternates from round to round (run
    with ``evaluation.final_rounds`` >= ``window``). The row's ``round`` says which round was
    chosen (the last of the window)."""
    evaluated = rounds.dropna(subset=["accuracy"]).sort_values("round", kind="stable")
    if window > 1 and checkpoint != "last":
        raise RaysimError(
            f"Cannot average the last {window} evaluations at the best checkpoint: --window "
            "applies to the last evaluated rounds. Drop --window, or report --checkpoint last.")
    if checkpoint == "last" and window > 1:
        chosen = _window_means(evaluated, window)
    elif checkpoint == "last":
        chosen = evaluated.groupby("run", sort=False).tail(1)
    elif checkpoint == "best":
        if select_by not in evaluated or evaluated[select_by].isna().all():
            raise RaysimError(
                f"Cannot report the best checkpoint by {select_by!r}: these results have no "
                f"{select_by} values. Best-checkpoint reporting needs a validation split: run "
                "with evaluation.validation set (e.g. --set evaluation.validation=0.1), or "
                "report the last round (--checkpoint last).")
        scored = evaluated.dropna(subset=[select_by])
        chosen = scored.loc[scored.groupby("run", sort=False)[select_by].idxmax()]
    else:
        raise RaysimError(f"Unknown checkpoint {checkpoint!r}: use 'last' or 'best'.")
    order = {key: place for place, key in enumerate(dict.fromkeys(
        zip(rounds["experiment"], rounds["algorithm"], strict=True)))}  # load's: the config's
    place = [order[key] for key in zip(chosen["experiment"], chosen["algorithm"], strict=True)]
    return chosen.copy().assign(_place=place).sort_values(["_place", "seed"], kind="stable").drop(
        columns="_place").reset_index(drop=True)


def _window_means(evaluated: pd.DataFrame, window: int) -> pd.DataFrame:
    """Each run's last row with its numeric metrics averaged over its last ``window``
    evaluated rounds; a run with fewer evaluations is refused (one paragraph)."""
    last = evaluated.groupby("run", sort=False).tail(window)
    counts = last.groupby("run", sort=False)["round"].count()
    short = counts[counts < window]
    if len(short):
        raise RaysimError(
            f"Cannot average the last {window} evaluations: {len(short)} run(s) have fewer "
            f"(e.g. {short.index[0]} has {int(short.iloc[0])}). Run with "
            f"evaluation.final_rounds >= {window} (and evaluation.every > 0), or lower --window.")
    chosen = last.groupby("run", sort=False).tail(1).set_index("run")
    numeric = [c for c in last.columns if c not in ("round", "seed")
               and pd.api.types.is_float_dtype(last[c])]
    chosen[numeric] = last.groupby("run", sort=False)[numeric].mean()
    return chosen.reset_index()


def summary_table(rounds: pd.DataFrame, metrics: list[str] | None = None,
                  checkpoint: str = "last", select_by: str = "val_accuracy",
                  window: int = 1) -> pd.DataFrame:
    """Mean and std over seeds of the final metrics (default: those of
    :data:`SUMMARY_METRICS` present), per experiment and algorithm, at each run's last
    evaluated round or (``checkpoint="best"``) its best validation round
    (:func:`final_metrics`); ``rounds`` is the last round reported and ``completed`` how many of
    the runs have finished (``stopped``, shown when any: how many ended early at their privacy
    budget; a run still going, or interrupted, is reported at its last evaluated
    round)."""
    final = final_metrics(rounds, checkpoint, select_by, window)
    if metrics is None:
        metrics = [m for m in SUMMARY_METRICS if m in final and final[m].notna().any()]
    missing = [m for m in metrics if m not in final]
    if missing:
        raise RaysimError(
            f"No column {missing[0]!r} in these results. Metric columns present: "
            f"{', '.join(c for c in final.columns if final[c].dtype.kind == 'f')}."
        )
    grouped = final.groupby(_KEYS, sort=False)  # in the order load gives: the config's
    table = grouped[metrics].agg(["mean", "std"])
    table.columns = [f"{metric}_{stat}" for metric, stat in table.columns]
    table.insert(0, "seeds", grouped["seed"].nunique())
    table.insert(1, "rounds", grouped["round"].max() + 1)
    table.insert(2, "completed", grouped["status"].apply(lambda s: int((s == "completed").sum())))
    if (final["status"] == "stopped").any():  # ended early by their privacy budget
        table.insert(3, "stopped", grouped["status"].apply(lambda s: int((s == "stopped").sum())))
    return table.reset_index()


def format_summary(table: pd.DataFrame) -> str:
    """Render a summary table with ``mean ± std`` cells (``value (n=1)`` where one seed leaves
    the spread undefined)."""
    shown = table[[*_KEYS, "seeds", "completed",
                   *(["stopped"] if "stopped" in table else []), "rounds"]].copy()
    for column in table.columns:
        if column.endswith("_mean"):
            metric = column.removesuffix("_mean")
            shown[metric] = ["-" if m != m else f"{m:.4f} (n=1)" if s != s
                             else f"{m:.4f} ± {s:.4f}"
                             for m, s in zip(table[column], table[f"{metric}_std"], strict=True)]
    return shown.to_string(index=False)


def _curve_label(experiment: str, algorithm: str) -> str:
    """A legend label: the variant or grid label (run timestamps dropped), with the algorithm
    when it is not already the label."""
    name = re.sub(r"-\d{8}-\d{6}(-\d+)?$", "", str(experiment))
    return name if name == algorithm else f"{name} ({algorithm})"


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (imported on first use: about 0.3 s;
    ``raysim run`` and ``raysim sweep`` import it in the background while their runs go)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_learning_curves(rounds: pd.DataFrame, path: Path, metric: str = "accuracy",
                         x_axis: str = "round",
                         recovery: str = "run `raysim report` again.") -> Path:
    """Mean (line) and ± one standard deviation over seeds (band; none for one seed) of
    ``metric`` after each completed round (Parquet ``round`` r is the state after r + 1
    rounds), one line per experiment, variant or grid point, in distinct colours and line
    styles, the legend outside the axes, the dataset(s) and metric in the title."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    evaluated = rounds.dropna(subset=[metric])
    figure, axis = plt.subplots(figsize=(8.5, 4.5))
    colours = plt.get_cmap("tab10").colors  # type: ignore[attr-defined]
    styles = ("-", "--", "-.", ":")
    seeds_seen = set()
    groups = list(evaluated.groupby(_KEYS, sort=False))
    labels = [_curve_label(experiment, algorithm) for (experiment, algorithm), _ in groups]
    if len(set(labels)) < len(labels):  # runs of one config in several roots: keep the stamps
        labels = [f"{experiment} ({algorithm})" for (experiment, algorithm), _ in groups]
    for index, (_, frame) in enumerate(groups):
        curve = frame.groupby("round")[metric].agg(["mean", "std", "count"])
        x = (curve.index.to_numpy() + 1 if x_axis == "round"
             else frame.groupby("round")[x_axis].mean().to_numpy())
        colour, style = colours[index % len(colours)], styles[(index // len(colours)) % 4]
        seeds = int(curve["count"].max())
        seeds_seen.add(seeds)
        axis.plot(x, curve["mean"], color=colour, linestyle=style, linewidth=1.8,
                  label=f"{labels[index]} (n={seeds})")
        if seeds > 1:
            axis.fill_between(x, curve["mean"] - curve["std"], curve["mean"] + curve["std"],
                              color=colour, alpha=0.15, linewidth=0)
    axis.set_xlabel("rounds completed" if x_axis == "round" else
                    "simulated hours (mean over seeds at each round's end)")
    axis.set_ylabel(f"test {metric}")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(alpha=0.3)
    datasets = sorted({str(read_manifest(Path(run)).get("dataset", "?"))
                       for run in evaluated["run"].unique()}) if "run" in evaluated else []
    band = "; band: ± 1 std over seeds" if max(seeds_seen, default=1) > 1 else ""
    axis.set_title(f"{metric} on {', '.join(datasets) or 'the test set'}{band}", fontsize=10)
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    figure.tight_layout()
    try:
        write_atomically(path, lambda file: figure.savefig(file, dpi=120, bbox_inches="tight",
                                                           format="png"), recovery)
    finally:
        plt.close(figure)
    return path


def time_table(rounds: pd.DataFrame, metric: str = "accuracy", target: float | None = None
               ) -> pd.DataFrame:
    """Per method/variant, over seeds (mean, std): the simulated seconds of the whole run, the
    final ``metric``, the share of selected clients dropped (late, offline or surplus) and,
    with ``target``, the simulated seconds and rounds until ``metric`` first reached it
    (``reached``: how many seeds did; a seed that never did counts as missing)."""
    if "sim_hours" not in rounds:
        raise RaysimError("These results have no simulated clock: time-to-accuracy needs runs "
                          "with a `system:` section.")
    rows = []
    for (experiment, algorithm), frame in rounds.groupby(_KEYS, sort=True):
        per_seed = []
        for _, run in frame.sort_values("round").groupby("run"):
            evaluated = run.dropna(subset=[metric])
            entry = {"seconds": run["sim_end_s"].iloc[-1],
                     metric: evaluated[metric].iloc[-1] if len(evaluated) else float("nan"),
                     "dropped": run["clients_dropped"].sum() / max(run["clients_selected"].sum(), 1)}
            if target is not None:
                hit = evaluated[evaluated[metric] >= target]
                entry["seconds_to_target"] = (hit["sim_end_s"].iloc[0] if len(hit)
                                              else float("nan"))
                entry["rounds_to_target"] = hit["round"].iloc[0] + 1 if len(hit) else float("nan")
            per_seed.append(entry)
        table = pd.DataFrame(per_seed)
        row = {"experiment": experiment, "algorithm": algorithm, "seeds": len(table)}
        for column in table.columns:
            row[f"{column}_mean"] = table[column].mean()
            row[f"{column}_std"] = table[column].std()
        if target is not None:
            row["reached"] = int(table["seconds_to_target"].notna().sum())
        rows.append(row)
    return pd.DataFrame(rows)


def participation_table(system: pd.DataFrame) -> pd.DataFrame:
    """Trained updates per tier (or per client without tiers) over a run, mean over seeds,
    per method/variant: which sites the policy let take part."""
    if system.empty:
        return pd.DataFrame()
    trained = system[system["outcome"] == "trained"]
    column = "tier" if (trained["tier"] != "").any() else "client"
    counts = trained.groupby([*_KEYS, "seed", column]).size().unstack(column, fill_value=0)
    table = counts.groupby(level=list(range(len(_KEYS)))).mean()
    table.columns = [str(c) for c in table.columns]
    return table.reset_index()


def _held_out_client(run: str) -> int | None:
    """The client a run held out (its personalized models are numbered without it)."""
    return read_manifest(Path(run))["config"]["partition"].get("holdout_client")


def _original_id(client: int, held_out: int | None) -> int:
    """A training client's id in the partition (ids after a held-out client shift by one)."""
    shifted = held_out is not None and client >= held_out
    return client + 1 if shifted else client


def _route_label(chosen: int, held_out: int | None) -> str:
    """GM, or PM<k> with k the client's id in the partition (also with a held-out client)."""
    return "GM" if chosen < 0 else f"PM{_original_id(chosen, held_out)}"


def selection_table(selection: pd.DataFrame, model: str = "main") -> pd.DataFrame:
    """Route frequencies of a routing model (e.g. FedSM's super model) at the last evaluated
    round of each run, averaged over seeds: one row per (experiment, algorithm, source client),
    one column per chosen model (``GM``: the global model, ``PM<k>``: client k's personalized
    model, k as in the partition even when a client was held out), values the share of the
    source's test samples (the paper's Table 5). ``source_client`` -1 is the held-out (unseen)
    client."""
    chosen = selection[selection["model"] == model]
    if chosen.empty:
        return pd.DataFrame()
    last = chosen.groupby("run")["round"].transform("max")
    chosen = chosen[chosen["round"] == last].copy()
    chosen["share"] = chosen["count"] / chosen.groupby(["run", "source_client"])["count"
                                                                               ].transform("sum")
    held_out_of = {run: _held_out_client(run) for run in chosen["run"].unique()}  # one read
    held_out = [held_out_of[run] for run in chosen["run"]]
    chosen["route"] = [_route_label(c, h) for c, h in zip(chosen["chosen"], held_out,
                                                            strict=True)]
    chosen["source_client"] = [_original_id(c, h) for c, h in zip(chosen["source_client"],
                                                                   held_out, strict=True)]
    table = chosen.pivot_table(index=[*_KEYS, "run", "source_client"], columns="route",
                               values="share", fill_value=0.0)
    table = table.groupby(level=[0, 1, 3]).mean()
    routes = sorted(table.columns, key=lambda r: (r != "GM", int(r[2:]) if r != "GM" else 0))
    return table[routes].reset_index()


def client_table(client_eval: pd.DataFrame, metric: str = "accuracy") -> pd.DataFrame:
    """Each client's ``metric`` on its own test share at the last evaluated round, mean over
    seeds: one row per experiment and algorithm, one column per client, plus their average.
    Uses the client's personal model (``own_*``: Ditto's personal models, local-only training,
    MH-pFLID's clients) where it has one, else the main server model (``main_own_*``); the
    ``model`` column says which. Runs that fine-tuned the final global model
    (``evaluation.fine_tune_epochs``, ``ft_own_*``) add a ``fine-tuned`` row beside it."""
    if client_eval.empty:
        return pd.DataFrame()
    frame = client_eval.copy()
    main, own = f"main_own_{metric}", f"own_{metric}"
    personal = frame[own] if own in frame else pd.Series(float("nan"), index=frame.index)
    frame["value"] = personal.fillna(frame[main]) if main in frame else personal
    frame["model"] = personal.notna().map({True: "personal", False: "server"})
    frame = frame[frame["round"] == frame.groupby("run")["round"].transform("max")]
    tuned = f"ft_own_{metric}"
    if tuned in frame and frame[tuned].notna().any():
        fine_tuned = frame.dropna(subset=[tuned]).assign(value=lambda f: f[tuned],
                                                         model="fine-tuned")
        frame = pd.concat([frame, fine_tuned], ignore_index=True)
    keys = [*_KEYS, "model"]
    table = frame.pivot_table(index=keys, columns="client", values="value", aggfunc="mean")
    names = (frame.dropna(subset=["architecture"]).groupby("client")["architecture"]
             .agg(lambda a: "/".join(dict.fromkeys(a))) if "architecture" in frame else {})
    table.columns = [f"client {c}" + (f" {names[c]}" if c in names else "")
                     for c in table.columns]
    table["average"] = table.mean(axis=1)
    return table.reset_index()


def communication_table(communication: pd.DataFrame) -> pd.DataFrame:
    """MB per round by direction and message type (mean over rounds and seeds), one row per
    experiment and algorithm (the FedVCK paper's Table 5 shape), with the upload total."""
    if communication.empty:
        return pd.DataFrame()
    per_round = communication.groupby([*_KEYS, "run", "round", "direction", "message_type"])[
        "bytes"].sum().reset_index()
    per_round["column"] = per_round["direction"] + " " + per_round["message_type"]
    wide = per_round.pivot_table(index=[*_KEYS, "run", "round"], columns="column",
                                 values="bytes", aggfunc="sum", fill_value=0)
    uploads = [c for c in wide.columns if c.startswith("up ")]
    wide["up total"] = wide[uploads].sum(axis=1) if uploads else 0
    table = wide.groupby(_KEYS).mean() / 1e6
    table.columns = [f"{c} MB" for c in table.columns]
    return table.reset_index()


def privacy_table(clients: pd.DataFrame) -> pd.DataFrame:
    """The membership-inference audit (FedVCK's Table 6): per experiment and algorithm, the
    max and mean over clients of the attack AUC and the share of clients at AUC <= 0.5
    (total defence), each a mean ± std over seeds."""
    if clients.empty or "mia_auc" not in clients or clients["mia_auc"].isna().all():
        return pd.DataFrame()
    audited = clients.dropna(subset=["mia_auc"])
    per_run = audited.groupby([*_KEYS, "run"])["mia_auc"].agg(
        max_auc="max", mean_auc="mean", defense_rate=lambda a: float((a <= 0.5).mean()))
    grouped = per_run.groupby(_KEYS)
    table = grouped.agg(["mean", "std"])
    table.columns = [f"{metric}_{stat}" for metric, stat in table.columns]
    table.insert(0, "seeds", grouped.size())
    return table.reset_index()


def guarantee_table(rounds: pd.DataFrame) -> pd.DataFrame:
    """The formal DP guarantee of every experiment and algorithm run with ``privacy:``: epsilon
    after its last round (at delta, with the accountant named), the rounds, the clip and the
    noise multiplier (equal over seeds: the budget does not depend on the data)."""
    if "epsilon" not in rounds or rounds["epsilon"].isna().all():
        return pd.DataFrame()
    private = rounds.dropna(subset=["epsilon"])
    last = private.loc[private.groupby([*_KEYS, "run"])["round"].idxmax()]
    last = last.assign(rounds=last["round"] + 1)
    columns = ["epsilon", "dp_delta", "dp_accountant", "dp_mode", "rounds", "dp_clip",
               "dp_noise_multiplier"]
    return last.groupby(_KEYS)[columns].first().reset_index().rename(
        columns={"dp_delta": "delta", "dp_accountant": "accountant", "dp_mode": "mode",
                 "dp_clip": "clip", "dp_noise_multiplier": "noise_multiplier"})


def _write_csv(table: pd.DataFrame, file: Path) -> None:
    table.to_csv(file, index=False)


class PlotNotWritten(ResultsNotWritable):
    """The report's tables were made but its learning curves could not be written; ``text``
    holds the tables (the command prints them before the error)."""

    def __init__(self, message: str, text: str):
        super().__init__(message)
        self.text = text


def plot_location(paths: list[str | Path], output: str | Path | None,
                  csv_dir: str | Path | None, metric: str) -> tuple[Path, str]:
    """Where :func:`report` writes its learning curves, and the file's stem: ``output`` when
    given, else the ``csv_dir`` (the user chose where this report's files go), else the one
    results path as ``learning_curves_<metric>``; for several paths the first one, under a
    name of its own for that set of paths (``learning_curves_<metric>_with_<digest>``), so a
    comparison never replaces a run's own plot."""
    stem = f"learning_curves_{metric}"
    if output is not None or csv_dir is not None:
        return Path(output if output is not None else csv_dir), stem  # type: ignore[arg-type]
    if len(paths) == 1:
        return Path(paths[0]), stem
    import hashlib

    named = "\n".join(sorted(str(Path(path).resolve()) for path in paths))
    return Path(paths[0]), f"{stem}_with_{hashlib.sha256(named.encode()).hexdigest()[:8]}"


def check_metrics(rounds: pd.DataFrame, names: list[str]) -> None:
    """Refuse, with one paragraph listing what the runs recorded, a metric their ``rounds``
    tables do not hold (``--metric``, ``--metrics``)."""
    missing = [name for name in names if name not in rounds.columns]
    if missing:
        recorded = sorted(c for c in rounds.columns if rounds[c].dtype.kind == "f"
                          and rounds[c].notna().any())
        raise RaysimError(
            f"Unknown metric {missing[0]!r} (--metric or --metrics): these runs' rounds tables "
            f"hold no such column. Recorded metrics: {', '.join(recorded)}. Pass one of them, "
            "e.g. `--metric accuracy`.")


def report(paths: str | Path | list[str | Path], metric: str = "accuracy",
           output: str | Path | None = None, metrics: list[str] | None = None,
           selection: str | None = None, per_client: bool = False,
           privacy: bool = False, communication: bool = False,
           csv_dir: str | Path | None = None, checkpoint: str = "last",
           select_by: str = "val_accuracy", time: bool = False,
           time_target: float | None = None, window: int = 1) -> tuple[str, Path | None]:
    """The summary text of every run under ``paths`` (``metrics``: the columns to summarise,
    default the usual ones; ``selection``: also the route frequencies of that routing model,
    e.g. "main"; ``per_client``: also each client's accuracy and macro-F1 on its own test
    share; ``privacy``: also the membership-inference audit; ``communication``: MB per round
    by message type) and the
    learning-curve PNG, written where :func:`plot_location` says. ``csv_dir``: also write
    every table shown as CSV there (summary.csv, per_client_<metric>.csv, communication.csv,
    privacy.csv, selection.csv) and per_seed.csv (each run's row of the summarised metrics,
    with its seed and chosen round), the form committed under docs/results/. ``checkpoint``:
    "last" (each run's last evaluated round) or "best" (its round of highest ``select_by``,
    a validation metric); ``window``: with "last", each metric averaged over the run's last
    ``window`` evaluations."""
    if window < 1:
        raise RaysimError(f"Invalid --window {window}: the number of last evaluated rounds "
                          "each metric is averaged over, at least 1 (1: the last round only).")
    paths = [paths] if isinstance(paths, str | Path) else list(paths)
    rounds = pd.concat([load(path, "rounds") for path in paths], ignore_index=True)
    if rounds.empty or rounds["accuracy"].isna().all():
        return "No evaluated rounds yet.", None
    check_metrics(rounds, [metric, *(metrics or [])])
    tables: dict[str, pd.DataFrame] = {"summary": summary_table(rounds, metrics, checkpoint,
                                                                select_by, window)}
    text = format_summary(tables["summary"])
    if checkpoint == "best":
        text = (f"each run at its round of best {select_by} (the best validation checkpoint); "
                "rounds: the latest round chosen\n" + text)
    if window > 1:
        text = (f"each metric the mean over each run's last {window} evaluated rounds\n"
                + text)
    if time:
        clock = tables["time"] = time_table(rounds, metric, time_target)
        tables["participation"] = participation_table(pd.concat(
            [load(path, "system") for path in paths], ignore_index=True))
        text += ("\n\nsimulated clock (mean ± std over seeds): seconds of the run, final "
                 f"{metric}, share of selected clients dropped"
                 + (f", seconds and rounds until {metric} >= {time_target:g} (reached: "
                    "seeds)" if time_target is not None else "") + "\n"
                 + clock.round(4).to_string(index=False))
    if per_client:
        client_eval = pd.concat([load(path, "client_eval") for path in paths], ignore_index=True)
        segmentation = any(column.endswith("dice") for column in client_eval.columns)
        for name in ("dice", "iou") if segmentation else ("accuracy", "macro_f1"):
            clients = tables[f"per_client_{name}"] = client_table(client_eval, name)
            text += (f"\n\n{name} on each client's own test share (last evaluated round, mean "
                     "over seeds; model: the client's personal model, or the server's where "
                     "it has none)\n" + (clients.round(4).to_string(index=False)
                                        if not clients.empty
                                        else "no per-client evaluations recorded"))
    if communication:
        volume = tables["communication"] = communication_table(pd.concat(
            [load(path, "communication") for path in paths], ignore_index=True))
        text += ("\n\ncommunication per round in MB (mean over rounds and seeds; down: payload x "
                 "receivers)\n" + (volume.round(4).to_string(index=False) if not volume.empty
                                    else "no communication recorded"))
    if privacy:
        audit = privacy_table(pd.concat([load(path, "clients") for path in paths],
                                        ignore_index=True))
        guarantee = guarantee_table(rounds)
        tables["privacy"] = (audit if guarantee.empty else guarantee if audit.empty
                             else guarantee.merge(audit, on=_KEYS, how="outer"))
        if not guarantee.empty:
            text += ("\n\ndifferential privacy (client level): epsilon after the last round at "
                     "delta, the accountant, rounds, clip, noise multiplier\n"
                     + guarantee.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        text += ("\n\nmembership-inference audit of the last round's uploads (AUC per client; "
                 "defense_rate: share of clients at AUC <= 0.5)\n"
                 + (audit.round(3).to_string(index=False) if not audit.empty
                    else "no audit recorded (set evaluation.membership_audit)"))
    if selection is not None:
        routes = tables["selection"] = selection_table(pd.concat([load(path, "selection") for path in paths],
                                           ignore_index=True), selection)
        text += ("\n\nselection frequencies (" + selection + "; source_client -1: unseen "
                 "client)\n" + (routes.round(3).to_string(index=False) if not routes.empty
                                 else "no routes recorded"))
    # every table computed (a bad request has failed by now): the files are written last
    recovery = ("run the same `raysim report` again (or give --output DIR for the plots and "
                "--csv DIR for the tables somewhere writable).")
    if csv_dir is not None:  # with every run's own row, for paired per-seed comparisons
        summarised = [c[:-len("_mean")] for c in tables["summary"].columns if c.endswith("_mean")]
        final = final_metrics(rounds, checkpoint, select_by, window)
        tables["per_seed"] = final[[*_KEYS, "seed", "round", *summarised]]
        for name, table in tables.items():
            write_atomically(Path(csv_dir) / f"{name}.csv", partial(_write_csv, table), recovery)
        text += f"\n\ntables as CSV: {csv_dir}"
    target, stem = plot_location(paths, output, csv_dir, metric)
    try:
        png = plot_learning_curves(rounds, target / f"{stem}.png", metric, recovery=recovery)
        if time:
            plot_learning_curves(rounds, target / f"{stem}_hours.png", metric, "sim_hours",
                                 recovery)
    except ResultsNotWritable as error:
        raise PlotNotWritten(str(error), text) from None
    return text, png
