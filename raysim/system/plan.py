"""A run's system plan: the sites' profiles, each client's work and message sizes, and the
clock's decision for every round (computed before the first round, by the run's driver:
:mod:`raysim.system.planning`)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from raysim.configuration.schema import SystemConfig
from raysim.system.clock import RoundPlan, Workload, synchronous_plan
from raysim.system.fedbuff_clock import fedbuff_plan
from raysim.system.profiles import SiteProfile, site_profiles
from raysim.system.records import ClockRecords
from raysim.training.context import RunContext

TRAINING_FLOPS_PER_FORWARD = 3.0
"""A training step of a sample costs about three forward passes (forward, and a backward of
about twice the forward's FLOPs), the usual estimate (e.g. Kaplan et al. 2020)."""


@dataclass(frozen=True, eq=False)
class SystemPlan:
    """What the round loop needs from ``system:``."""

    policy: str
    rounds: tuple[RoundPlan, ...]
    tiers: np.ndarray
    """Each site's tier ("" for profiles not drawn from tiers), an object array (the driver
    needs no more of the profiles: the clock was computed from them already)."""
    records: ClockRecords
    """Every round's rows and trained clients, computed with the plan."""

    @property
    def asynchronous(self) -> bool:
        return self.policy == "fedbuff"

    @functools.cached_property
    def last_use(self) -> dict[int, int]:
        """FedBuff: the last round whose clients start from each server version."""
        return {int(version): plan.round
                for plan in self.rounds for version in np.unique(plan.start_versions)}


ArchitectureKey = tuple[str, tuple[int, ...]]
"""An architecture's config (JSON) and the input shape a client feeds it."""


def _client_keys(context: RunContext, num_clients: int) -> list[ArchitectureKey]:
    """Each client's architecture key (:meth:`RunContext.architecture` at its input size),
    in client order."""
    from raysim.models.costs import client_input_shape

    configs: dict[int, str] = {}  # each architecture object's config, dumped once
    keys = []
    for client in range(num_clients):
        architecture = context.architecture(client)
        if id(architecture) not in configs:
            configs[id(architecture)] = architecture.model_dump_json()
        factor = context.downsample[client] if context.downsample else 1
        keys.append((configs[id(architecture)],
                     client_input_shape(context.info.input_shape, factor)))
    return keys


def architecture_flops(context: RunContext, num_clients: int) -> dict[ArchitectureKey, float]:
    """The forward FLOPs of one sample for every distinct (architecture, input shape) of the
    run's clients. torch's FLOP counter imports ``torch._dynamo`` on first use (0.8 s of CPU
    on the development machine), which a client worker imports anyway for its optimizer: the
    engine asks a worker (``ClientWorker.architecture_flops``), so the driver never pays it."""
    from raysim.models.costs import forward_flops
    from raysim.models.registry import build_model

    flops: dict[ArchitectureKey, float] = {}
    for client, key in enumerate(_client_keys(context, num_clients)):
        if key not in flops:
            model = build_model(context.architecture(client), context.info)
            flops[key] = float(forward_flops(model, key[1]))
    return flops


def client_work(context: RunContext, sizes: np.ndarray, flops: Mapping[ArchitectureKey, float]
                ) -> np.ndarray:
    """Each client's training GFLOPs per round: 3 x its model's forward FLOPs at its input
    size (``flops``: :func:`architecture_flops`) x the samples it trains on (epochs x its
    data, or steps x batch)."""
    training = context.training
    work = np.zeros(len(sizes))
    for client, (key, size) in enumerate(zip(_client_keys(context, len(sizes)), sizes,
                                             strict=True)):
        samples = (training.local_steps * training.batch_size if training.local_steps
                   else (training.epochs or 1) * int(size))
        work[client] = TRAINING_FLOPS_PER_FORWARD * flops[key] * samples / 1e9
    return work


def system_plan(config: SystemConfig, workload: Workload, rounds: int,
                clients_per_round: int, seed: int,
                profiles: list[SiteProfile] | None = None) -> SystemPlan:
    """The clock's plan of every round for a run's seed. ``profiles``: the sites' profiles, when already drawn
    (:func:`~raysim.system.profiles.site_profiles` of the config, clients and seed)."""
    if profiles is None:
        profiles = site_profiles(config, len(workload.train_gflop), seed)
    if config.policy == "fedbuff":
        buffer = config.buffer_size or clients_per_round
        concurrency = config.concurrency or 2 * buffer
        plans = fedbuff_plan(profiles, workload, rounds, buffer, concurrency,
                             config.staleness_exponent, seed)
    else:
        plans = synchronous_plan(profiles, workload, rounds, clients_per_round, config.policy,
                                 seed, config.deadline_s, config.over_selection)
    tiers = np.array([profile.tier for profile in profiles], dtype=object)
    records = ClockRecords(plans, tiers, buffered=config.policy == "fedbuff")
    plan = SystemPlan(config.policy, tuple(plans), tiers, records)
    if plan.asynchronous:
        _ = plan.last_use  # (computed here, in the planning thread, not between rounds)
    return plan
