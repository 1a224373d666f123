"""raysim from Python (a notebook, a script): run an experiment and read its results as pandas
DataFrames, with the command line's behaviour: the same progress lines, Ctrl-C stopping at a
round boundary (the runs can be resumed), ``resume`` continuing an interrupted root, and bad
input refused before anything runs; here as an exception (:class:`raysim.errors.RaysimError`,
whose message is the paragraph the command line prints) instead of exit 2.

    import raysim
    results = raysim.run("experiments/quickstart.yaml", overrides=["training.rounds=5"])
    results.summary()            # mean ± std over seeds of the final metrics
    results.table("clients")     # any results table, every run under the root
    raysim.run_sweep("experiments/quickstart.yaml", {"training.optimizer.lr": [0.01, 0.1]})
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.errors import RaysimError

if TYPE_CHECKING:
    import pandas as pd

    from raysim.configuration.experiment import ExperimentConfig
    from raysim.engine.runner import RunOutcome
    from raysim.estimator.cluster_projection import ClusterShape


@dataclass(frozen=True)
class Results:
    """The runs of one invocation: where they wrote, and how each ended."""

    root: Path
    """The run root (``<output>/<name>-<timestamp>``): read it with :func:`raysim.results.load`
    or ``raysim report``."""
    outcomes: tuple[RunOutcome, ...]
    """One per run (seed and variant): its directory, final rounds row, error, exit code."""

    @property
    def failed(self) -> list[RunOutcome]:
        """The runs that ended with an error (rows written before it are kept)."""
        return [outcome for outcome in self.outcomes if outcome.error]

    def table(self, name: str = "rounds") -> pd.DataFrame:
        """A results table (rounds, clients, client_eval, communication, selection, system)
        of every run under the root, with its experiment, algorithm, seed and run columns."""
        from raysim.results.load import load

        return load(self.root, name)

    def summary(self, metrics: Sequence[str] | None = None) -> pd.DataFrame:
        """Mean and std over seeds of each run's final metrics, per experiment (variant).
        Raises :class:`RaysimError` when no run has an evaluated round (e.g. every run
        failed: :attr:`failed` holds their errors)."""
        from raysim.results.report import check_metrics, summary_table

        rounds = self.table("rounds")
        if rounds.empty or "accuracy" not in rounds or rounds["accuracy"].isna().all():
            failed = self.failed
            why = (f"{len(failed)} of {len(self.outcomes)} runs failed (the first: "
                   f"{failed[0].error})" if failed else "no run has reached an evaluation")
            raise RaysimError(
                f"No evaluated round to summarise under {self.root}: {why}. Results.failed "
                "lists each failed run's error; rows written before a failure stay in "
                "Results.table().")
        if metrics:
            check_metrics(rounds, list(metrics))
        return summary_table(rounds, list(metrics) if metrics else None)


def run(config: str | Path | dict[str, Any], *, overrides: Sequence[str] = (),
        variants: Sequence[str] = (), data_root: str | None = None,
        output: str | None = None, resume: str | Path | None = None,
        progress: bool = True, plugins: Sequence[str] = ()) -> Results | None:
    """Run every seed (and every variant, or those named in ``variants``) of ``config`` (a
    YAML path or a dict of the same keys; ``overrides`` as ``--set``: ``["key=value", ...]``)
    and return its :class:`Results`; None when ``resume`` names a root whose runs are all
    complete. ``resume``: a run root to continue, or "latest" for this config's newest.
    Raises :class:`raysim.errors.RaysimError` on bad input (nothing runs) and
    :class:`raysim.errors.RunInterrupted` after Ctrl-C (the runs stopped at a round
    boundary; ``resume`` continues them). ``plugins``: modules to import first, as
    ``--plugin`` (a method, model or dataset registered in the calling script itself needs
    none: it is registered already)."""
    experiments = _experiments(config, list(overrides), list(variants), list(plugins))
    return _invoke(experiments, None, data_root, output, resume, progress)


def run_sweep(config: str | Path, grid: dict[str, Sequence[Any]], *, seeds: Sequence[int] = (),
          overrides: Sequence[str] = (), data_root: str | None = None,
          output: str | None = None, resume: str | Path | None = None,
          progress: bool = True, plugins: Sequence[str] = ()) -> Results | None:
    """Every combination of ``grid`` ({dotted key: values}, e.g. ``{"training.optimizer.lr":
    [0.01, 0.1]}``) of the YAML config at ``config`` (times its variants), as ``raysim
    sweep``; ``seeds`` replaces the config's. Returns as :func:`run` does; each run's manifest
    records its grid point."""
    from raysim.configuration.sweep import sweep_experiments

    experiments, labels = sweep_experiments(
        config, [(key, list(values)) for key, values in grid.items()],
        list(seeds) or None, list(overrides), list(plugins))
    return _invoke(experiments, labels, data_root, output, resume, progress)


@dataclass(frozen=True)
class Projection:
    """What ``raysim estimate`` prints and writes: the projection as text and as a table."""

    text: str
    """The printed projection (per variant and in total, with the machine it was made on)."""
    table: pd.DataFrame
    """One row per variant (the ``--csv`` file's columns)."""
    cluster: pd.DataFrame | None = None
    """With cluster shapes: one row per variant and shape (:mod:`raysim.estimator.cluster_projection`)."""
    interrupted: bool = False
    """Ctrl-C or SIGTERM stopped the probes: the projection covers the variants probed before."""


def run_estimate(config: str | Path | dict[str, Any], *, rounds: int = 3,
             overrides: Sequence[str] = (), variants: Sequence[str] = (),
             data_root: str | None = None, clients: int | None = None,
             stand_in_data: bool = False, plugins: Sequence[str] = (),
             cluster: Sequence[ClusterShape] = (), extrapolate: str | None = None
             ) -> Projection:
    """Project the wall time and device-hours of a whole config (every seed and variant)
    from ``rounds`` rounds of each variant's first seed run here, as ``raysim estimate``
    (``clients``: a slice of K clients per round, scaled up; ``stand_in_data``: time a
    generated file of the dataset's layout when its file is missing; ``cluster``: also
    project each variant on these cluster shapes; ``extrapolate``: ``KEY=LOW,HIGH``, probe at
    two values of a numeric key and extend the line to the config's value). Notices (the engine fitted to this
    machine, a busy machine) go to stderr."""
    import os
    import sys

    import pandas as pd

    from raysim.engine.invocation import ray_for
    from raysim.engine.launch.local_ray import cluster_to_join
    from raysim.engine.launch.warm_cluster import running_cluster
    from raysim.estimator.estimate import (
        INTERRUPTED,
        busy_notice,
        check_data,
        describe,
        fit_to_machine,
        measure,
        project,
        table_rows,
    )
    from raysim.estimator.extrapolation import Extrapolation
    from raysim.estimator.stand_in import check_stand_ins

    if rounds < 2:
        raise RaysimError(f"Invalid --rounds {rounds}: the estimate needs at least 2 rounds "
                          "(the first pays for warm-up; steady rounds are measured after it).")
    if clients is not None and clients < 1:
        raise RaysimError(f"Invalid --clients {clients}: a slice trains at least 1 client "
                          "per round. Pass a positive count, or leave --clients out to probe "
                          "the config's own rounds.")
    extrapolation = None if extrapolate is None else Extrapolation.parse(extrapolate)
    experiments = _experiments(config, list(overrides), list(variants), list(plugins))
    if stand_in_data:
        check_stand_ins(experiments, data_root)  # before Ray, and before waiting for CPUs
    else:
        check_data(experiments, data_root)
    cpus = os.cpu_count() or 1
    if all(cluster_to_join(run.engine.address) is None and running_cluster() is None
           for run in experiments.values()):  # a local Ray: make the engine fit
        experiments, fitted = fit_to_machine(experiments, cpus)
        for notice in (fitted, busy_notice(cpus)):
            if notice:
                print(notice, file=sys.stderr)
    with ray_for(experiments) as notices:
        for notice in notices:
            print(notice, file=sys.stderr)
        import ray

        resources = ray.cluster_resources()
        probes, concurrent, gpus = measure(experiments, rounds, data_root, clients,
                                           stand_in_data, extrapolation)
    machine = (f"this machine ({resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} "
               f"GPUs, {cpus} cores)")
    projected = project(experiments, probes, concurrent, gpus)
    text = describe(projected, machine, extrapolation)
    rows = None
    if cluster:
        from raysim.estimator.cluster_projection import (
            cluster_rows,
            describe_cluster,
            unmeasured_relays,
            without_partials,
        )
        from raysim.estimator.estimate import evaluations

        traffic = {label: p.traffic for label, p in probes.items() if p.traffic is not None}
        found = cluster_rows(
            dict(experiments), traffic,
            {label: probes[label].config_evaluation_s for label in traffic},
            {label: evaluations(experiments[label]) for label in traffic}, list(cluster))
        device = "GPUs here" if gpus else "CPUs here: a GPU cluster's rounds need a GPU probe"
        text += "\n\non the cluster:\n" + describe_cluster(
            found, device, unmeasured_relays(traffic), without_partials(traffic))
        rows = pd.DataFrame(found)
    return Projection(text, pd.DataFrame(table_rows(projected, machine)), rows,
                      any(probe.refused == INTERRUPTED for probe in probes.values()))


def _invoke(experiments: dict[str, ExperimentConfig], labels: dict[str, Any] | None,
            data_root: str | None, output: str | None, resume: str | Path | None,
            progress: bool) -> Results | None:
    """Run labelled experiments through the engine's door; their :class:`Results`."""
    import time

    from raysim.engine.invocation import Invocation, invoke
    from raysim.errors import RunInterrupted

    try:
        invoked = invoke(Invocation(experiments, data_root, output, progress=progress,
                                    resume=None if resume is None else str(resume),
                                    labels=labels, started_at=time.time()),
                         preload=lambda: None, closing=lambda outcomes, root, preloaded: None)
    except RunInterrupted:
        raise
    except KeyboardInterrupt as interrupt:  # during start-up (e.g. waiting for CPU slots)
        raise RunInterrupted(str(getattr(interrupt, "root", "") or "")) from None
    return None if invoked is None else Results(invoked.root, tuple(invoked.outcomes))


def _experiments(config: str | Path | dict[str, Any], overrides: list[str],
                 variants: list[str], plugins: list[str]) -> dict[str, ExperimentConfig]:
    """The labelled configs of ``config``, limited to ``variants`` when given."""
    from raysim.configuration.experiment import experiments_from_raw, load_experiments

    if isinstance(config, dict):
        experiments = experiments_from_raw(config, overrides, plugins)
    elif isinstance(config, str | Path):
        experiments = load_experiments(config, overrides, plugins)
    else:
        raise RaysimError(f"Invalid config {type(config).__name__!r}: pass the path of a YAML "
                          "config or a dict of its keys.")
    unknown = [label for label in variants if label not in experiments]
    if unknown:
        raise RaysimError(
            f"Unknown variant {unknown[0]!r}: the config defines "
            f"{', '.join(label for label in experiments if label) or 'no variants'}.")
    return {label: experiments[label] for label in variants} if variants else experiments
