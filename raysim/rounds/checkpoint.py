"""Durable run state: everything a run needs to continue exactly where it stopped.

A checkpoint holds the server state (whatever the run's algorithm and its layers keep there,
e.g. FedBuff's earlier model versions), every client's persistent state (keyed by client id, so a
resumed run may use a different number of workers), the round counter and the first Parquet
part number written after it. Random streams need no saving beyond the run seed and the round
counter: every draw comes from a counter-based stream (seed, purpose, round, client), so the
round counter *is* the position of every stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raysim.errors import RaysimError, not_writable
from raysim.results.manifest import resume_hint
from raysim.results.sink import TABLES
from raysim.state_codec import StateFileError, read_header, read_state, save_state

CHECKPOINT_FILE = Path("checkpoint") / "latest.npz"
CHECKPOINT_FORMAT = 3
"""The layout of a checkpoint: 3 is a state file (:mod:`raysim.state_codec`: arrays and JSON,
nothing that runs code when read) of server states laid out with DP and FedBuff as layers
around the algorithm. A checkpoint of another format (the pickles of earlier versions, which
could run code when loaded) is refused, never read. Also recorded in the run's manifest
(``checkpoint_format``), so that ``--resume`` refuses it before anything starts."""

EARLIER_CHECKPOINT_FILES = (Path("checkpoint") / "latest.pt",)
"""Where earlier versions kept their (pickled) checkpoint; refused, never read."""

_KIND = "checkpoint"


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
    a state file: numpy arrays as they are, the rest as JSON."""
    path = Path(run_dir) / CHECKPOINT_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return save_state(path, dict(checkpoint.__dict__), _KIND, CHECKPOINT_FORMAT)
    except OSError as error:  # (save_state leaves no temporary file; the previous one stays)
        raise not_writable(path, error, resume_hint(Path(run_dir))) or error from None


def load_checkpoint(run_dir: Path) -> Checkpoint | None:
    """The run's latest checkpoint, or None when it has none; refuses (with one paragraph
    naming the file) a checkpoint of another format or a damaged one, checking the format
    before it decodes anything."""
    check_checkpoint(run_dir)
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    try:
        stored = read_state(path, _KIND, CHECKPOINT_FORMAT)
        return Checkpoint(**stored)
    except (StateFileError, TypeError) as error:
        raise unreadable_checkpoint(path, str(error)) from None


def check_checkpoint(run_dir: Path) -> None:
    """Refuse, before anything starts, a run whose checkpoint is of an earlier format or is
    not a raysim checkpoint (reads the file's header only)."""
    for earlier in EARLIER_CHECKPOINT_FILES:
        if (Path(run_dir) / earlier).is_file():
            raise incompatible_checkpoint(Path(run_dir) / earlier)
    path = Path(run_dir) / CHECKPOINT_FILE
    if not path.is_file():
        return
    try:
        header = read_header(path)
    except (StateFileError, OSError) as error:
        raise unreadable_checkpoint(path, str(error)) from None
    if header.get("kind") != _KIND or header.get("version") != CHECKPOINT_FORMAT:
        raise incompatible_checkpoint(path)


def incompatible_checkpoint(path: Path) -> RaysimError:
    """The refusal of a checkpoint of another format."""
    return RaysimError(
        f"Cannot resume from {path}: it was written by an earlier version of raysim (checkpoint "
        f"format {CHECKPOINT_FORMAT} is read here), either as a pickle, which can run code when "
        "it is loaded and is therefore never read, or with server states laid out differently. "
        "The rows of its completed rounds are kept; to continue the run, resume it with the "
        "version that wrote it (only if you trust the file), or run the config again without "
        "--resume.")


def unreadable_checkpoint(path: Path, reason: str) -> RaysimError:
    """The refusal of a damaged checkpoint, or of a file that is no raysim checkpoint."""
    return RaysimError(
        f"Cannot resume from {path}: {reason}. raysim reads only checkpoints it wrote (arrays "
        "and JSON; nothing in one can run code). The rows of the run's completed rounds are "
        "kept; to continue, restore the file from a copy, or delete the run's seed_<s> "
        "directory and resume again, which runs that seed from its first round.")


def remove_checkpoint(run_dir: Path) -> None:
    """Delete a finished run's checkpoint (its results are complete)."""
    path = Path(run_dir) / CHECKPOINT_FILE
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".tmp").unlink(missing_ok=True)
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
