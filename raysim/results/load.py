"""Read the Parquet results of one run, one experiment or a tree of experiments into pandas."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from raysim.errors import RaysimError
from raysim.results.manifest import MANIFEST, read_manifest
from raysim.results.sink import TABLES

if TYPE_CHECKING:  # pandas is imported on first use: the engine's worker processes load
    import pandas as pd  # this package (its sink) but never read tables


def run_dirs(path: str | Path) -> list[Path]:
    """Every run directory (one holding a manifest) at or below ``path``."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return [path]
    return sorted(manifest.parent for manifest in path.rglob(MANIFEST))


def _config_order(directory: Path, manifest: dict) -> tuple[str, int, str, int]:
    """Where a run comes in a table: by the directory above its own (the run root of a
    variant's run, the results parent of a root's), then its variant's place in the config
    (the order the config lists them), then its directory's name, then seed."""
    return (str(directory.parent.parent), int(manifest.get("variant_index", 0)),
            directory.parent.name, int(manifest.get("seed", 0)))


def read_part(path: Path) -> pa.Table:
    """One Parquet part, its pages' checksums verified (parts written by raysim carry them);
    a damaged or truncated part is refused with one paragraph naming it and how to recover."""
    try:
        return pq.read_table(path, page_checksum_verification=True)
    except (OSError, pa.ArrowException) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        run = path.parent.parent
        raise RaysimError(
            f"Cannot read {path}: it is damaged ({reason}); its rows cannot be trusted, so "
            "none of them is returned. Restore the file from a copy of the results; or delete "
            f"the run's directory ({run}) and run the same config with `--resume` on its run "
            "root, which runs that seed again from its first round (an interrupted run resumed "
            "from its checkpoint rewrites only the parts after it).") from None


def load(path: str | Path, table: str = "rounds") -> pd.DataFrame:
    """One DataFrame of ``table`` for every run under ``path``.

    Tables: ``rounds`` (one row per round: global metrics, bytes, phase seconds), ``clients``
    (per client and round: train_loss, num_samples, ...), ``client_eval`` (personal models on
    their own test shares and the global test set), ``communication`` (bytes by direction and
    message type), ``selection`` (routing counts), ``system`` (with ``system:``: every selected
    client's simulated times and outcome), ``transfers`` (when the driver and the workers span
    several Ray nodes: per round, bytes and objects handed off between nodes by kind,
    broadcast, partial or relay, and link, ``in``/``out`` of the driver's node, ``between``
    worker nodes or ``local``). Columns ``experiment``, ``name``, ``algorithm``,
    ``seed`` and ``run`` say which run a row belongs to, ``status`` whether it is running,
    completed, failed or diverged; runs of a sweep also get one column per swept key (e.g.
    ``training.optimizer.lr``).
    Works while runs are still writing.
    """
    import pandas as pd

    if table not in TABLES:
        raise RaysimError(f"Unknown results table {table!r}; the tables are {', '.join(TABLES)}.")
    directories = run_dirs(path)
    if not directories:
        raise RaysimError(
            f"No raysim runs under {str(path)!r} (no {MANIFEST} found). Pass a directory that "
            "`raysim run` wrote, e.g. results/quickstart-<timestamp>."
        )
    manifests = {directory: read_manifest(directory) for directory in directories}
    directories = sorted(directories, key=lambda d: _config_order(d, manifests[d]))
    frames = []
    for directory in directories:
        manifest = manifests[directory]
        parts = sorted((directory / table).glob("part-*.parquet"))
        if not parts:
            continue
        frame = pd.concat([read_part(part).to_pandas() for part in parts], ignore_index=True)
        meta = {"experiment": directory.parent.name, "name": manifest["name"],
                "algorithm": manifest["algorithm"], "seed": manifest["seed"],
                "run": str(directory), "status": manifest.get("status", "unknown")}
        grid = manifest.get("grid", {})  # a sweep's configuration, one column per key
        columns = pd.DataFrame({key: [value] * len(frame)
                                for key, value in {**meta, **grid}.items()}, index=frame.index)
        frame = pd.concat([columns[list(meta)], frame, columns[list(grid)]], axis=1)
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["experiment", "name", "algorithm", "seed", "run", "status"])
    return pd.concat(frames, ignore_index=True)
