"""The simulated clock in the results: columns of ``rounds`` and ``clients``, and the
``system`` table (one row per selected client and round, dropped ones included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.system.clock import TRAINED, RoundPlan


def plan_columns(plan: RoundPlan) -> dict[str, Any]:
    """The round's simulated start and end, and how many selected clients were dropped."""
    statuses = [t.status for t in plan.timings]
    return {"sim_start_s": plan.start, "sim_end_s": plan.end,
            "sim_hours": plan.end / 3600.0,
            "clients_selected": len(statuses),
            "clients_dropped": sum(s != TRAINED for s in statuses)}


def plan_table(plan: RoundPlan, tiers: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """One row per selected client, as columns: its tier (where profiles come from tiers),
    times, outcome and (FedBuff) staleness; rows by client, then start."""
    timings = sorted(plan.timings, key=lambda t: (t.client, t.start))
    count = len(timings)
    values = np.array([(t.client, t.start, t.download_s, t.compute_s, t.upload_s,
                        t.start_version) for t in timings], dtype=float).reshape(count, 6)
    client = values[:, 0].astype(np.int64)
    start, download, compute, upload = (values[:, k] for k in range(1, 5))
    version = values[:, 5].astype(np.int64)
    weights = plan.staleness_weights
    return {"round": np.full(count, plan.round, dtype=np.int64), "client": client,
            "tier": np.array([tiers[c] for c in client.tolist()] if tiers else [""] * count,
                             dtype=object),
            "outcome": np.array([t.status for t in timings], dtype=object),
            "start_s": start, "download_s": download, "compute_s": compute,
            "upload_s": upload, "finish_s": start + download + compute + upload,
            "start_version": version,
            "staleness": np.where(version >= 0, plan.round - version, 0),
            "staleness_weight": np.array([weights.get(c, 1.0) for c in client.tolist()],
                                         dtype=float)}


def client_clock_columns(plan: RoundPlan, clients: np.ndarray) -> dict[str, np.ndarray]:
    """Each trained client's simulated times, aligned with the ``clients`` rows (NaN for a
    row whose client did not train in the plan)."""
    trained = [t for t in plan.timings if t.status == TRAINED]
    ids = np.array([t.client for t in trained], dtype=np.int64)
    times = np.array([(t.download_s, t.compute_s, t.upload_s, t.finish) for t in trained],
                     dtype=float).reshape(len(trained), 4)
    order = np.argsort(ids, kind="stable")
    ids, times = ids[order], times[order]
    rows = np.asarray(clients, dtype=np.int64)
    position = np.searchsorted(ids, rows, side="right") - 1  # a client's last timing
    found = (position >= 0) & (ids[np.maximum(position, 0)] == rows) if len(ids) else \
        np.zeros(len(rows), dtype=bool)
    aligned = np.full((len(rows), 4), np.nan)
    aligned[found] = times[position[found]]
    return {key: aligned[:, k] for k, key in enumerate(("sim_download_s", "sim_compute_s",
                                                       "sim_upload_s", "sim_finish_s"))}
