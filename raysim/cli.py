"""Command line: ``raysim run|sweep|cluster|validate|costs|estimate|report`` (the parser, one
function per command: :mod:`raysim.cli_parser`)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.cli_parser import parser as _parser
from raysim.engine.invocation import (
    latest_run_root,
    recorded_options,
    running_cluster,
    start_cluster,
    startup_phases,
    stop_cluster,
    use_cached_bytecode,
)
from raysim.errors import RaysimError

_IMPORTED_AT = time.time()  # the console script's start (its first import)
_STARTED_AT = _IMPORTED_AT  # the running command's start, for the start-up phases
@dataclass
class _Command:
    """What this command did so far."""

    runs_started: bool = False
    """Whether it got past start-up (Ray, data) to its runs."""


_COMMAND = _Command()


_REMEMBERED = {"run": ("variants", "overrides", "data_root", "plugins"),
               "sweep": ("grid", "seeds", "overrides", "data_root", "plugins")}


def _remember_invocation(args: argparse.Namespace) -> dict:
    """What ``--resume`` needs to continue exactly this invocation's runs."""
    return {"command": args.command, "config": os.path.abspath(args.config),
            **{name: getattr(args, name) for name in _REMEMBERED[args.command]},
            "output": args.output}


def _recall_invocation(args: argparse.Namespace, root: str) -> None:
    """Fill the options not given again from the run root's record of its first command
    (``--variant``, ``--set``, ``--data-root``; a sweep's ``--grid`` and ``--seeds``) and say
    which; never its plug-ins, cluster address or logging targets (:mod:`raysim.engine.recall`)."""
    from raysim.engine.recall import recall

    names = _REMEMBERED[args.command]
    recalled = recall(names, {name: getattr(args, name) for name in names},
                      recorded_options(root), root)
    for name, value in recalled.options.items():
        setattr(args, name, value)
    for line in recalled.lines(root):
        print(line, file=sys.stderr)


def _resume_root(args: argparse.Namespace) -> str | None:
    """The run root ``--resume`` names (the latest of this config for a bare ``--resume``)."""
    if args.resume != "latest":
        return args.resume
    from raysim.configuration.experiment import load_experiments

    first = next(iter(load_experiments(args.config, args.overrides, args.plugins).values()))
    return str(latest_run_root(first, args.output))


def _run(args: argparse.Namespace) -> int:
    from raysim.configuration.experiment import load_experiments

    given_variants = list(args.variants)
    if args.resume is not None:
        args.resume = _resume_root(args)
        if os.path.isdir(args.resume):
            _recall_invocation(args, args.resume)
    experiments = load_experiments(args.config, args.overrides, args.plugins)
    unknown = [label for label in args.variants if label not in experiments]
    if unknown and not given_variants:  # recalled from the root: another config's root
        started = recorded_options(str(args.resume)).get("config", "another config")
        raise RaysimError(
            f"Cannot resume {args.resume} with {args.config}: that root was started from "
            f"{started}, whose variant {unknown[0]!r} {args.config} does not define "
            f"({', '.join(label for label in experiments if label) or 'it has no variants'}). "
            f"Resume it with the config it was started with (`raysim run {started} --resume "
            f"{args.resume}`), or start a new run without --resume; nothing was written.")
    if unknown:
        raise RaysimError(
            f"Unknown variant {unknown[0]!r} for --variant: {args.config} defines "
            f"{', '.join(label for label in experiments if label) or 'no variants'}."
        )
    if args.variants:
        experiments = {label: experiments[label] for label in args.variants}
    return _execute(experiments, args)


def _sweep(args: argparse.Namespace) -> int:
    from raysim.configuration.sweep import parse_grid, parse_seeds, sweep_experiments

    if args.resume is not None and args.resume != "latest" and os.path.isdir(args.resume):
        _recall_invocation(args, args.resume)

    seeds = parse_seeds(args.seeds) if args.seeds else None
    experiments, labels = sweep_experiments(args.config, parse_grid(args.grid), seeds,
                                            args.overrides, args.plugins)
    print(f"sweep: {len(experiments)} configurations x "
          f"{len(next(iter(experiments.values())).seeds)} seeds", file=sys.stderr)
    return _execute(experiments, args, labels)


def headline_metric(experiments: dict, rounds: Any) -> str:
    """The metric the closing plot shows: the methods' headline (MH-pFLID: each client's own
    test share) when every experiment shares it and the runs recorded it, else accuracy."""
    from raysim.algorithms import ALGORITHMS

    chosen = {ALGORITHMS[config.algorithm.name].headline_metric
              for config in experiments.values() if config.algorithm.name in ALGORITHMS}
    metric = chosen.pop() if len(chosen) == 1 else "accuracy"
    return metric if metric in rounds and rounds[metric].notna().any() else "accuracy"


def busy_line(cpus: int | None = None) -> str | None:
    """A line when other processes keep this machine busy as the runs start (a load average
    over its CPUs): the runs are slower than on a quiet machine, never different."""
    from raysim.engine.launch.machine_load import busy_load

    cpus = cpus or os.cpu_count() or 1
    load = busy_load(cpus, share=1.0)
    if load is None:
        return None
    return (f"This machine is busy (load average {load:.1f} on {cpus} CPUs as the runs start): "
            "they share it, so they run slower than on a quiet machine (their numbers are the "
            "same).")


def config_warnings(experiments: dict) -> list[str]:
    """Settings that are valid but rarely what a user meant, one line each."""
    said = []
    for label, config in experiments.items():
        every, rounds = config.evaluation.every, config.training.rounds
        if every > rounds:
            named = f" (variant {label})" if label else ""
            said.append(f"warning{named}: training.rounds ({rounds}) is below evaluation.every "
                        f"({every}), so only the last round is evaluated and the learning "
                        f"curve has one point; lower it with --set evaluation.every={rounds}.")
    return list(dict.fromkeys(said))


def _execute(experiments: dict, args: argparse.Namespace, labels: dict | None = None) -> int:
    """Run (or resume) labelled experiments (:func:`raysim.engine.invocation.invoke`), then
    print the summary table and paths."""
    from raysim.engine.invocation import Invocation, invoke

    for line in config_warnings(experiments):
        print(line, file=sys.stderr)

    def runs_started() -> None:  # (start-up is over: bad input would have been said by now)
        _COMMAND.runs_started = True
        busy = busy_line()
        if busy:
            print(busy, file=sys.stderr)

    invoked = invoke(Invocation(experiments, args.data_root, args.output,
                                progress=not args.no_progress, resume=args.resume,
                                labels=labels, started_at=_STARTED_AT,
                                record=_remember_invocation(args)),
                     preload=_import_summary_modules,
                     closing=lambda outcomes, root, modules: _summarise(
                         outcomes, root, modules, experiments),
                     on_runs_started=runs_started)
    if invoked is None:  # a resumed root that was complete
        return 0
    outcomes, root, lines = invoked.outcomes, invoked.root, invoked.closing
    failed = [o for o in outcomes if o.error]
    for outcome in outcomes:
        reason = (outcome.final or {}).get("stop_reason")
        if not outcome.error and isinstance(reason, str):
            print(f"{outcome.run_dir.relative_to(root)}: {reason}", file=sys.stderr)
    for outcome in failed:
        print(f"seed {outcome.seed} failed: {outcome.error} (rows written so far are kept in "
              f"{outcome.run_dir})", file=sys.stderr)
    for line in lines:
        print(line)
    print(f"results (Parquet, read with raysim.results.load): {root}")
    codes = {outcome.exit_code for outcome in failed}
    return 0 if not codes else 2 if codes == {2} else 1  # 2: only bad input stopped runs


def _summarise(outcomes: list, root: Path, modules: tuple, experiments: dict) -> list[str]:
    """The closing lines, from the files the runs wrote (no Ray needed)."""
    from raysim.errors import ResultsNotWritable
    from raysim.results.manifest import read_manifest

    load, format_summary, report, summary_table = modules
    lines = []
    paths = {f"{w['training_path']} ({w['training_path_reason']})"
             for o in outcomes if not o.error
             for w in read_manifest(o.run_dir).get("workers", [])}
    lines += [f"local training path: {path}" for path in sorted(paths)]
    phases = [startup_phases(read_manifest(o.run_dir)) for o in outcomes if not o.error]
    first = min((p for p in phases if p), key=lambda p: p["first_round"], default=None)
    if first is not None:
        beside = (" (joined the warm cluster)" if first.get("joined") else
                  " (alongside imports and data)" if first["alongside"] else "")
        waited = (f"waited {first['cpu_wait']:.1f} s for CPUs another raysim invocation "
                  "held, " if first.get("cpu_wait", 0.0) >= 0.05 else "")
        compiled = (f", compiling the step {first['compile_step']:.1f} s"
                    if first.get("compile_step") else "")
        lines.append(f"start-up: {waited}imports {first['imports']:.1f} s, data "
                     f"{first['data']:.1f} s, Ray {first['ray']:.1f} s{beside}, workers "
                     f"{first['workers']:.1f} s{compiled}; first round dispatched "
                     f"{first['first_round']:.1f} s after the command")
    rounds = load(root, "rounds")
    if not rounds.empty and rounds["accuracy"].notna().any():
        window = min((config.evaluation.final_rounds if config.evaluation.every > 0 else 1)
                     for config in experiments.values())
        try:
            table = summary_table(rounds, window=window)
        except RaysimError:  # a run that ended before its final rounds: the last round each
            table, window = summary_table(rounds), 1
        if window > 1:  # a metric that alternates is reported over its last rounds
            lines.append(f"each metric the mean over each run's last {window} evaluated rounds "
                         "(evaluation.final_rounds; `raysim report --window 1`: the last)")
        lines.append(format_summary(table))
        try:
            curves = report(root, headline_metric(experiments, rounds))[1]
        except ResultsNotWritable as error:  # (the runs' results are complete)
            lines.append(f"learning curves not written: {error}")
        else:
            lines.append(f"learning curves: {curves}")
            _attach_curves(outcomes, experiments, curves)
    return lines


def _import_summary_modules() -> tuple:
    """What the closing summary uses (imports pandas, and matplotlib on the Agg backend)."""
    from raysim.results.load import load
    from raysim.results.report import format_summary, pyplot, report, summary_table

    pyplot()
    return load, format_summary, report, summary_table


def _validate(args: argparse.Namespace) -> int:
    from raysim.configuration.experiment import load_experiments
    from raysim.errors import MissingDataError
    from raysim.preparation import prepare

    for label, config in load_experiments(args.config, args.overrides, args.plugins).items():
        # partitions and the method's data-dependent settings (e.g. FedSM's lambda >= 1/K)
        # need the data: check them when the file is here, never download for a check
        offline = config.model_copy(update={"dataset": config.dataset.model_copy(
            update={"download": False})})
        try:
            prepare(offline, args.data_root)
            checked = "data, partitions and method settings checked"
        except MissingDataError as error:  # absent: skipped; present but broken: exit 2
            checked = f"data not checked: {str(error).split('. ')[0]}"
        print(f"{args.config}{' [' + label + ']' if label else ''}: valid "
              f"({config.algorithm.name} on {config.dataset.name}, "
              f"{config.partition.num_clients} clients, {config.training.rounds} rounds, "
              f"seeds {config.seeds}; {checked})")
    return 0


def _costs(args: argparse.Namespace) -> int:
    from raysim.algorithms import ALGORITHMS
    from raysim.configuration.experiment import load_experiments
    from raysim.preparation import prepare, run_context

    tables = []
    for label, config in load_experiments(args.config, args.overrides, args.plugins).items():
        seed = config.seeds[0]
        dataset, partition = prepare(config, args.data_root)[seed]
        algorithm_class = ALGORITHMS[config.algorithm.name]
        num_clients = 1 if algorithm_class.pooled else partition.num_clients
        algorithm = algorithm_class(config.algorithm, run_context(config, dataset, seed,
                                                                  num_clients))
        table = algorithm.cost_table()
        title = f"{args.config}{' [' + label + ']' if label else ''}"
        print(f"{title}: parameters and MFLOPs per forward pass of one sample (seed {seed})")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        tables.append(table.assign(experiment=label or config.name))
    if args.csv:
        import pandas as pd

        pd.concat(tables, ignore_index=True).to_csv(args.csv, index=False)
        print(f"tables as CSV: {args.csv}")
    return 0


def _cluster(args: argparse.Namespace) -> int:
    if args.action == "start":
        started = start_cluster(args.cpus, args.gpus)
        print(f"raysim cluster started at {started.address} with {started.cpus} CPUs (pid "
              f"{started.pid}, log {started.log}); `raysim run` and `raysim sweep` on this "
              "machine now join it. Stop it with `raysim cluster stop`.")
    elif args.action == "stop":
        stopped = stop_cluster()
        print("raysim cluster stopped" if stopped else "no raysim cluster was running")
    else:
        info = running_cluster()
        if info is None:
            print("no raysim cluster is running (`raysim cluster start` starts one)")
            return 1
        print(f"raysim cluster running at {info.address}: {info.cpus} CPUs, pid {info.pid}, up "
              f"{time.time() - info.started_at:.0f} s, log {info.log}")
    return 0


def _estimate(args: argparse.Namespace) -> int:
    from raysim.api import run_estimate
    from raysim.engine.interrupt import STOP
    from raysim.estimator.cluster_projection import ClusterShape

    if args.cluster_csv and not args.nodes:
        raise RaysimError("--cluster-csv writes the cluster projection, which needs --nodes N "
                          "(e.g. --nodes 1 4 16 --gpus-per-node 8 --link-gbps 10 100).")
    if any(value <= 0 for value in [*args.gpus_per_node, *args.link_gbps]):
        raise RaysimError(
            f"Invalid cluster: --gpus-per-node {' '.join(f'{g:g}' for g in args.gpus_per_node)} "
            f"and --link-gbps {' '.join(f'{r:g}' for r in args.link_gbps)} must be positive "
            "(e.g. --gpus-per-node 8 --link-gbps 10 100).")
    shapes = [ClusterShape(nodes, gpus, rate) for nodes in args.nodes or []
              for gpus in args.gpus_per_node for rate in args.link_gbps]
    projection = run_estimate(args.config, rounds=args.rounds, overrides=args.overrides,
                          variants=args.variants, data_root=args.data_root,
                          clients=args.clients, stand_in_data=args.stand_in_data,
                          plugins=args.plugins, cluster=shapes,
                          extrapolate=args.extrapolate)
    print(projection.text)
    if args.csv:
        projection.table.to_csv(args.csv, index=False)
        print(f"estimate as CSV: {args.csv}")
    if args.cluster_csv and projection.cluster is not None:
        projection.cluster.to_csv(args.cluster_csv, index=False)
        print(f"cluster projection as CSV: {args.cluster_csv}")
    return STOP.exit_code if projection.interrupted else 0  # 130 / 143: a partial projection


def _report(args: argparse.Namespace) -> int:
    from raysim.results.report import PlotNotWritten, report

    for path in args.paths:
        if not os.path.exists(path):
            raise RaysimError(f"Results path {path!r} does not exist. Pass a directory that "
                              "`raysim run` printed.")
    metrics = args.metrics.split(",") if args.metrics else None
    try:
        text, png = report(args.paths, args.metric, args.output, metrics, args.selection,
                           args.per_client, args.privacy, args.communication, args.csv,
                           args.checkpoint, args.select_by, time=args.time is not None,
                           time_target=args.time if args.time is not None and args.time >= 0
                           else None, window=args.window)
    except PlotNotWritten as error:  # the tables were made: print them before the error
        print(error.text)
        raise
    print(text)
    if png is not None:
        print(f"learning curves: {png}")
    return 0


def main(argv: Sequence[str] | None = None, started_at: float | None = None) -> int:
    """Entry point of the ``raysim`` console script; returns the exit code. ``started_at``:
    when the command started (the console script passes its import time; default: now)."""
    global _STARTED_AT
    _STARTED_AT = started_at or time.time()
    use_cached_bytecode()  # before torch is imported
    args = _parser().parse_args(argv)
    from raysim.engine.interrupt import STOP

    STOP.terminate_as_interrupt()
    handlers = {"run": _run, "sweep": _sweep, "validate": _validate, "costs": _costs,
                "report": _report, "cluster": _cluster, "estimate": _estimate}
    try:
        return handlers[args.command](args)
    except RaysimError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt as interrupt:
        from raysim.engine.interrupt import STOP

        root = getattr(interrupt, "root", None)
        if args.command not in ("run", "sweep"):
            print("interrupted", file=sys.stderr)
            return STOP.exit_code
        if root is None and not _COMMAND.runs_started:
            print(f"interrupted during start-up: no run had started, so this command wrote "
                  f"nothing (results of earlier commands are untouched); run `raysim "
                  f"{args.command} ...` again to start.", file=sys.stderr)
            return STOP.exit_code
        where = f" in {root}" if root else " in the results directory"
        again = (f"; continue exactly the interrupted work with `{_resume_command(args, root)}` "
                 f"(or `raysim {args.command} {args.config} --resume {root}`: the root "
                 "remembers the options)" if root and args.command in ("run", "sweep") else "")
        print(f"interrupted: every completed round is written{where} (runs marked "
              f"`interrupted` in their manifest.json, with a checkpoint of their last completed "
              f"round after a first Ctrl-C){again}.", file=sys.stderr)
        return STOP.exit_code


def _attach_curves(outcomes: list, experiments: dict, curves: str) -> None:
    """The learning-curve PNG as an artifact of every run's MLflow run (``logging.mlflow``)."""
    from pathlib import Path

    from raysim.results.live import log_artifact
    from raysim.results.manifest import read_manifest

    for outcome in outcomes:
        run_id = read_manifest(outcome.run_dir).get("mlflow_run_id")
        label = outcome.run_dir.parent.name if outcome.run_dir.parent.name in experiments else ""
        config = experiments.get(label) or next(iter(experiments.values()))
        if run_id and config.logging.mlflow:
            root = outcome.run_dir.parent.parent if label else outcome.run_dir.parent
            log_artifact(config.logging, root, run_id, Path(curves))


def _resume_command(args: argparse.Namespace, root: str) -> str:
    """The command that continues an interrupted invocation, with every option it was given."""
    import shlex

    words = ["raysim", args.command, args.config, "--resume", root]
    for name, flag in (("variants", "--variant"), ("grid", "--grid"), ("overrides", "--set")):
        for value in getattr(args, name, None) or []:
            words += [flag, value]
    for name, flag in (("seeds", "--seeds"), ("data_root", "--data-root"),
                       ("output", "--output")):
        if getattr(args, name, None):
            words += [flag, getattr(args, name)]
    return shlex.join(words)


def console_main() -> None:
    """The ``raysim`` console script: :func:`main`, then a fast exit.

    When the command left no Ray running (``run`` and ``sweep`` shut down the Ray they started
    before they return), the process ends with ``os._exit`` after flushing its output: every
    result file is closed by then, and Python's own finalisation of torch, pandas, pyarrow and
    matplotlib (about 1.5 s on a 2-CPU machine) would only delay the prompt. Otherwise (Ray
    still up, e.g. after an error) the normal exit lets Ray shut down.
    """
    code = main(started_at=_IMPORTED_AT)
    ray = sys.modules.get("ray")  # not imported: no Ray was started
    if ray is not None and ray.is_initialized():
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    console_main()
