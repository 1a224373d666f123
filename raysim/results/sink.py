"""Streaming Parquet sink: rows are buffered per table and flushed into part files that are
complete the moment they appear (written under a temporary name, then renamed), with a CRC
checksum on every page, which :func:`raysim.results.load.read_part` verifies."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.errors import not_writable
from raysim.results.atomic import discard
from raysim.results.manifest import resume_hint

TABLES = ("rounds", "clients", "client_eval", "communication", "selection", "system",
          "transfers")


class ParquetSink:
    """Writes ``<run_dir>/<table>/part-NNNNNN.parquet``; pandas can read them at any time."""

    def __init__(self, run_dir: Path, flush_seconds: float = 2.0):
        self.run_dir = Path(run_dir)
        self.flush_seconds = flush_seconds
        self._buffers: dict[str, list[_Rows | dict[str, np.ndarray]]] = defaultdict(list)
        self._part = self._next_part_number()
        self._last_flush = time.monotonic()

    def _next_part_number(self) -> int:
        numbers = [int(path.stem.split("-")[1]) for path in self.run_dir.glob("*/part-*.parquet")]
        return max(numbers, default=-1) + 1

    @property
    def next_part(self) -> int:
        """The number the next part file will get."""
        return self._part

    def add(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Buffer rows (dicts; missing keys become nulls) for a table (copies of the dicts,
        converted at the flush: consecutive batches of rows in one go, one conversion per
        flush rather than one per round)."""
        if rows:
            self._buffers[table].append(_Rows([dict(row) for row in rows]))

    def add_columns(self, table: str, columns: dict[str, np.ndarray]) -> None:
        """Buffer a batch of rows given as equal-length numpy columns (kept as they are until
        the flush, which converts consecutive batches of the same columns in one go; the
        arrays must not change meanwhile)."""
        self._buffers[table].append(columns)

    def maybe_flush(self) -> bool:
        """Flush if ``flush_seconds`` have passed since the last flush."""
        if time.monotonic() - self._last_flush >= self.flush_seconds:
            self.flush()
            return True
        return False

    def flush(self) -> None:
        """Write every non-empty buffer as one new part file per table. A column batch that
        Arrow cannot convert is dropped and its error raised after every row that converts
        is written (a bad batch never takes the good rows with it, nor fails a later flush)."""
        wrote = False
        errors: list[Exception] = []
        for table, parts in self._buffers.items():
            if not parts:
                continue
            tables, failed = _as_tables(parts)
            parts.clear()
            errors += failed
            if not tables:
                continue
            directory = self.run_dir / table
            final = directory / f"part-{self._part:06d}.parquet"
            temporary = directory / f".part-{self._part:06d}.parquet.tmp"
            try:
                directory.mkdir(parents=True, exist_ok=True)
                pq.write_table(pa.concat_tables(tables, promote_options="permissive"),
                               temporary, write_page_checksum=True)  # (verified by load)
                os.replace(temporary, final)
            except OSError as error:  # (pyarrow's IO errors are OSErrors with the errno)
                discard(temporary)
                raise not_writable(final, error, resume_hint(self.run_dir)) or error from None
            wrote = True
        if wrote:
            self._part += 1
        self._last_flush = time.monotonic()
        if errors:
            raise errors[0]


_CONVERSION_ERRORS = (pa.ArrowException, TypeError, ValueError)


@dataclass
class _Rows:
    """A batch of row dicts buffered by :meth:`ParquetSink.add`."""

    rows: list[dict[str, Any]]


def _rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Row dicts as one table: the union of their keys in first-seen order, nulls where a
    row lacks one."""
    columns = dict.fromkeys(key for row in rows for key in row)
    return pa.Table.from_pydict({key: [row.get(key) for row in rows] for key in columns})


def _as_tables(parts: list[_Rows | dict[str, np.ndarray]]
               ) -> tuple[list[pa.Table], list[Exception]]:
    """Buffered parts as Arrow tables, in order: each run of consecutive column batches with
    the same columns and dtypes concatenated per column and converted once, each run of
    consecutive row batches converted once (one conversion per flush rather than one per
    round); where that fails, batch by batch. Returns the tables and the errors of the
    batches that did not convert."""
    tables: list[pa.Table] = []
    errors: list[Exception] = []
    run: list[Any] = []

    def one_by_one(convert: Callable[[Any], pa.Table]) -> None:
        for batch in run:  # the batches that convert keep their rows
            try:
                tables.append(convert(batch))
            except _CONVERSION_ERRORS as error:
                errors.append(error)

    def close_run() -> None:
        if not run:
            return
        if isinstance(run[0], _Rows):
            try:
                tables.append(_rows_table([row for batch in run for row in batch.rows]))
            except _CONVERSION_ERRORS:
                one_by_one(lambda batch: _rows_table(batch.rows))
        else:
            try:
                tables.append(pa.table({key: np.concatenate([batch[key] for batch in run])
                                        for key in run[0]}))
            except _CONVERSION_ERRORS:
                one_by_one(pa.table)
        run.clear()

    signature: tuple[Any, ...] = ()
    for part in parts:
        part_signature = _signature(part)
        if run and part_signature != signature:
            close_run()
        signature = part_signature
        run.append(part)
    close_run()
    return tables, errors


def _signature(part: _Rows | dict[str, np.ndarray]) -> tuple[Any, ...]:
    """What a run of parts converted together must share: being rows, or the same columns
    and dtypes."""
    if isinstance(part, _Rows):
        return ("rows",)
    return tuple((key, np.asarray(value).dtype) for key, value in part.items())
