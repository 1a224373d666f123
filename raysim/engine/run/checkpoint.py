"""Durable run state: everything a run needs to continue exactly where it stopped.

A checkpoint holds the server state (whatever the run's algorithm and its layers keep there,
e.g. FedBuff's earlier model versions), every client's persistent state (keyed by client id, so a
resumed run may use a different number of workers), the round counter and the first Parquet
part number written after it. Random streams need no saving beyond the run seed and the round
counter: every draw comes from a counter-based stream (seed, purpose, round, client), so the
round counter *is* the position of every stream.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.errors import RaysimError
from raysim.results.sink import TABLES

CHECKPOINT_FILE = Path("checkpoint") / "latest.pt"
CHECKPOINT_FORMAT = 2
"""The layout of the server states a checkpoint holds; a checkpoint of another layout (one
written before DP and FedBuff became layers around the algorithm) is refused, never restored
in part. Also recorded in the run's manifest (``checkpoint_format``), so that ``--resume``
refuses it before anything starts."""


@dataclass
class Checkpoint:
    """The run state before round ``next_round``."""

    seed: int
    next_round: int
    server_state: Any
    client_states: dict[int, Any]
    next_part: int
    """Parquet parts numbered below this hold exactly the rounds before ``next_round``."""
    format: int = CHECKPOINT_FORMAT


def save_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> Path:
    """Write the checkpoint atomically (temporary file, then rename) over the previous one, as
    a pickle of protocol 5: client states are numpy arrays, which it writes as they are
    (``torch.save`` copied them through its zip records: 9.4 s against 2.0 s for 900 MB)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with open(temporary, "wb") as file:
        pickle.dump(checkpoint.__dict__, file, protocol=5)
    os.replace(temporary, path)
    return path


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's latest checkpoint, or None when it has none; refuses (with one paragraph) a
    checkpoint of another format."""
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    with open(path, "rb") as file:
        stored: Any = {}  # a torch.save archive of early versions holds no format either
        if file.read(4) != _ZIP_MAGIC:
            file.seek(0)
            stored = pickle.load(file)
    if not isinstance(stored, dict) or stored.get("format") != CHECKPOINT_FORMAT:
        raise incompatible_checkpoint(path)
    return Checkpoint(**stored)


def incompatible_checkpoint(path: Path) -> RaysimError:
    """The refusal of a checkpoint of another format."""
    return RaysimError(
        f"Cannot resume from {path}: it was written by an earlier version of raysim, whose "
        f"server states are laid out differently (checkpoint format {CHECKPOINT_FORMAT} is "
        "read here), so it cannot be restored without guessing. The rows of its completed "
        "rounds are kept; to continue the run, resume it with the version that wrote it, or "
        "run the config again without --resume.")


_ZIP_MAGIC = b"PK\x03\x04"
"""The first bytes of a zip archive (the ``torch.save`` file of early versions)."""


def remove_checkpoint(run_dir: Path) -> None:
    """Delete a finished run's checkpoint (its results are complete)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    path.unlink(missing_ok=True)
    path.with_suffix(".tmp").unlink(missing_ok=True)
    if path.parent.is_dir() and not any(path.parent.iterdir()):
        path.parent.rmdir()


def truncate_results(run_dir: Path, next_part: int) -> int:
    """Delete the Parquet parts numbered ``next_part`` or above (rows of rounds after the
    checkpoint, which the resumed run writes again) and stray temporary files; returns how many
    files were removed."""
    removed = 0
    for table in TABLES:
        directory = Path(run_dir) / table
        if not directory.is_dir():
            continue
        for path in directory.iterdir():
            stale_part = (path.name.startswith("part-") and path.suffix == ".parquet"
                          and int(path.stem.split("-")[1]) >= next_part)
            if stale_part or path.name.endswith(".tmp"):
                path.unlink()
                removed += 1
    return removed
