"""raysim: Ray-based simulation of federated learning on medical images.

From Python: ``raysim.run(config, ...)`` runs an experiment and ``raysim.run_sweep(config,
grid)`` a grid of them, each returning its :class:`~raysim.api.Results` (:mod:`raysim.api`);
``raysim.run_estimate(config)`` projects a config's cost as ``raysim estimate`` does (on a
cluster too: ``cluster=[raysim.ClusterShape(nodes, gpus_per_node, link_gbps)]``);
``raysim.load(root, table)`` reads any results table as a pandas DataFrame. They load on first
use, so ``import raysim`` stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["ClusterShape", "Projection", "Results", "load", "run", "run_estimate", "run_sweep"]


def __getattr__(name: str) -> Any:
    if name in ("run", "run_sweep", "run_estimate", "Results", "Projection"):
        from raysim import api

        return getattr(api, name)
    if name == "ClusterShape":
        from raysim.estimator.cluster_projection import ClusterShape

        return ClusterShape
    if name == "load":
        from raysim.results.load import load

        return load
    raise AttributeError(f"module 'raysim' has no attribute {name!r}")
