"""User-facing errors: each carries one paragraph that says what is wrong, what is allowed
and how to fix it. The CLI prints the paragraph and exits with code 2 (no traceback)."""

from __future__ import annotations

import errno
from pathlib import Path


class RaysimError(Exception):
    """Base class of errors caused by the user's input rather than by a bug."""

    exit_code = 2


class ConfigError(RaysimError):
    """An experiment configuration field is invalid or a partition cannot be made from it."""


class DataError(RaysimError):
    """A dataset file is missing, corrupt or cannot be downloaded."""


class MissingDataError(DataError):
    """A dataset file is absent (and downloading is off or failed); ``raysim validate`` skips
    the data checks then, while a file that is present but broken is an error."""


def field_error(field: str, value: object, allowed: str, fix: str | None = None) -> ConfigError:
    """Build a :class:`ConfigError` naming the field, the offending value and what is allowed."""
    message = f"Invalid config field `{field}` = {value!r}: {allowed}."
    if fix:
        message += f" {fix}"
    else:
        message += f" Fix it in the YAML file or override it with `--set {field}=...`."
    return ConfigError(message)


class RunError(RaysimError):
    """A run stopped for a reason its results explain (diverged, lost its workers); the rows
    written so far are kept."""

    exit_code = 1


class DivergenceError(RunError):
    """Training produced non-finite losses or predictions."""


class WorkerFailureError(RunError):
    """Worker actors died more often than ``engine.max_worker_failures`` allows."""


class RunInterrupted(KeyboardInterrupt):
    """The user interrupted an invocation (Ctrl-C); ``root`` holds its results (empty when
    the interruption came during start-up, before any run had started: nothing was written)."""

    def __init__(self, root: str):
        super().__init__(root)
        self.root = root


class ResultsNotWritable(RaysimError):
    """A results file could not be written because of the disk (full, over quota, read-only,
    no permission), not because of a bug; what was written before it is intact."""


DISK_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
               errno.EROFS: "the file system is read-only",
               errno.EACCES: "permission is denied", errno.EPERM: "permission is denied"}
"""The errors of a disk rather than of raysim, with what each means for the user."""


def not_writable(path: Path | str, error: BaseException, recovery: str
                 ) -> ResultsNotWritable | None:
    """The one-paragraph error for ``error`` raised while writing ``path`` when it is a disk's
    (:data:`DISK_ERRNOS`), else None; ``recovery`` says how to get what was not written."""
    reason = DISK_ERRNOS.get(getattr(error, "errno", None) or -1)
    if reason is None:
        return None
    return ResultsNotWritable(
        f"Cannot write {path}: {reason} ({error.strerror if isinstance(error, OSError) else error}"
        f"). Everything written before it is intact and no partial file was left. Free space "
        f"(or make the directory writable, or choose another with --output), then {recovery}")
