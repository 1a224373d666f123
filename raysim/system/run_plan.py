"""The system plan of one run from its config, context and partition (runner side)."""

from __future__ import annotations

from typing import Any

from raysim.config import ExperimentConfig
from raysim.data import Partition
from raysim.system.clock import Workload
from raysim.system.plan import SystemPlan, client_work, system_plan
from raysim.training.context import RunContext
from raysim.training.weights import payload_bytes


def plan_for_run(config: ExperimentConfig, context: RunContext, partition: Partition,
                 initial_weights: Any) -> SystemPlan:
    """Every round's clock for the run: the sites' profiles, each client's training GFLOPs
    (its architecture at its input size, its data) and the model's bytes both ways (FedScale's
    assumption: an upload is model-sized)."""
    assert config.system is not None
    architectures = context.architectures or (config.model,)
    work = client_work(context.info, architectures, context.downsample, partition.sizes(),
                       config.training)
    size = float(payload_bytes(initial_weights))
    return system_plan(config.system, Workload(work, size, size), config.training.rounds,
                       config.clients_per_round, context.seed)
