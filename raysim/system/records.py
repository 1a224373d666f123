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


def plan_rows(plan: RoundPlan, tiers: Sequence[str] = ()) -> list[dict[str, Any]]:
    """One row per selected client: its tier (where profiles come from tiers), times, outcome
    and (FedBuff) staleness."""
    return [{"round": plan.round, "client": t.client,
             "tier": tiers[t.client] if tiers else "", "outcome": t.status,
             "start_s": t.start, "download_s": t.download_s, "compute_s": t.compute_s,
             "upload_s": t.upload_s, "finish_s": t.finish,
             "start_version": t.start_version,
             "staleness": (plan.round - t.start_version) if t.start_version >= 0 else 0,
             "staleness_weight": plan.staleness_weights.get(t.client, 1.0)}
            for t in sorted(plan.timings, key=lambda t: (t.client, t.start))]


def client_clock_columns(plan: RoundPlan, clients: np.ndarray) -> dict[str, np.ndarray]:
    """Each trained client's simulated times, aligned with the ``clients`` rows."""
    by_client = {t.client: t for t in plan.timings if t.status == TRAINED}
    columns: dict[str, list[float]] = {"sim_download_s": [], "sim_compute_s": [],
                                       "sim_upload_s": [], "sim_finish_s": []}
    for client in clients.tolist():
        timing = by_client.get(int(client))
        values = ((timing.download_s, timing.compute_s, timing.upload_s, timing.finish)
                  if timing is not None else (np.nan,) * 4)
        for key, value in zip(columns, values, strict=True):
            columns[key].append(value)
    return {key: np.asarray(values, dtype=float) for key, values in columns.items()}
