"""raysim's cache directory: remembered checksums of data files, the built-in datasets, and (where
the environment keeps none) compiled bytecode."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``RAYSIM_CACHE`` when set, else ``$XDG_CACHE_HOME/raysim`` (default ``~/.cache/raysim``)."""
    root = os.environ.get("RAYSIM_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "raysim"
