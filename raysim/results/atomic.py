"""Files of a results directory written whole or not at all: under a temporary name beside the
final one, then renamed; a disk's error (full, read-only, forbidden) removes the temporary file
and becomes one paragraph naming the file (:class:`raysim.errors.ResultsNotWritable`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from raysim.errors import not_writable


def write_atomically(path: Path, write: Callable[[Path], object], recovery: str) -> Path:
    """Call ``write(temporary)`` to fill a temporary file beside ``path``, then rename it to
    ``path``; on an error nothing is left but what was there before. ``recovery``: how the
    user gets the file once the disk allows (the end of the error's paragraph)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(temporary)
        os.replace(temporary, path)
    except BaseException as error:
        discard(temporary)
        if isinstance(error, OSError):
            raise not_writable(path, error, recovery) or error from None
        raise
    return path


def discard(temporary: Path) -> None:
    """Remove a temporary file if it is there; a disk that refuses even that (read-only,
    forbidden) leaves nothing to remove or cannot be helped, and must not hide the error that
    brought us here."""
    with contextlib.suppress(OSError):
        temporary.unlink(missing_ok=True)


__all__ = ["discard", "write_atomically"]
