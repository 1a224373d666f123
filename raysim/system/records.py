"""The simulated clock in the results: columns of ``rounds`` and ``clients``, and the
``system`` table (one row per selected client and round, dropped ones included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.system.clock import TRAINED, RoundPlan


def plan_columns(plan: RoundPlan) -> dict[str, Any]:
    """The round's simulated start and end, and how many selected clients were dropped."""
    return {"sim_start_s": plan.start, "sim_end_s": plan.end,
            "sim_hours": plan.end / 3600.0,
            "clients_selected": len(plan.clients),
            "clients_dropped": int(np.count_nonzero(plan.outcomes != TRAINED))}


def plan_table(plan: RoundPlan, tiers: Sequence[str] | np.ndarray = ()
               ) -> dict[str, np.ndarray]:
    """One row per selected client, as columns: its tier (where profiles come from tiers),
    times, outcome and (FedBuff) staleness; rows by client, then start."""
    order = np.lexsort((plan.starts, plan.clients))
    client = plan.clients[order]
    count = len(client)
    version = plan.start_versions[order]
    start, download, compute, upload = (plan.starts[order], plan.download_s[order],
                                        plan.compute_s[order], plan.upload_s[order])
    return {"round": np.full(count, plan.round, dtype=np.int64), "client": client,
            "tier": (np.asarray(tiers, dtype=object)[client] if len(tiers)
                     else np.full(count, "", dtype=object)),
            "outcome": plan.outcomes[order].astype(object),
            "start_s": start, "download_s": download, "compute_s": compute,
            "upload_s": upload, "finish_s": start + download + compute + upload,
            "start_version": version,
            "staleness": np.where(version >= 0, plan.round - version, 0),
            "staleness_weight": plan.staleness_weights[order]}


def client_clock_columns(plan: RoundPlan, clients: np.ndarray) -> dict[str, np.ndarray]:
    """Each trained client's simulated times, aligned with the ``clients`` rows (NaN for a
    row whose client did not train in the plan)."""
    used = plan.outcomes == TRAINED
    ids = plan.clients[used]
    times = np.stack([plan.download_s[used], plan.compute_s[used], plan.upload_s[used],
                      plan.finish[used]], axis=1)
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
