"""What running a whole config costs on this machine, projected from a few measured rounds
(``raysim estimate``): wall time for every seed and variant, and device-hours (GPU-hours where
the workers get GPUs, else CPU-hours).

Each variant runs its first seed for a few rounds on this machine's Ray (the config's model,
data, clients, local work and engine; results in a temporary directory). Its steady seconds per
round (from the end of its first round to the end of its last, so start-up and the first
round's warm-up stay out) and the seconds of one evaluation give one run's time:
``rounds x round + evaluations x evaluation``. The runs (seeds x variants) are then scheduled
in order on as many slots as the machine fits runs at once, as ``raysim run`` does, after the
start-up measured by the first probe.

Three slices make a paper-scale config measurable on a small machine:

- ``clients``: the probe trains K clients per round instead of the config's C (a config
  that samples clients samples fewer; one that trains every client gets K clients of the same
  partition scheme, and where the scheme splits the whole training set, a class-stratified
  K / C of it, so that each client holds about what one of the config's holds), and its round
  is projected by the clients each worker runs one after another: ``ceil(C / workers) /
  ceil(K / workers)`` (an evaluation of every client's model likewise). A client's own work is
  assumed unchanged by the slice.
- ``stand_in``: a MedMNIST file, segmentation site or folder of recordings that is not at hand
  is replaced by generated files of its public set's layout (:mod:`raysim.estimator.stand_in`):
  what a round costs does not depend on the values.

- ``extrapolation`` (:mod:`raysim.estimator.extrapolation`): a variant with the given numeric key is
  probed at two small values of it and its seconds are extended along the line through the
  two to the config's own value (FedVCK's condensation iterations, the training samples).

- phases: a method whose last rounds are of another kind (FedSM-extra's selector rounds,
  :meth:`raysim.algorithms.base.Algorithm.tail_phase`) is probed for ``rounds`` rounds of each
  kind, and its seconds per round are the two kinds' steady seconds weighted by the config's
  rounds of each.

A variant that cannot be probed (its config refused at the probe's size, or its probe
failing) is named with the reason and
left out of the projection; the other variants are still estimated. Interrupted (Ctrl-C,
SIGTERM) after at least one probe, the estimate projects the variants probed so far.

A config whose engine asks for more CPUs than this machine has (a paper-scale config on a
laptop) is probed with an engine that fits (:func:`fit_to_machine`, said in a notice): the
projection is then for this machine with those settings.
"""

from __future__ import annotations

import heapq
import math
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from raysim.configuration.experiment import ExperimentConfig
from raysim.engine.progress import duration_text
from raysim.estimator.cluster_projection import ProbeTraffic
from raysim.estimator.extrapolation import DATA_SLICE, Extrapolation
from raysim.estimator.stand_in import missing_data, stand_in_data, users_dataset


@dataclass(frozen=True)
class Probe:
    """What a few rounds of one variant measured."""

    rounds: int
    round_s: float
    """Steady seconds per round."""
    evaluation_s: float
    """Seconds of one evaluation (0 when the probe evaluated nothing)."""
    startup_s: float
    """Seconds from the probe's start to its first round's end, less one steady round."""
    round_scale: float = 1.0
    """What a measured round is multiplied by for the config's clients per round (a slice)."""
    evaluation_scale: float = 1.0
    """Likewise for an evaluation (an evaluation of every client's model)."""
    clients: int | None = None
    """Clients per round the probe trained, where it was a slice of the config's."""
    stand_in: bool = False
    """Whether the probe ran on a generated file of the dataset's layout."""
    refused: str | None = None
    """Why the variant could not be probed (its config refused at the probe's size, or its
    probe failed); such a variant is named and left out of the projection."""
    traffic: ProbeTraffic | None = None
    """What its rounds handed off, for a projection on a cluster."""
    extrapolated: str | None = None
    """What the two probes of an ``--extrapolate`` measured, where the seconds were extended
    from them (:mod:`raysim.estimator.extrapolation`)."""
    phases: str | None = None
    """What the probe measured of each kind of round, where the method's last rounds differ in
    kind (:meth:`raysim.algorithms.base.Algorithm.tail_phase`) and ``round_s`` is their mean
    over the config's rounds."""

    @property
    def config_round_s(self) -> float:
        """Seconds of one of the config's rounds (a slice's round scaled back up)."""
        return self.round_s * self.round_scale

    @property
    def config_evaluation_s(self) -> float:
        """Seconds of one of the config's evaluations (likewise)."""
        return self.evaluation_s * self.evaluation_scale


@dataclass(frozen=True)
class VariantCost:
    """One variant's projected run."""

    label: str
    runs: int
    rounds: int
    run_s: float
    probe: Probe
    devices_per_run: float


@dataclass(frozen=True)
class Estimate:
    """The projection of a whole config."""

    variants: list[VariantCost]
    concurrent_runs: int
    startup_s: float
    wall_s: float
    device_hours: float
    device: str
    """"GPU" or "CPU": what the device-hours count."""
    refused: dict[str, str]
    """Variants left out of the projection, with why their probe could not run."""


def evaluations(config: ExperimentConfig) -> int:
    """How many times a run of ``config`` evaluates: every ``evaluation.every`` rounds and
    after the last (none when ``every`` is 0)."""
    every, rounds = config.evaluation.every, config.training.rounds
    if every <= 0:
        return 0
    return len(set(range(every - 1, rounds, every)) | {rounds - 1})


def makespan(durations: list[float], slots: int) -> float:
    """The time ``durations`` take when started in order on ``slots`` parallel slots, each
    starting when a slot frees (list scheduling, as runs wait for resources)."""
    ends = [0.0] * max(1, slots)
    for duration in durations:
        heapq.heapreplace(ends, ends[0] + duration)  # the slot that frees first
    return max(ends)


def project(configs: Mapping[str, ExperimentConfig], probes: Mapping[str, Probe],
            concurrent_runs: int, uses_gpus: bool) -> Estimate:
    """The whole config's cost from each variant's probe (see the module docstring)."""
    costs, refused = [], {}
    for label, config in configs.items():
        probe = probes[label]
        if probe.refused is not None:
            refused[label] = probe.refused
            continue
        engine = config.engine
        devices = engine.num_workers * (engine.gpus_per_worker if uses_gpus
                                        else engine.cpus_per_worker)
        run_s = config.training.rounds * probe.config_round_s + \
            evaluations(config) * probe.config_evaluation_s
        costs.append(VariantCost(label, len(config.seeds), config.training.rounds, run_s, probe,
                                 devices))
    durations = [cost.run_s for cost in costs for _ in range(cost.runs)]
    startup = costs[0].probe.startup_s if costs else 0.0
    hours = sum(cost.run_s * cost.runs * cost.devices_per_run for cost in costs) / 3600
    return Estimate(costs, concurrent_runs, startup, startup + makespan(durations, concurrent_runs),
                    hours, "GPU" if uses_gpus else "CPU", refused)


def fit_to_machine(configs: Mapping[str, ExperimentConfig], cpus: int
                   ) -> tuple[dict[str, ExperimentConfig], str | None]:
    """``configs`` with engines that fit a local Ray of ``cpus`` CPUs: where a config's workers
    need more CPUs than that, one CPU per worker and at most ``cpus`` workers (its GPU share
    kept). Returns the configs and a notice saying what changed (None: nothing did)."""
    fitted, changed = {}, None
    for label, config in configs.items():
        engine = config.engine
        if engine.num_workers * engine.cpus_per_worker <= cpus + 1e-9:
            fitted[label] = config
            continue
        workers = max(1, min(engine.num_workers, cpus))
        fitted[label] = config.model_copy(update={"engine": engine.model_copy(update={
            "num_workers": workers, "cpus_per_worker": 1.0})})
        changed = changed or (
            f"This machine has {cpus} CPUs and the config's workers need "
            f"{engine.num_workers} x {engine.cpus_per_worker:g}: the probes run with "
            f"engine.num_workers={workers} and engine.cpus_per_worker=1, and the projection is "
            "for this machine with those settings (estimate on the machine the config was "
            "written for to project its own; `--set engine.num_workers=N` chooses another "
            "fit).")
    return fitted, changed


INTERRUPTED = "interrupted before its probe ended"
"""Why a variant has no probe after Ctrl-C or SIGTERM stopped the estimate."""


def busy_notice(cpus: int) -> str | None:
    """A line when other processes keep this machine busy before the probes start (a load
    average over half its CPUs): probes then measure slower rounds than a quiet machine
    runs."""
    from raysim.engine.launch.machine_load import busy_load

    load = busy_load(cpus)
    if load is None:
        return None
    return (f"This machine is busy (load average {load:.1f} on {cpus} CPUs before the probes "
            "started): the probes share it, so the projection can be several times what a quiet "
            "machine takes.")


def sliced(config: ExperimentConfig, clients: int | None, data_root: str | None = None
           ) -> tuple[ExperimentConfig, float, float]:
    """``config`` with ``clients`` clients per round (where fewer than its own), and the scales
    of a round and of an evaluation back to the config's (module docstring)."""
    own = config.clients_per_round
    if clients is None or clients >= own:
        return config, 1.0, 1.0
    if config.training.clients_per_round is not None:  # it samples: sample fewer
        config = config.model_copy(update={"training": config.training.model_copy(
            update={"clients_per_round": clients})})
    else:  # every client trains: fewer clients, each holding what one of the config's holds
        partition = config.partition
        config = config.model_copy(update={"partition": partition.model_copy(
            update={"num_clients": clients, **_per_site(config, clients)})})
        if partition.samples_per_client is None and partition.scheme != "replicate":
            kept = max(2, math.ceil(train_size(config, data_root) * clients / own))
            config = config.model_copy(update={"dataset": config.dataset.model_copy(
                update={"train_subset": kept})})
    workers = config.engine.num_workers
    scale = math.ceil(own / workers) / math.ceil(clients / workers)
    return config, scale, scale if config.evaluation.clients else 1.0


def _per_site(config: ExperimentConfig, clients: int) -> dict[str, int]:
    """The slice's clients per site under scheme ``sites`` (every site the same number; an
    empty update for other schemes); a count that the sites do not split evenly is refused."""
    partition = config.partition
    if partition.scheme != "sites":
        return {}
    per_site = partition.clients_per_site
    sites = len(per_site) if isinstance(per_site, list) else partition.num_clients // per_site
    if clients % sites:
        from raysim.errors import ConfigError

        raise ConfigError(
            f"Invalid --clients {clients}: scheme 'sites' splits each of the config's {sites} "
            f"sites into clients (partition.clients_per_site = {per_site}), and a slice keeps "
            f"every site with the same number of clients, so it holds a multiple of {sites}. "
            f"Pass --clients {sites} (one client a site) or another multiple of {sites}.")
    return {"clients_per_site": clients // sites}


def train_size(config: ExperimentConfig, data_root: str | None = None) -> int:
    """Training samples the config's clients split among them (its ``train_subset``, else the
    dataset's training split; a user's dataset, sites' folders or a MedSegBench file read under
    ``data_root``)."""
    from raysim.data.builtin import BUILTIN_DATASETS, load_builtin
    from raysim.data.medmnist_io import medmnist_info

    dataset = config.dataset
    if dataset.train_subset is not None:
        return dataset.train_subset
    if dataset.name in BUILTIN_DATASETS:
        return len(load_builtin(dataset.name).train_y)
    if users_dataset(dataset) or dataset.sites is not None or dataset.medsegbench is not None:
        from raysim.data import load_dataset

        return len(load_dataset(dataset, data_root).train_y)
    return int(medmnist_info()[dataset.name]["n_samples"]["train"])


def check_data(configs: Mapping[str, ExperimentConfig], data_root: str | None) -> None:
    """Before Ray starts: every variant's MedMNIST file is present, or fetched now where the
    config allows downloads, and its site folders or ``dataset.path`` exist; otherwise one
    paragraph naming what is missing, ``--data-root`` and ``--stand-in-data`` (an estimate can
    time generated files of the dataset's layout)."""
    from raysim.data import load_dataset
    from raysim.data.builtin import BUILTIN_DATASETS
    from raysim.data.medmnist_io import default_root, file_name
    from raysim.errors import DataError

    checked: set[str] = set()
    for config in configs.values():
        dataset = config.dataset
        if dataset.sites is not None or dataset.path is not None:
            missing = missing_data(dataset, data_root)
            if missing is not None:
                raise DataError(missing)
            continue
        if dataset.name in BUILTIN_DATASETS or users_dataset(dataset):
            continue
        path = Path(data_root or dataset.root or default_root()).expanduser() / file_name(
            dataset.name, dataset.size)
        if path.exists() or str(path) in checked:
            continue
        checked.add(str(path))
        try:
            load_dataset(dataset, data_root)  # (downloads it where dataset.download allows)
        except DataError as error:
            raise DataError(f"{error} To estimate without the file, add --stand-in-data: the "
                            "probes then time a generated file of the dataset's layout "
                            "(official split sizes, channels, classes, size).") from None


def measure(configs: Mapping[str, ExperimentConfig], rounds: int, data_root: str | None,
            clients: int | None = None, stand_in: bool = False,
            extrapolation: Extrapolation | None = None
            ) -> tuple[dict[str, Probe], int, bool]:
    """Run ``rounds`` rounds of each variant's first seed (``clients`` clients per round where
    given; on a generated file of the dataset's layout where ``stand_in`` and the file is
    missing; twice, at the two values of ``extrapolation``'s key, where given and the variant
    has the key), saying on stderr what each probe measured as it ends; returns the probes, how
    many runs of the config fit at once here, and whether the workers get GPUs."""
    from raysim.engine.invocation import concurrent_runs, uses_gpus
    from raysim.errors import RunError

    probes: dict[str, Probe] = {}
    with tempfile.TemporaryDirectory(prefix="raysim-estimate-") as scratch:
        for label, config in configs.items():
            started = time.time()
            own = None if extrapolation is None else own_value(extrapolation, (
                stand_in and stand_in_data(config, data_root, Path(scratch))) or config,
                data_root)  # (the whole split of the stand-in where the data is not at hand)
            tail = tail_phase(config)
            try:
                if tail is not None:  # (probed by kind of round; not extrapolated)
                    probe = _probe(label, phased(config, tail[0], rounds), 2 * rounds,
                                   data_root, clients, stand_in, scratch,
                                   (config.training.rounds - tail[1], tail[1]))
                elif extrapolation is None or own is None:
                    probe = _probe(label, config, rounds, data_root, clients, stand_in, scratch)
                else:
                    low, high = (_probe(label, extrapolation.at(config, value), rounds,
                                        data_root, clients, stand_in, scratch)
                                 for value in (extrapolation.low, extrapolation.high))
                    refused = next((p for p in (low, high) if p.refused is not None), None)
                    probe = refused or extended(extrapolation, low, high, own)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: project what was probed
                if not any(probe.refused is None for probe in probes.values()):
                    raise
                for rest in configs:
                    probes.setdefault(rest, Probe(0, 0.0, 0.0, 0.0, refused=INTERRUPTED))
                print(f"interrupted: projecting the {sum(p.refused is None for p in probes.values())} "
                      f"of {len(configs)} variants probed", file=sys.stderr, flush=True)
                break
            probes[label] = probe
            if probe.refused is not None:
                print(f"not probed {label or config.name} ({len(probes)} of {len(configs)}): "
                      f"{probe.refused}", file=sys.stderr, flush=True)
                continue
            print(f"probed {label or config.name} ({len(probes)} of {len(configs)}): "
                  f"{probe.config_round_s:.3f} s per round, "
                  f"{probe.config_evaluation_s:.2f} s per evaluation, "
                  f"{time.time() - started:.0f} s for the probe"
                  + (f" ({probe.extrapolated})" if probe.extrapolated else "")
                  + (f" ({probe.phases})" if probe.phases else ""),
                  file=sys.stderr, flush=True)
        if all(probe.refused is not None for probe in probes.values()):
            first = next(iter(probes.items()))
            raise RunError(f"The estimate's probe of {first[0] or 'the config'} failed, and no "
                           f"variant could be probed: {first[1].refused}")
        return probes, concurrent_runs(configs.values()), any(
            uses_gpus(config) for config in configs.values())


def tail_phase(config: ExperimentConfig) -> tuple[str, int] | None:
    """The config key and number of its method's last rounds of another kind, if any."""
    from raysim.algorithms import ALGORITHMS

    return ALGORITHMS[config.algorithm.name].tail_phase(config.algorithm)


def phased(config: ExperimentConfig, key: str, rounds: int) -> ExperimentConfig:
    """``config`` with ``rounds`` rounds of each kind: ``2 * rounds`` rounds whose last
    ``rounds`` are the tail phase (``key``), set as ``--set`` would set them."""
    from raysim.configuration.experiment import with_overrides

    return with_overrides(config, [f"training.rounds={2 * rounds}", f"{key}={rounds}"])


def own_value(extrapolation: Extrapolation, config: ExperimentConfig,
              data_root: str | None = None) -> float | None:
    """The config's value of the extrapolation's key; the data slice left unset is the whole
    training split (None: the variant has no such key and is probed as it is)."""
    value = extrapolation.value_in(config)
    if value is None and extrapolation.key == DATA_SLICE \
            and config.dataset.train_subset is None:
        return float(train_size(config, data_root))
    return value


def extended(extrapolation: Extrapolation, low: Probe, high: Probe, own: float) -> Probe:
    """One probe for the config's ``own`` value of the key from the two measured ones."""
    return replace(high, round_s=extrapolation.extend(low.round_s, high.round_s, own),
                   evaluation_s=extrapolation.extend(low.evaluation_s, high.evaluation_s, own),
                   startup_s=min(low.startup_s, high.startup_s),
                   extrapolated=(f"{extrapolation.key} {low.round_s:.3f} s per round at "
                                 f"{extrapolation.low:g}, {high.round_s:.3f} s at "
                                 f"{extrapolation.high:g}, extended to {own:g}"))


def _probe(label: str, config: ExperimentConfig, rounds: int, data_root: str | None,
           clients: int | None, stand_in: bool, scratch: str,
           phases: tuple[int, int] | None = None) -> Probe:
    """What ``rounds`` rounds of ``config``'s first seed measure here (a refused probe where
    its config is refused at the probe's size or its run fails). ``phases``: ``config`` is
    :func:`phased` and the original config has these (main, tail) rounds; the steady seconds
    of each half of the probe are weighted by them."""
    from raysim.engine.invocation import run_experiments
    from raysim.errors import ConfigError
    from raysim.results import load

    measured = min(rounds, config.training.rounds)
    generated = stand_in_data(config, data_root, Path(scratch)) if stand_in else None
    probe_config, round_scale, evaluation_scale = sliced(generated or config, clients, data_root)
    probe_config = probe_config.model_copy(update={
        "seeds": config.seeds[:1],
        "engine": probe_config.engine.model_copy(update={"count_transfers": True}),
        "training": probe_config.training.model_copy(update={"rounds": measured}),
        "evaluation": config.evaluation.model_copy(update={
            "every": measured if config.evaluation.every > 0 else 0,
            "membership_audit": 0})})
    started = time.time()
    root = probe_config.dataset.root if generated else data_root
    try:
        outcome = run_experiments({label: probe_config}, data_root=root, output=scratch,
                                  progress=False)[0]
        error = None if outcome.error is None else str(outcome.error)
    except ConfigError as refused:  # e.g. a phase longer than the probe's rounds
        error = str(refused)
    if error is not None:
        return Probe(0, 0.0, 0.0, 0.0, refused=error)
    table = load(outcome.run_dir)
    ends = table["wall_time"].to_numpy()
    evaluation = float(table["seconds_evaluate"].fillna(0).max()) \
        if "seconds_evaluate" in table else 0.0
    steady = (float(ends[-1] - ends[0]) - evaluation) / (len(ends) - 1) \
        if len(ends) > 1 else float(ends[0] - started)
    measured_phases = None
    if phases is not None:  # each half's first round is its warm-up; the evaluation ends the tail
        half = len(ends) // 2
        main = float(ends[half - 1] - ends[0]) / (half - 1)
        tail = (float(ends[-1] - ends[half]) - evaluation) / (len(ends) - half - 1)
        steady = (phases[0] * main + phases[1] * tail) / sum(phases)
        measured_phases = (f"{main:.3f} s per round of its first {phases[0]}, {tail:.3f} s per "
                           f"round of its last {phases[1]}")
    traffic = ProbeTraffic.from_tables(
        load(outcome.run_dir, "transfers"), table, load(outcome.run_dir, "communication"),
        probe_config.engine.num_workers, max(steady, 0.0), load(outcome.run_dir, "clients"),
        config.partition.num_clients)
    return Probe(measured, max(steady, 0.0), evaluation,
                 max(float(ends[0] - started) - steady, 0.0), round_scale, evaluation_scale,
                 clients if round_scale != 1.0 else None, generated is not None,
                 traffic=traffic, phases=measured_phases)


def describe(estimate: Estimate, machine: str,
             extrapolation: Extrapolation | None = None) -> str:
    """The estimate as a table and the lines that say how it was projected."""
    lines = ["variant | runs | s/round (steady) | evaluation s | rounds | one run",
             "--- | --- | --- | --- | --- | ---"]
    for cost in estimate.variants:
        lines.append(f"{cost.label or '(config)'} | {cost.runs} | "
                     f"{cost.probe.config_round_s:.3f} | {cost.probe.config_evaluation_s:.2f} | "
                     f"{cost.rounds} | {duration_text(cost.run_s)}")
    runs = sum(cost.runs for cost in estimate.variants)
    first = estimate.variants[0].probe
    lines += [
        "",
        f"projected wall time: {duration_text(estimate.wall_s)} for {runs} runs, "
        f"{estimate.concurrent_runs} at a time on {machine}; "
        f"{estimate.device_hours:.2f} {estimate.device}-hours",
        f"how: each variant's first seed ran {first.rounds} rounds here; "
        "one run = the config's rounds x the steady seconds per round (from the end of the "
        "first round to the end of the last) + its evaluations x one evaluation's seconds; "
        f"runs scheduled in order after {estimate.startup_s:.1f} s of start-up. Later rounds "
        "are assumed to cost what the measured ones did."]
    sliced = [cost for cost in estimate.variants if cost.probe.clients is not None]
    if sliced:
        lines.append(
            f"slice: {len(sliced)} of {len(estimate.variants)} variants ran "
            f"{sliced[0].probe.clients} clients per round; their rounds were scaled by the "
            f"clients each worker runs one after another (x{sliced[0].probe.round_scale:.1f}), "
            "assuming a client's own work is unchanged by the slice.")
    stretched = [cost for cost in estimate.variants if cost.probe.extrapolated]
    if stretched and extrapolation is not None:
        lines.append(extrapolation.describe(len(stretched), len(estimate.variants)))
        lines += [f"  {cost.label or '(config)'}: {cost.probe.extrapolated}" for cost in stretched]
    phased_costs = [cost for cost in estimate.variants if cost.probe.phases]
    if phased_costs:
        lines.append("phases: a method whose last rounds are of another kind was probed for "
                     f"{phased_costs[0].probe.rounds // 2} rounds of each kind; its seconds per "
                     "round are their mean over the config's rounds:")
        lines += [f"  {cost.label or '(config)'}: {cost.probe.phases}" for cost in phased_costs]
    for label, reason in estimate.refused.items():
        lines.append(f"not in the projection: {label or '(config)'}, whose probe could not run "
                     f"({reason})")
    if any(cost.probe.stand_in for cost in estimate.variants):
        lines.append("data: the dataset's files are not here; the probes ran on generated files "
                     "of its public layout (a MedMNIST file's split sizes, channels, classes "
                     "and size; a polyp centre's image count; Sleep-EDF-20's subjects and "
                     "epochs): a round's cost depends on their number and shape, not their "
                     "values.")
    return "\n".join(lines)


def table_rows(estimate: Estimate, machine: str) -> list[dict[str, object]]:
    """The estimate as rows for a CSV (one per variant; the whole config's projection in every
    row): what ``raysim estimate --csv`` writes. ``round_s`` and ``evaluation_s`` are the
    config's (a slice's measurement scaled), ``probe_round_s`` what the probe measured."""
    return [{"variant": cost.label or "(config)", "runs": cost.runs, "rounds": cost.rounds,
             "probe_rounds": cost.probe.rounds,
             "round_s": round(cost.probe.config_round_s, 4),
             "evaluation_s": round(cost.probe.config_evaluation_s, 3),
             "run_hours": round(cost.run_s / 3600, 3),
             "all_runs_wall_hours": round(estimate.wall_s / 3600, 3),
             "concurrent_runs": estimate.concurrent_runs,
             "device_hours": round(estimate.device_hours, 3), "device": estimate.device,
             "machine": machine, "probe_round_s": round(cost.probe.round_s, 4),
             "probe_clients": cost.probe.clients or "", "stand_in_data": cost.probe.stand_in,
             "extrapolated": cost.probe.extrapolated or "",
             "phases": cost.probe.phases or ""}
            for cost in estimate.variants]


__all__ = ["INTERRUPTED", "Estimate", "Probe", "VariantCost", "busy_notice", "describe",
           "evaluations", "extended", "fit_to_machine", "makespan", "measure", "own_value",
           "phased", "project", "sliced", "table_rows", "tail_phase",
           "train_size"]
