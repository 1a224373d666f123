"""The run manifest: config, seed, package versions, git commit, status."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_PACKAGES = ("raysim", "ray", "torch", "numpy", "pandas", "pyarrow", "medmnist", "scikit-learn")


def package_versions() -> dict[str, str]:
    """Installed versions of raysim and the libraries its numbers depend on."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def git_commit(start: Path | None = None) -> str | None:
    """The commit of the raysim checkout (or of ``start``), or None outside git."""
    directory = start or Path(__file__).resolve().parent
    try:
        output = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True,
                                text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return output.stdout.strip() or None


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Atomically (re)write ``run_dir/manifest.json``."""
    temporary = run_dir / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(temporary, run_dir / MANIFEST)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Read ``run_dir/manifest.json``."""
    return json.loads((run_dir / MANIFEST).read_text())


def update_manifest(run_dir: Path, **fields: Any) -> None:
    """Merge fields into an existing manifest."""
    manifest = read_manifest(run_dir)
    manifest.update(fields)
    write_manifest(run_dir, manifest)
