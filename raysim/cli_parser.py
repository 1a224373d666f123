"""The command line's parser: one function per command (``raysim run|sweep|cluster|validate|
costs|estimate|report``), with the argument types they share. Imports nothing heavy: ``raysim
--help`` answers at once."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn


def _directory(path: str) -> str:
    """An absolute path: the driver and workers of a run do not share the caller's working
    directory, so a relative ``--data-root`` is resolved where the user typed it. A path that
    exists and is not a folder is refused (argparse's one line, exit 2)."""
    resolved = Path(path).expanduser().absolute()
    if resolved.exists() and not resolved.is_dir():
        raise argparse.ArgumentTypeError(
            f"{path!r} is a file, not a folder: pass the folder that holds the data files "
            f"(e.g. --data-root {resolved.parent})")
    return str(resolved)


def _positive_int(text: str) -> int:
    """A count of at least 1 (argparse reports anything else in one line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count of at least 1 (e.g. 4)")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raysim")
    except PackageNotFoundError:  # run from a source tree without installing
        return "unknown (not installed)"


HINTS = {"--seed": "the seeds are a config field: use --set 'seeds=[3]' (a sweep also takes "
                     "--seeds 0,1,2)",
         "--rounds": "the rounds are a config field: use --set training.rounds=5",
         "--algorithm": "the method is a config field: use --set algorithm.name=fedprox"}
"""Options a newcomer types that raysim does not have, and what to write instead."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose refusal of an unknown option says what to write instead."""

    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments" in message:
            given = message.split(":", 1)[-1].split()
            hints = [HINTS[option.split("=")[0]] for option in given
                     if option.split("=")[0] in HINTS]
            if hints:
                message += " (" + "; ".join(hints) + ")"
        super().error(message)


def _run(commands: Any) -> argparse.ArgumentParser:
    """``raysim run CONFIG``: an experiment, every seed concurrently."""
    run = commands.add_parser("run", help="run an experiment (every seed, concurrently)")
    run.add_argument("config", help="experiment YAML file")
    run.add_argument("--set", dest="overrides", action="append", default=[],
                     metavar="KEY=VALUE", help="override a config field, e.g. training.rounds=5")
    run.add_argument("--output", help="parent directory of the results (default: config output)")
    run.add_argument("--data-root", type=_directory,
                     help="directory holding the MedMNIST npz files")
    run.add_argument("--variant", dest="variants", action="append", default=[],
                     metavar="LABEL", help="run only this variant of the config (repeatable)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    run.add_argument("--resume", nargs="?", const="latest", metavar="RUN_ROOT",
                     help="continue an interrupted invocation from its checkpoints (default: "
                     "the latest <output>/<name>-<timestamp>); completed runs are kept")
    return run


def _sweep(commands: Any) -> argparse.ArgumentParser:
    """``raysim sweep CONFIG --grid KEY=V1,V2``: every combination of a grid."""
    sweep = commands.add_parser("sweep", help="run every combination of a grid of config "
                                "values and seeds, concurrently")
    sweep.add_argument("config", help="experiment YAML file")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                       help="a config key and its values (repeatable; all combinations run)")
    sweep.add_argument("--seeds", help="comma-separated seeds of every grid point (default: "
                       "the config's)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a config field for every point")
    sweep.add_argument("--output", help="parent directory of the results")
    sweep.add_argument("--data-root", type=_directory,
                     help="directory holding the MedMNIST npz files")
    sweep.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    sweep.add_argument("--resume", nargs="?", const="latest", metavar="SWEEP_ROOT",
                       help="continue an interrupted sweep (default: the latest one)")
    return sweep


def _cluster(commands: Any) -> argparse.ArgumentParser:
    """``raysim cluster start|stop|status``: the warm local Ray."""
    cluster = commands.add_parser(
        "cluster", help="a warm local Ray that later `raysim run`/`sweep` invocations join, "
        "keeping their worker processes warm between invocations")
    cluster.add_argument("action", choices=("start", "stop", "status"),
                         help="start the warm cluster, stop it, or show whether it runs")
    cluster.add_argument("--cpus", type=int, help="CPUs of the cluster (start; default: every "
                         "CPU no other raysim invocation holds)")
    cluster.add_argument("--gpus", type=float, help="GPUs of the cluster (start; default: "
                         "Ray's detection)")
    return cluster


def _config_arguments(command: argparse.ArgumentParser, example: str) -> None:
    """CONFIG, ``--set KEY=VALUE`` (``example``: one override) and ``--data-root``."""
    command.add_argument("config", help="experiment YAML file")
    command.add_argument("--set", dest="overrides", action="append", default=[],
                         metavar="KEY=VALUE", help="override a config field, e.g. "
                         f"{example} (repeatable)")
    command.add_argument("--data-root", type=_directory,
                         help="directory holding the MedMNIST npz files")


def _validate(commands: Any) -> argparse.ArgumentParser:
    """``raysim validate CONFIG``: a config checked without running it."""
    validate = commands.add_parser("validate", help="check a config without running it (with "
                                   "its data when present: partitions and method settings too)")
    _config_arguments(validate, "training.rounds=5")
    return validate


def _costs(commands: Any) -> argparse.ArgumentParser:
    """``raysim costs CONFIG``: every model's parameters and FLOPs."""
    costs = commands.add_parser("costs", help="parameters and FLOPs of every client's model "
                                "and of shared models (e.g. MH-pFLID's messenger)")
    _config_arguments(costs, "clients.downsample=[1,2,4,8]")
    costs.add_argument("--csv", help="also write the tables to this CSV file (column "
                       "`experiment`: the variant)")
    return costs


def _estimate(commands: Any) -> argparse.ArgumentParser:
    """``raysim estimate CONFIG``: a whole config's cost from a few rounds."""
    estimate = commands.add_parser(
        "estimate", help="project the wall time and device-hours of a whole config (every "
        "seed and variant) from a few rounds run here")
    estimate.add_argument("config", help="experiment YAML file")
    estimate.add_argument("--rounds", type=int, default=3,
                          help="rounds to run of each variant's first seed (default 3)")
    estimate.add_argument("--set", dest="overrides", action="append", default=[],
                          metavar="KEY=VALUE", help="override a config field (repeatable)")
    estimate.add_argument("--variant", dest="variants", action="append", default=[],
                          metavar="LABEL", help="estimate only this variant (repeatable)")
    estimate.add_argument("--data-root", type=_directory,
                          help="directory holding the MedMNIST npz files")
    estimate.add_argument("--clients", type=int, metavar="K",
                          help="a slice: train K clients per round in the probe and scale its "
                          "rounds up to the config's clients per round (for configs whose full "
                          "rounds are too slow to probe here)")
    estimate.add_argument("--stand-in-data", action="store_true",
                          help="probe on generated files of the dataset's layout where its "
                          "files are not under the data root: a MedMNIST file, a polyp "
                          "centre's site folder, Sleep-EDF-20's recordings (timing only)")
    estimate.add_argument("--extrapolate", metavar="KEY=LOW,HIGH",
                          help="probe each variant with this numeric config key at LOW and at "
                          "HIGH and extend the line through the two to the config's own value "
                          "(e.g. algorithm.iterations=10,210, dataset.train_subset=40,400): for "
                          "rounds too long to probe as they are; put LOW and HIGH far enough "
                          "apart that the difference they make dwarfs a round's noise")
    estimate.add_argument("--csv", help="also write the estimate to this CSV file (one row per "
                          "variant; e.g. docs/results/estimates/<config>.csv)")
    estimate.add_argument("--nodes", type=_positive_int, nargs="+", metavar="N",
                          help="also project the config on clusters of N nodes (one or more "
                          "counts), from the probe's compute and counted bytes")
    estimate.add_argument("--gpus-per-node", type=float, nargs="+", default=[8.0], metavar="G",
                          help="GPUs per node of the projected cluster (one or more; default "
                          "8); a config whose workers take no GPU share gets one worker per "
                          "GPU")
    estimate.add_argument("--link-gbps", type=float, nargs="+", default=[10.0], metavar="B",
                          help="link rate between the projected cluster's nodes in Gb/s (one "
                          "or more; default 10)")
    estimate.add_argument("--cluster-csv", help="also write the cluster projection to this "
                          "CSV file (one row per variant and cluster shape)")
    return estimate


def _report(commands: Any) -> argparse.ArgumentParser:
    """``raysim report PATH...``: tables and curves of results."""
    report = commands.add_parser("report", help="summary table and learning curves of results")
    report.add_argument("paths", nargs="+", metavar="PATH",
                        help="results directories (runs, experiments or trees); several are "
                        "reported together")
    report.add_argument("--output", help="where to write the learning-curve PNG "
                        "(default: the first PATH)")
    report.add_argument("--metric", default="accuracy", help="metric of the learning curves")
    report.add_argument("--csv", metavar="DIR", help="also write every table shown as CSV "
                        "into DIR (summary.csv, privacy.csv, ...), e.g. docs/results/<name>")
    report.add_argument("--metrics", help="comma-separated metric columns of the summary table "
                        "(e.g. accuracy,gm_accuracy,g0.5_accuracy)")
    report.add_argument("--selection", nargs="?", const="main", metavar="MODEL",
                        help="also print the route frequencies of a routing model (FedSM's "
                        "super model: main, or a gamma sweep's g<gamma>_)")
    report.add_argument("--communication", action="store_true",
                        help="also print MB per round by direction and message type")
    report.add_argument("--privacy", action="store_true",
                        help="also print the membership-inference audit (max and mean AUC over "
                        "clients, share of clients at AUC <= 0.5)")
    report.add_argument("--per-client", action="store_true",
                        help="also print each client's accuracy and macro-F1 on its own test share")
    report.add_argument("--time", nargs="?", const=-1.0, type=float, metavar="TARGET",
                        help="also tabulate and plot the metric against simulated hours (runs "
                        "with `system:`), with the hours until it reaches TARGET if given")
    report.add_argument("--checkpoint", choices=("last", "best"), default="last",
                        help="report each run at its last evaluated round (default) or at its "
                        "best validation round (needs evaluation.validation)")
    report.add_argument("--window", type=int, default=1, metavar="K",
                        help="each metric the mean over each run's last K evaluated rounds "
                        "(runs with evaluation.final_rounds >= K): robust to a metric that "
                        "alternates from round to round")
    report.add_argument("--select-by", default="val_accuracy", metavar="METRIC",
                        help="the validation metric that picks the best round "
                        "(default val_accuracy; e.g. val_auc, gm_val_accuracy)")
    return report


def _plugin_option(command: argparse.ArgumentParser) -> None:
    """``--plugin MODULE`` (the commands that read a config)."""
    command.add_argument("--plugin", dest="plugins", action="append", default=[],
                         metavar="MODULE", help="import this module first: its registered "
                         "algorithms, models and datasets become config names (repeatable; "
                         "recorded with the runs)")


def parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    top = _Parser(
        prog="raysim", description="Simulate federated learning on medical images with Ray.")
    top.add_argument("--version", action="version", version=f"raysim {_version()}")
    commands = top.add_subparsers(dest="command", required=True)
    for command in (_run(commands), _sweep(commands)):
        _plugin_option(command)
    _cluster(commands)
    for command in (_validate(commands), _costs(commands), _estimate(commands)):
        _plugin_option(command)
    _report(commands)
    return top
