"""The production round loop in one process, without Ray (tests only): the engine's
:class:`~raysim.rounds.round_loop.RoundLoop` over in-process workers
(:mod:`raysim.rounds.in_process`), the algorithm assembled with its features as the driver
assembles it. Used to check the algorithm contract: results do not depend on the algorithm
object surviving between rounds, on writing the states to a checkpoint's file, or on how
clients are grouped."""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.algorithms import ALGORITHMS
from raysim.configuration.experiment import ExperimentConfig
from raysim.layers.assembly import RunParts, assemble, build_loop, compose
from raysim.layers.feature import RunStart
from raysim.preparation import initial_weights, pooled, prepare, run_context
from raysim.rounds.client_work import ClientWork
from raysim.rounds.in_process import InProcessWorkers, MemorySink
from raysim.rounds.round_loop import Durable, LoopProgress, RoundCallback, RoundLoop, RoundOutcome
from raysim.state_codec import read_state, save_state
from raysim.training.context import ClientData
from raysim.training.runtime import ClientRuntime


@dataclass
class Trace:
    """What a simulated run produced: per round, each client's metrics; the final states."""

    metrics: list[dict[int, dict[str, float]]] = field(default_factory=list)
    server_state: Any = None
    client_states: dict[int, Any] = field(default_factory=dict)
    algorithm: Any = None
    """The server-side algorithm object (its evaluation models and predictions)."""
    runtime: Any = None
    """The ClientRuntime every client trained in."""
    dataset: Any = None
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """The rows the loop wrote (``rounds``, ``clients``, ``communication``, ...)."""
    manifest: dict[str, Any] = field(default_factory=dict)
    """The features' entries of the run's manifest (``privacy``, ``compression``, ...)."""


_SIMULATED: dict[tuple[str, int, int, bool, int, int], Trace] = {}
"""The simulations the running test module made, by config, algorithm class, torch's thread
count and the arguments: a run is deterministic, so a test that simulates a config another test simulated
gets a copy of that trace (its states, rows and metrics copied; the algorithm, runtime and
dataset shared, which tests only read or re-set before use)."""


def forget_simulations() -> None:
    """Drop every remembered trace (conftest does, at each test module's start and end)."""
    _SIMULATED.clear()


def simulate(config: ExperimentConfig, *, fresh_objects: bool = False,
             group_size: int = 1, workers: int = 1, cached: bool = True) -> Trace:
    """Run ``config``'s first seed on the production round loop in this process (see
    :func:`simulated`), or return a copy of the trace of an identical earlier call;
    ``cached=False``: run it again (a test that records what happens during the run)."""
    # (torch's thread count is part of the key: a test that sets it changes the float sums)
    key = (config.model_dump_json(), id(ALGORITHMS.get(config.algorithm.name)),
           torch.get_num_threads(), fresh_objects, group_size, workers)
    if not cached or key not in _SIMULATED:
        _SIMULATED[key] = simulated(config, fresh_objects=fresh_objects,
                                    group_size=group_size, workers=workers)
    trace = _SIMULATED[key]
    return replace(trace, metrics=copy.deepcopy(trace.metrics),
                   server_state=copy.deepcopy(trace.server_state),
                   client_states=copy.deepcopy(trace.client_states),
                   rows=copy.deepcopy(trace.rows), manifest=copy.deepcopy(trace.manifest))


def simulated(config: ExperimentConfig, *, fresh_objects: bool = False,
              group_size: int = 1, workers: int = 1) -> Trace:
    """Run ``config``'s first seed on the production round loop in this process
    (:class:`~raysim.rounds.round_loop.RoundLoop` over :class:`~raysim.rounds.in_process.
    InProcessWorkers`), its algorithm in the layers its features add and their sampler (the
    clock's, DP's Poisson sampling, else a uniform draw), as the engine's driver assembles it.
    ``fresh_objects``: new algorithm objects every round, server and client states
    round-tripped through a checkpoint's state file (as after a resume). ``group_size``:
    clients per reduce group; ``workers``: workers holding contiguous blocks of groups."""
    seed = config.seeds[0]
    dataset, partition = prepare(config, None)[seed]
    algorithm_class = ALGORITHMS[config.algorithm.name]
    if algorithm_class.pooled:
        partition = pooled(partition, len(dataset.test_y))
    context = run_context(config, dataset, seed, partition.num_clients)
    start = initial_weights(config, dataset, seed)
    runtime = ClientRuntime(
        context, ClientData(dataset.train_x, dataset.train_y, partition.train, start),
        torch.device("cpu"), vectorize=config.engine.vectorize,
        per_client_loop=algorithm_class.per_client_loop,
        compile_step=config.engine.compile_step)
    num_clients = partition.num_clients
    group_of_client = np.arange(num_clients) // group_size
    groups = int(group_of_client.max()) + 1
    worker_of_group = np.arange(groups) * workers // groups  # contiguous blocks of groups
    worker_of_client = worker_of_group[group_of_client]

    def attached(algorithm: Any) -> Any:
        if algorithm.server_holds_inputs:
            algorithm.attach_server_inputs(dataset.train_x, partition.train)
        return algorithm

    made: dict[Any, Any] = {}

    def here(function: Any, *args: Any) -> Any:
        """A feature's work before the first round, in this process (the engine runs it on a
        worker), made once per simulation (a loop per round with fresh objects reuses it)."""
        if function not in made:
            made[function] = function(*args)
        result = made[function]
        return lambda: result

    def started(parts: RunParts) -> RunParts:  # the driver's work before the first round
        parts.before_rounds(RunStart(context, partition, start, here))
        return parts

    def new_loop(state: Any, states: dict[int, Any], first: int, rounds: int,
                 ending: list[Any]) -> tuple[RoundLoop, list[ClientWork]]:
        parts = started(assemble(algorithm_class, config.algorithm, context))
        attached(parts.algorithm)
        works = [ClientWork(attached(compose(algorithm_class, config.algorithm, context)),
                            runtime, w) for w in range(workers)]
        for w, work in enumerate(works):
            held = np.flatnonzero(worker_of_client == w)
            work.set_groups(held, group_of_client[held])
            work.client_states = {c: s for c, s in states.items() if worker_of_client[c] == w}
        loop = build_loop(parts, context, config.training.rounds,
                          worker_of_client=worker_of_client, workers=InProcessWorkers(works),
                          sink=sink, progress=LoopProgress(Durable(first, state, states),
                                                           recorded=first),
                          callbacks=[_Ending(ending)], manifest=trace.manifest.update)
        loop.rounds = min(loop.rounds, rounds)  # one round per loop with fresh objects
        return loop, works

    sink = MemorySink()
    trace = Trace()
    ending: list[Any] = []
    rounds = assemble(algorithm_class, config.algorithm, context).rounds(
        config.training.rounds)  # the driver's round cap (DP's budget)
    if fresh_objects:  # one loop per round from the states read back, as after a resume
        state: Any = None
        states: dict[int, Any] = {}
        for round_ in range(rounds):
            loop, works = new_loop(state, states, round_, round_ + 1, ending)
            if round_ == 0:
                state = loop.algorithm.init_server_state(start)
            state, states = through_state_file((state, states))
            loop.progress.durable = Durable(round_, state, states)
            for work in works:
                work.client_states = {c: s for c, s in states.items()
                                      if worker_of_client[c] == work.index}
            loop.run()
            state, states = ending[-1], loop.workers.snapshot_states()
    else:
        loop, works = new_loop(None, {}, 0, rounds, ending)
        loop.progress.durable = Durable(0, loop.algorithm.init_server_state(start), {})
        loop.run()
        state, states = ending[-1], loop.workers.snapshot_states()
    by_round: list[dict[int, dict[str, float]]] = [{} for _ in range(rounds)]
    for row in sink.rows["clients"]:
        by_round[int(row["round"])][int(row["client"])] = {
            k: float(v) for k, v in row.items()
            if k not in ("round", "client", "num_samples") and "seconds" not in k
            and not (isinstance(v, float) and np.isnan(v))}  # timings differ run to run
    trace.metrics = by_round
    trace.server_state, trace.client_states = state, states
    trace.algorithm, trace.runtime, trace.dataset = loop.algorithm, runtime, dataset
    trace.rows = dict(sink.rows)
    return trace


class _Ending(RoundCallback):
    """Keeps the server state after every round (the loop's own is internal)."""

    def __init__(self, states: list[Any]):
        self.states = states

    def after_record(self, loop: RoundLoop, outcome: RoundOutcome) -> None:
        self.states.append(outcome.state)


def through_state_file(tree: Any) -> Any:
    """``tree`` written to a checkpoint's state file and read back (as after a resume)."""
    with tempfile.TemporaryDirectory() as directory:
        path = save_state(Path(directory) / "state.npz", tree, "test", 1)
        return read_state(path, "test", 1)


def flatten(value: Any) -> list[np.ndarray]:
    """Every array or number inside a (nested) state, in a deterministic order."""
    if isinstance(value, Mapping):
        return [a for k in sorted(value, key=str) for a in flatten(value[k])]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [a for f in dataclasses.fields(value) for a in flatten(getattr(value, f.name))]
    if isinstance(value, list | tuple):
        return [a for v in value for a in flatten(v)]
    if isinstance(value, np.ndarray | np.generic | float | int | bool):
        return [np.asarray(value)]
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu().numpy()]
    return []


def same(a: Any, b: Any, exact: bool) -> bool:
    """Two results trees equal entry by entry: exactly, or up to float summation order."""
    left, right = flatten(a), flatten(b)
    if len(left) != len(right):
        return False
    if exact:
        return all(np.array_equal(x, y, equal_nan=True) for x, y in zip(left, right, strict=True))
    return all(np.allclose(x.astype(float), y.astype(float), rtol=1e-4, atol=1e-5,
                           equal_nan=True) for x, y in zip(left, right, strict=True))


def check_contract(config: ExperimentConfig) -> None:
    """The algorithm contract on one config: new algorithm objects every round, states
    through a checkpoint file and other groupings of clients give the same results."""
    reference = simulate(config)
    restarted = simulate(config, fresh_objects=True)
    assert reference.metrics == restarted.metrics or same(reference.metrics, restarted.metrics,
                                                          exact=True)
    assert same(reference.server_state, restarted.server_state, exact=True)
    assert same(reference.client_states, restarted.client_states, exact=True)
    regrouped = simulate(config, group_size=3)
    assert same(reference.metrics, regrouped.metrics, exact=False)
    assert same(reference.server_state, regrouped.server_state, exact=False)


def fedavg_equivalent(method: Mapping[str, Any], fedavg: Mapping[str, Any],
                      mechanism_on: Mapping[str, Any]) -> None:
    """A method with its mechanism switched off ends with FedAvg's model (to float rounding),
    and with it on ends elsewhere: the check every FedAvg-based method's test makes."""
    for key in fedavg:
        np.testing.assert_allclose(method[key], fedavg[key], rtol=1e-5, atol=1e-6)
    assert any(not np.allclose(mechanism_on[key], fedavg[key], atol=1e-4) for key in fedavg)
