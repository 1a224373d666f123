"""FedDC in raysim and in its authors' code, side by side on one common setting.

    python experiments/fidelity/side_by_side.py --authors PATH --data-root DIR
    python experiments/fidelity/side_by_side.py --authors PATH --data-root DIR --mode lockstep

``PATH`` is the root of a checkout of https://github.com/kampmichael/FedDC (it is not part of
raysim); ``DIR`` holds ``pneumoniamnist.npz``. The common setting is
``experiments/fidelity/feddc_pneumonia.yaml``: its variants (FedDC, FedAvg b=1, FedAvg b=10)
run in raysim (one invocation, every seed) and in an edited copy of the authors' script
(:mod:`authors_feddc` lists every edit: CPU, the common data and model, and the lockstep hooks)
once per seed, each seed the authors' ``--seed``.

Modes:

- ``independent``: each code follows its own protocol and random streams (the authors: one
  initialisation per client, their split and shuffles); the final test accuracy and loss after
  the same number of steps are compared per variant over the seeds with Welch's t and an
  equivalence test (TOST, ``--margin``).
- ``shared-init``: as ``independent``, but every client of the authors' script starts from
  raysim's initial model of the seed (their loop draws one initialisation per client and
  averages them at the first aggregation), isolating that one protocol difference.
- ``lockstep``: the authors' script is fed raysim's initial model, split and permutations of
  the same seed, and both are scored after every aggregation; the per-round differences of
  accuracy and loss show where (if anywhere) the two codes part.

Writes under ``--out``: ``trajectories.csv`` (source, variant, seed, round, accuracy, loss),
``per_seed.csv`` (the final round), ``summary.csv`` (mean and std per ``<source>_<variant>``, the
format ``render_docs.py`` reads) and ``comparison.csv`` (independent, shared-init) or
``lockstep.csv`` and ``lockstep_summary.csv``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]

from authors_feddc import prepare_copy  # noqa: E402
from render_docs import equivalence_test, welch_test  # noqa: E402

CONFIG = HERE / "feddc_pneumonia.yaml"
REPORT_EVERY = {"independent": 50, "shared-init": 50, "lockstep": 10}


def authors_arguments(config: Any, seed: int, report_every: int) -> list[str]:
    """The authors' command-line flags for one raysim variant: a period raysim leaves unset
    (no daisy-chaining, no aggregation) becomes one longer than the run, as the authors'
    ``runExp.sh`` writes 20001 for 10,000 rounds."""
    rounds = config.training.rounds
    never = str(rounds + 1)
    algorithm = config.algorithm
    return ["--seed", str(seed), "--workers", "1",
            "--num-clients", str(config.partition.num_clients),
            "--num-samples-per-client", str(config.partition.samples_per_client),
            "--train-batch-size", str(config.training.batch_size),
            "--optimizer", "SGD", "--lr", str(config.training.optimizer.lr),
            "--num-rounds", str(rounds), "--report-rounds", str(report_every),
            "--daisy-rounds", str(algorithm.daisy_period or never),
            "--aggregate-rounds", str(algorithm.aggregation_period or never)]


def run_authors(script: Path, config_path: Path, config: Any, variant: str, seed: int,
                args: argparse.Namespace) -> pd.DataFrame:
    """One seed of one variant in the edited authors' script; its per-report test accuracy
    and loss, averaged over the clients (the pickles' per-client values, not the script's
    printed running mean)."""
    every = REPORT_EVERY[args.mode]
    workdir = args.out / "authors" / variant / f"seed_{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([str(script.parent), str(REPOSITORY),
                                                  os.environ.get("PYTHONPATH", "")]),
                   "FIDELITY_CONFIG": str(config_path), "FIDELITY_VARIANT": variant,
                   "FIDELITY_DATA_ROOT": str(args.data_root), "FIDELITY_SEED": str(seed),
                   "FIDELITY_MODE": args.mode,
                   "OMP_NUM_THREADS": "1"}
    log = workdir / "log.txt"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, str(script), *authors_arguments(config, seed, every)],
                              cwd=workdir, env=environment, stdout=out, stderr=subprocess.STDOUT,
                              timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the authors' script failed for {variant} seed {seed} "
                         f"(exit {done.returncode}); see {log}")
    (results,) = [p for p in workdir.iterdir() if p.is_dir() and p.name.startswith("FedDC_")]
    accuracy = np.asarray(pickle.loads((results / "testACCs.pck").read_bytes()), dtype=float)
    loss = np.asarray(pickle.loads((results / "testLosses.pck").read_bytes()), dtype=float)
    rounds = np.arange(accuracy.shape[1]) * every
    return pd.DataFrame({"source": "authors", "variant": variant, "seed": seed, "round": rounds,
                         "accuracy": accuracy.mean(axis=0), "loss": loss.mean(axis=0)})


def run_raysim(variants: list[str], seeds: list[int], args: argparse.Namespace) -> pd.DataFrame:
    """Every variant and seed in one raysim invocation; the rounds the authors report."""
    import raysim

    results = raysim.run(args.config, variants=variants, data_root=str(args.data_root),
                         output=str(args.out / "raysim"),
                         overrides=[f"seeds=[{', '.join(map(str, seeds))}]"])
    if results is None or results.failed:
        raise SystemExit("raysim's runs failed; see the run root under --out/raysim")
    rounds = results.table("rounds")
    every = REPORT_EVERY[args.mode]
    rounds = rounds[rounds["round"] % every == 0]
    return pd.DataFrame({"source": "raysim", "variant": rounds["experiment"],
                         "seed": rounds["seed"], "round": rounds["round"],
                         "accuracy": rounds["accuracy"], "loss": rounds["loss"]})


def summarise(final: pd.DataFrame) -> pd.DataFrame:
    """Mean and std (ddof 1) over seeds per ``<source>_<variant>``."""
    grouped = final.groupby(["source", "variant"])
    summary = grouped.agg(seeds=("seed", "nunique"), accuracy_mean=("accuracy", "mean"),
                          accuracy_std=("accuracy", "std"), loss_mean=("loss", "mean"),
                          loss_std=("loss", "std")).reset_index()
    summary.insert(0, "experiment", summary["source"] + "_" + summary["variant"])
    return summary.drop(columns=["source"])


def compare(summary: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Per variant and metric: raysim minus the authors, Welch's t and p, the TOST p."""
    rows = []
    indexed = summary.set_index("experiment")
    for variant in sorted(summary["variant"].unique()):
        ours, theirs = indexed.loc[f"raysim_{variant}"], indexed.loc[f"authors_{variant}"]
        for metric in ("accuracy", "loss"):
            groups = [(float(row[f"{metric}_mean"]), float(row[f"{metric}_std"]),
                       int(row["seeds"])) for row in (ours, theirs)]
            test = welch_test(*groups[0], *groups[1])
            rows.append({"variant": variant, "metric": metric,
                         "raysim": groups[0][0], "authors": groups[1][0],
                         "difference": groups[0][0] - groups[1][0], "welch_t": test.t,
                         "df": test.df, "p": test.p, "margin": margin if metric == "accuracy"
                         else np.nan,
                         "tost_p": (equivalence_test(*groups[0], *groups[1], margin)
                                    if metric == "accuracy" else np.nan)})
    return pd.DataFrame(rows)


def lockstep_table(trajectories: pd.DataFrame) -> pd.DataFrame:
    """Per variant and round: the largest |raysim - authors| over the seeds."""
    paired = trajectories.pivot_table(index=["variant", "seed", "round"], columns="source",
                                      values=["accuracy", "loss"]).dropna()
    gaps = pd.DataFrame({
        "accuracy_gap": (paired["accuracy"]["raysim"] - paired["accuracy"]["authors"]).abs(),
        "loss_gap": (paired["loss"]["raysim"] - paired["loss"]["authors"]).abs()})
    return gaps.groupby(["variant", "round"]).max().reset_index()


def lockstep_summary(gaps: pd.DataFrame, apart: float = 0.005) -> pd.DataFrame:
    """Per variant: the evaluations compared, the largest accuracy and loss gaps over them,
    and the first round whose accuracy gap exceeds ``apart`` (-1: none)."""
    rows = []
    for variant, table in gaps.groupby("variant"):
        beyond = table.loc[table["accuracy_gap"] > apart, "round"]
        rows.append({"variant": variant, "evaluations": len(table),
                     "max_accuracy_gap": table["accuracy_gap"].max(),
                     "max_loss_gap": table["loss_gap"].max(),
                     "first_round_apart": int(beyond.min()) if len(beyond) else -1})
    return pd.DataFrame(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=Path, required=True,
                        help="root of a checkout of kampmichael/FedDC")
    parser.add_argument("--data-root", type=Path, required=True,
                        help="directory holding pneumoniamnist.npz")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--variant", action="append", default=None,
                        help="a variant of the config (repeat; default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default: the config's seeds")
    parser.add_argument("--mode", choices=sorted(REPORT_EVERY), default="independent")
    parser.add_argument("--margin", type=float, default=0.03,
                        help="equivalence margin of the final accuracy (default 0.03)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="authors' runs at once (one CPU thread each)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds one authors' run may take")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "results" / "fidelity")
    args = parser.parse_args()
    args.config, args.data_root = args.config.resolve(), args.data_root.resolve()
    args.out = (args.out / args.mode).resolve()

    from raysim.configuration.experiment import load_experiments

    experiments = load_experiments(args.config)
    variants = args.variant or list(experiments)
    seeds = args.seeds or list(experiments[variants[0]].seeds)
    script = prepare_copy(args.authors.resolve(), args.out / "authors_code")
    print(f"authors' script (edited copy): {script}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        authors = [pool.submit(run_authors, script, args.config, experiments[variant],
                               variant, seed, args)
                   for variant in variants for seed in seeds]
        ours = run_raysim(variants, seeds, args)
        theirs = [future.result() for future in authors]
    trajectories = pd.concat([ours, *theirs], ignore_index=True)
    trajectories = trajectories.sort_values(["variant", "source", "seed", "round"])
    trajectories.to_csv(args.out / "trajectories.csv", index=False)
    last = trajectories.groupby(["source", "variant", "seed"])["round"].transform("max")
    final = trajectories[trajectories["round"] == last]
    final.to_csv(args.out / "per_seed.csv", index=False)
    summary = summarise(final)
    summary.to_csv(args.out / "summary.csv", index=False)
    if args.mode != "lockstep":
        table = compare(summary, args.margin)
        table.to_csv(args.out / "comparison.csv", index=False)
    else:
        table = lockstep_table(trajectories)
        table.to_csv(args.out / "lockstep.csv", index=False)
        lockstep_summary(table).to_csv(args.out / "lockstep_summary.csv", index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(summary.to_string(index=False))
        print(table.to_string(index=False))
    print(f"written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
