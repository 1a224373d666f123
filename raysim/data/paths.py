"""Where a config's data path is read: the one rule every loader and the estimator share."""

from __future__ import annotations

from pathlib import Path


def under_data_root(path: str, data_root: str | None) -> Path:
    """``path`` (``~`` expanded) as the loaders read it: a relative path under ``--data-root``
    when one is given, else as it is (the current directory)."""
    resolved = Path(path).expanduser()
    return resolved if resolved.is_absolute() or data_root is None else Path(data_root) / resolved
