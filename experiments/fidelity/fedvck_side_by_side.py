"""FedVCK in raysim and in its authors' code, side by side on one common setting.

    python experiments/fidelity/fedvck_side_by_side.py --authors PATH --data-root DIR

``PATH`` is the root of a checkout of https://github.com/Youth-49/FedVCK_2024 (it is not part of
raysim); ``DIR`` holds ``pneumoniamnist.npz``. The common setting is
``experiments/fidelity/fedvck_pneumonia.yaml``: it runs in raysim (one invocation, every
seed) and in an edited copy of the authors' code (:mod:`authors_fedvck` lists every edit: the
common data at 28 px, raysim's partition of the seed, the ConvNet width, CPU) once per seed,
each seed the authors' ``--seed``; their flags are derived from the config
(:func:`authors_arguments`).

Both codes follow their own random streams (the synthetic images' noise start, the selection's
draws, the augmentation, the server's batches; the authors' condensation also starts round 0
from a fresh model of its own rather than the server's). So the comparison is of outcomes: the
test accuracy and loss after each round, and after the last one per seed, compared with
Welch's t and an equivalence test (TOST, ``--margin``).

Writes under ``--out``: ``trajectories.csv`` (source, variant, seed, round, accuracy, loss),
``per_seed.csv`` (the last round), ``summary.csv`` (mean and std per ``<source>_<variant>``,
the format ``render_docs.py`` reads), ``by_round.csv`` (the same for every round) and
``comparison.csv``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]

from authors_fedvck import prepare_copy  # noqa: E402
from side_by_side import compare, summarise  # noqa: E402

CONFIG = HERE / "fedvck_pneumonia.yaml"
EVALUATION = re.compile(r"^round (\d+) evaluation: test acc is ([0-9.]+), "
                        r"test loss = ([0-9.eE+-]+)$", re.MULTILINE)
"""The authors' log line after a round's server training (also printed before it; the last
one of a round is after)."""


def authors_arguments(config: Any, seed: int) -> list[str]:
    """The authors' command-line flags for raysim's FedVCK config: their loops run one
    condensation step and one server epoch more than the flag (``range(n + 1)``), their
    selection mixes the models as (1 - lamda) current + lamda previous, and their top-k
    relation classes include the class itself."""
    fedvck, partition = config.algorithm, config.partition
    classes = 2 if config.dataset.name == "pneumoniamnist" else None
    hard = fedvck.hard_negatives or (min(5, classes - 1) if classes else 5)
    return ["--seed", str(seed), "--device", "cpu", "--dataset", "PneumoniaMNIST224",
            "--client_num", str(partition.num_clients), "--partition", "dirichlet",
            "--alpha", str(partition.beta), "--model", "ConvNetBN",
            "--communication_rounds", str(config.training.rounds), "--join_ratio", "1.0",
            "--lr_server", str(fedvck.server_lr), "--momentum_server",
            str(fedvck.server_momentum), "--weight_decay_server", str(fedvck.server_weight_decay),
            "--batch_size", str(fedvck.server_batch_size),
            "--model_epochs", str(fedvck.server_epochs - 1),
            "--compression_ratio", str(fedvck.percent / 100),
            "--dc_iterations", str(fedvck.iterations - 1),
            "--dc_batch_size", str(fedvck.real_per_class), "--image_lr", str(fedvck.image_lr),
            "--image_momentum", str(fedvck.momentum), "--init", "random_noise",
            "--clip_norm", "10", "--weighted_mmd", "--kernel", fedvck.kernel,
            "--lamda", str(1 - fedvck.alpha), "--gamma", str(fedvck.gamma),
            "--b", str(fedvck.offset), "--contrastive_way", "supcon_asym_syn",
            "--con_beta", str(fedvck.beta), "--con_temp", str(fedvck.tau),
            "--topk", str(hard + 1), "--lr_head", str(fedvck.projector_lr),
            "--eval_gap", "1", "--tag", f"fidelity-seed{seed}"]


def read_log(log: str) -> pd.DataFrame:
    """Each round's test accuracy and loss from the authors' log (the last line of a round)."""
    rows: dict[int, tuple[float, float]] = {}
    for match in EVALUATION.finditer(log):
        rows[int(match.group(1))] = (float(match.group(2)), float(match.group(3)))
    return pd.DataFrame([{"round": r, "accuracy": a, "loss": loss}
                         for r, (a, loss) in sorted(rows.items())])


def run_authors(script: Path, config: Any, variant: str, seed: int,
                args: argparse.Namespace) -> pd.DataFrame:
    """One seed in the edited authors' code; its per-round test accuracy and loss."""
    workdir = args.out / "authors" / variant / f"seed_{seed}"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    environment = {**os.environ,
                   "PYTHONPATH": os.pathsep.join([str(script.parent), str(REPOSITORY),
                                                  os.environ.get("PYTHONPATH", "")]),
                   "FIDELITY_CONFIG": str(args.config), "FIDELITY_VARIANT": variant,
                   "FIDELITY_DATA_ROOT": str(args.data_root), "FIDELITY_SEED": str(seed),
                   "OMP_NUM_THREADS": "1"}
    log = workdir / "log.txt"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, str(script), *authors_arguments(config, seed)],
                              cwd=workdir, env=environment, stdout=out, stderr=subprocess.STDOUT,
                              timeout=args.timeout, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the authors' code failed for seed {seed} (exit {done.returncode}); "
                         f"see {log}")
    table = read_log(log.read_text())
    if len(table) != config.training.rounds:
        raise SystemExit(f"the authors' log for seed {seed} has {len(table)} evaluated rounds, "
                         f"expected {config.training.rounds}; see {log}")
    return table.assign(source="authors", variant=variant, seed=seed)


def run_raysim(variants: list[str], seeds: list[int], args: argparse.Namespace) -> pd.DataFrame:
    """Every variant and seed in one raysim invocation, every round."""
    import raysim

    results = raysim.run(args.config, variants=variants, data_root=str(args.data_root),
                         output=str(args.out / "raysim"),
                         overrides=[f"seeds=[{', '.join(map(str, seeds))}]"])
    if results is None or results.failed:
        raise SystemExit("raysim's runs failed; see the run root under --out/raysim")
    rounds = results.table("rounds")
    return pd.DataFrame({"source": "raysim", "variant": rounds["experiment"],
                         "seed": rounds["seed"], "round": rounds["round"],
                         "accuracy": rounds["accuracy"], "loss": rounds["loss"]})


def summarise_rounds(trajectories: pd.DataFrame) -> pd.DataFrame:
    """:func:`summarise` of every round (a ``round`` column beside it)."""
    return pd.concat([summarise(frame).assign(round=round_)
                      for round_, frame in trajectories.groupby("round")], ignore_index=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors", type=Path, required=True,
                        help="root of a checkout of Youth-49/FedVCK_2024")
    parser.add_argument("--data-root", type=Path, required=True,
                        help="directory holding pneumoniamnist.npz")
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default: the config's seeds")
    parser.add_argument("--margin", type=float, default=0.03,
                        help="equivalence margin of the final accuracy (default 0.03)")
    parser.add_argument("--jobs", type=int, default=2,
                        help="authors' runs at once (one CPU thread each)")
    parser.add_argument("--timeout", type=float, default=7200,
                        help="seconds one authors' run may take")
    parser.add_argument("--out", type=Path,
                        default=REPOSITORY / "results" / "fidelity" / "fedvck")
    args = parser.parse_args()
    args.config, args.data_root = args.config.resolve(), args.data_root.resolve()
    args.out = args.out.resolve()

    from raysim.configuration.experiment import load_experiments

    experiments = load_experiments(args.config)
    variants = list(experiments)
    seeds = args.seeds or list(experiments[variants[0]].seeds)
    shutil.rmtree(args.out / "authors_code", ignore_errors=True)
    script = prepare_copy(args.authors.resolve(), args.out / "authors_code")
    print(f"authors' code (edited copy): {script}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        authors = [pool.submit(run_authors, script, experiments[variant], variant, seed, args)
                   for variant in variants for seed in seeds]
        ours = run_raysim(variants, seeds, args)
        theirs = [future.result() for future in authors]
    trajectories = pd.concat([ours, *theirs], ignore_index=True)
    trajectories = trajectories[["source", "variant", "seed", "round", "accuracy", "loss"]]
    trajectories = trajectories.sort_values(["variant", "source", "seed", "round"])
    trajectories.to_csv(args.out / "trajectories.csv", index=False)
    last = trajectories.groupby(["source", "variant", "seed"])["round"].transform("max")
    final = trajectories[trajectories["round"] == last]
    final.to_csv(args.out / "per_seed.csv", index=False)
    summary = summarise(final)
    summary.to_csv(args.out / "summary.csv", index=False)
    summarise_rounds(trajectories).to_csv(args.out / "by_round.csv", index=False)
    table = compare(summary, args.margin)
    table.to_csv(args.out / "comparison.csv", index=False)
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(summary.to_string(index=False))
        print(table.to_string(index=False))
    print(f"written under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
