"""The run manifest: config, seed, package versions, git commit, status."""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from raysim.errors import ResultsNotWritable, not_writable
from raysim.results.atomic import discard

MANIFEST = "manifest.json"
INVOCATION = "invocation.json"
"""The options of the command that created a run root (``--resume`` reuses them)."""
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


def run_root(run_dir: Path) -> Path:
    """The run root holding ``run_dir``: its parent, or for a variant's run
    (``<root>/<variant>/seed_<s>``) its parent's parent."""
    root = run_dir.parent
    if not (root / INVOCATION).is_file() and (root.parent / INVOCATION).is_file():
        return root.parent
    return root


def resume_hint(run_dir: Path) -> str:
    """How to continue the run in ``run_dir`` after a results file could not be written."""
    return (f"continue with `raysim run CONFIG --resume {run_root(run_dir)}`: the run restarts from its "
            "last checkpoint and recomputes the rounds after it.")


def write_manifest(run_dir: Path, manifest: dict[str, Any]) -> None:
    """Atomically (re)write ``run_dir/manifest.json`` (a temporary file beside it, then a
    rename). On a full disk, where the temporary file finds no room, the manifest is rewritten
    in place when the new text, indented or else compact, fits in the blocks the old one holds
    (a run's status must say what happened to it, and freeing the old text's blocks makes that
    room); otherwise, and on a read-only or forbidden directory, :class:`ResultsNotWritable`
    names the file."""
    text = json.dumps(manifest, indent=2, default=str).encode()
    final, temporary = run_dir / MANIFEST, run_dir / f".{MANIFEST}.tmp"
    try:
        temporary.write_bytes(text)
        os.replace(temporary, final)
    except OSError as error:
        discard(temporary)
        if error.errno in (errno.ENOSPC, errno.EDQUOT) and (
                _rewrite_in_place(final, text) or _rewrite_in_place(
                    final, json.dumps(manifest, separators=(",", ":"), default=str).encode())):
            return
        raise not_writable(final, error, resume_hint(run_dir)) or error from None


def _rewrite_in_place(path: Path, text: bytes) -> bool:
    """Overwrite ``path`` with ``text`` inside the blocks it holds; False when it would need
    more (nothing is changed then) or the file cannot be opened."""
    try:
        descriptor = os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if len(text) > os.fstat(descriptor).st_blocks * 512:
            return False
        os.pwrite(descriptor, text, 0)
        os.ftruncate(descriptor, len(text))
        os.fsync(descriptor)
        return True
    except OSError:
        return False
    finally:
        os.close(descriptor)


def read_manifest(run_dir: Path) -> dict[str, Any]:
    """Read ``run_dir/manifest.json``."""
    return json.loads((run_dir / MANIFEST).read_text())


def update_manifest(run_dir: Path, **fields: Any) -> None:
    """Merge fields into an existing manifest."""
    manifest = read_manifest(run_dir)
    manifest.update(fields)
    write_manifest(run_dir, manifest)


__all__ = ["INVOCATION", "MANIFEST", "ResultsNotWritable", "git_commit", "package_versions",
           "read_manifest", "resume_hint", "run_root", "update_manifest", "write_manifest"]
