"""The simulated clock in the results: columns of ``rounds`` and ``clients``, and the
``system`` table (one row per selected client and round, dropped ones included).

:class:`ClockRecords` computes every round's rows for the whole plan at once, with array
operations over all rounds' clients (while the workers are configured, with the plan); the
round loop then takes each round's slices, not a dozen array operations per round on the
driver between rounds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from raysim.system.clock import OUTCOME_DTYPE, TRAINED, RoundPlan

CLOCK_COLUMNS = ("sim_download_s", "sim_compute_s", "sim_upload_s", "sim_finish_s")
"""The ``clients`` table's columns of each trained client's simulated times."""
BUFFER_COLUMNS = ("fedbuff_weight", "fedbuff_start_version")
"""FedBuff: the ``clients`` table's columns of each trained client's staleness weight and
the server version it trained from (as floats, like the algorithms' other client columns)."""


class ClockRecords:
    """Every round's clock records: the ``rounds`` row's columns, the ``system`` table's rows
    (by client, then start), and the trained clients (ascending, each once) with their
    simulated times and, for FedBuff, start versions and staleness weights."""

    def __init__(self, rounds: Sequence[RoundPlan], tiers: Sequence[str] | np.ndarray = (),
                 buffered: bool = False):
        count = len(rounds)
        sizes = np.array([len(plan.clients) for plan in rounds], dtype=np.int64)
        position = np.repeat(np.arange(count, dtype=np.int64), sizes)  # each row's round
        round_of = np.repeat(np.array([plan.round for plan in rounds], dtype=np.int64), sizes)

        def joined(name: str, dtype: Any) -> np.ndarray:
            parts = [getattr(plan, name) for plan in rounds]
            return np.concatenate(parts).astype(dtype, copy=False) if parts else \
                np.zeros(0, dtype=dtype)

        client, start = joined("clients", np.int64), joined("starts", float)
        download, compute, upload = (joined("download_s", float), joined("compute_s", float),
                                     joined("upload_s", float))
        outcome, version = joined("outcomes", OUTCOME_DTYPE), joined("start_versions", np.int64)
        weight = joined("staleness_weights", float)
        finish = start + download + compute + upload
        # the system table: rows by round, then client, then start
        order = np.lexsort((start, client, position))
        self._table = {
            "round": round_of[order], "client": client[order],
            "tier": (np.asarray(tiers, dtype=object)[client[order]] if len(tiers)
                     else np.full(len(order), "", dtype=object)),
            "outcome": outcome[order].astype(object), "start_s": start[order],
            "download_s": download[order], "compute_s": compute[order],
            "upload_s": upload[order], "finish_s": finish[order],
            "start_version": version[order],
            "staleness": np.where(version[order] >= 0, round_of[order] - version[order], 0),
            "staleness_weight": weight[order]}
        self._table_bounds = np.searchsorted(position[order], np.arange(count + 1))
        # the trained clients by round, then client (a client trains at most once a round:
        # a synchronous round selects without replacement, a FedBuff site waits in the buffer)
        trained = outcome == TRAINED
        used = np.flatnonzero(trained)
        used = used[np.lexsort((client[used], position[used]))]
        self._trained = client[used]
        self._clock_names = CLOCK_COLUMNS + (BUFFER_COLUMNS if buffered else ())
        self._clock = np.stack([download[used], compute[used], upload[used], finish[used],
                                *([weight[used], version[used].astype(float)] if buffered
                                  else [])], axis=1)
        self._versions, self._weights = version[used], weight[used]
        self._trained_bounds = np.searchsorted(position[used], np.arange(count + 1))
        dropped = np.bincount(position[~trained], minlength=count)
        self._columns = [{"sim_start_s": plan.start, "sim_end_s": plan.end,
                          "sim_hours": plan.end / 3600.0, "clients_selected": int(size),
                          "clients_dropped": int(drops)}
                         for plan, size, drops in zip(rounds, sizes, dropped, strict=True)]

    def columns(self, round_: int) -> dict[str, Any]:
        """The round's simulated start and end, and how many selected clients were dropped."""
        return dict(self._columns[round_])

    def table(self, round_: int) -> dict[str, np.ndarray]:
        """The round's ``system`` rows, as columns: each selected client's tier (where
        profiles come from tiers), times, outcome and (FedBuff) staleness; by client, then
        start."""
        lo, hi = self._table_bounds[round_], self._table_bounds[round_ + 1]
        return {name: values[lo:hi] for name, values in self._table.items()}

    def trained(self, round_: int) -> np.ndarray:
        """The clients whose updates the round uses, ascending."""
        return self._trained[self._trained_bounds[round_]:self._trained_bounds[round_ + 1]]

    def buffered(self, round_: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FedBuff: the round's trained clients (ascending), each one's start version and
        staleness weight."""
        lo, hi = self._trained_bounds[round_], self._trained_bounds[round_ + 1]
        return self._trained[lo:hi], self._versions[lo:hi], self._weights[lo:hi]

    def clock_columns(self, round_: int, clients: np.ndarray) -> dict[str, np.ndarray]:
        """Each trained client's simulated times (:data:`CLOCK_COLUMNS`) and, for FedBuff, its
        staleness weight and start version (:data:`BUFFER_COLUMNS`), aligned with the
        ``clients`` rows (NaN for a row whose client did not train in the round)."""
        lo, hi = self._trained_bounds[round_], self._trained_bounds[round_ + 1]
        ids, times = self._trained[lo:hi], self._clock[lo:hi]
        rows = np.asarray(clients, dtype=np.int64)
        if not np.array_equal(rows, ids):  # (the rows are the trained clients in a run)
            position = np.searchsorted(ids, rows)
            inside = np.minimum(position, max(len(ids) - 1, 0))
            found = (position < len(ids)) & (ids[inside] == rows) if len(ids) else \
                np.zeros(len(rows), dtype=bool)
            times = np.full((len(rows), len(self._clock_names)), np.nan)
            times[found] = self._clock[lo:hi][position[found]]
        return {key: times[:, k] for k, key in enumerate(self._clock_names)}
