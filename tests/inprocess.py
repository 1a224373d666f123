"""A Ray-free stand-in for the engine's round loop (tests only): one process plays the driver
and every worker, with the same hooks in the same order (broadcast, migration, local updates,
per-group reduce, aggregate, state moves). Used to check the algorithm contract: results do
not depend on the algorithm object surviving between rounds, on writing the states to a
checkpoint's file, or on how clients are grouped."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.algorithms import ALGORITHMS
from raysim.config import ExperimentConfig
from raysim.layers.assembly import compose
from raysim.preparation import initial_weights, pooled, prepare, run_context
from raysim.state_codec import read_state, save_state
from raysim.system.plan import architecture_flops
from raysim.system.planning import ClockSettings, plan_for_run
from raysim.training.context import ClientData, RunContext
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


def simulate(config: ExperimentConfig, *, fresh_objects: bool = False,
             group_size: int = 1) -> Trace:
    """Run ``config``'s first seed for its rounds, every client every round (with ``system:``,
    the clients the clock's plan trains), the algorithm composed with the layers the config
    asks for (DP, FedBuff) as the engine composes it. ``fresh_objects``: new algorithm
    objects every round, server and client states round-tripped through a checkpoint's state
    file (as after a resume). ``group_size``: clients per reduce group."""
    seed = config.seeds[0]
    dataset, partition = prepare(config, None)[seed]
    algorithm_class = ALGORITHMS[config.algorithm.name]
    if algorithm_class.pooled:
        partition = pooled(partition, len(dataset.test_y))
    context = run_context(config, dataset, seed, partition.num_clients)
    start = initial_weights(config, dataset, seed)

    plan = None
    if config.system is not None:
        plan = plan_for_run(ClockSettings(config.system, config.clients_per_round), context,
                            partition, start, architecture_flops(context, partition.num_clients))

    def new_algorithm(server: bool = True) -> Any:
        algorithm = compose(algorithm_class, config.algorithm, context,
                            plan=(lambda: plan) if server and plan is not None else None)
        if algorithm.server_holds_inputs:
            algorithm.attach_server_inputs(dataset.train_x, partition.train)
        return algorithm

    runtime = ClientRuntime(
        RunContext(seed, dataset.info, config.model, config.training, len(partition.train),
                   len(partition.train), context.architectures, context.downsample),
        ClientData(dataset.train_x, dataset.train_y, partition.train, start),
        torch.device("cpu"), vectorize=config.engine.vectorize)
    server, client_side = new_algorithm(), new_algorithm(server=False)
    state = server.init_server_state(start)
    trace = Trace()
    client_states: dict[int, Any] = {}
    for round_ in range(config.training.rounds):
        clients = (list(range(partition.num_clients)) if plan is None
                   else plan.records.trained(round_).tolist())
        groups = [clients[i:i + group_size] for i in range(0, len(clients), group_size)]
        if fresh_objects:
            server, client_side = new_algorithm(), new_algorithm(server=False)
            state, client_states = through_state_file((state, client_states))
        message = server.broadcast(state, round_)
        destination = server.migration(round_)
        results = {}
        for group in groups:  # one worker call per group, as in the engine
            results.update(zip(group, client_side.local_updates(
                runtime, group, round_, message, [client_states.get(c) for c in group]),
                strict=True))
        partials = [p for group in groups
                    if (p := client_side.reduce([(c, results[c]) for c in group])) is not None]
        state = server.aggregate(state, partials, round_)
        client_states = {c: r.state for c, r in results.items() if r.state is not None}
        if destination is not None:
            client_states = {int(destination[c]): s for c, s in client_states.items()}
        trace.metrics.append({c: {**{k: v for k, v in r.metrics.items() if "seconds" not in k},
                                  **({} if r.train_loss is None else {"train_loss": r.train_loss})}
                              for c, r in results.items()})  # timings differ run to run
    trace.server_state, trace.client_states = state, client_states
    trace.algorithm, trace.runtime, trace.dataset = server, runtime, dataset
    return trace


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
