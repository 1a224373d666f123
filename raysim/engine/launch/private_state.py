"""Per-user state in a shared temporary folder (CPU-slot locks, the warm cluster's record),
kept where another user cannot redirect it.

``/tmp`` is writable by every user of a machine: a file raysim opens there by name could be a
link planted by someone else to a file of yours (which a plain ``open(..., "wb")`` would
truncate), and a directory there could be someone else's. So raysim's state directories are
created with owner-only permissions and used only when they are real directories owned by
the user, and the files in them are opened without following links and used only when they
are regular files owned by the user. Anything else is refused with one paragraph.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from raysim.errors import RaysimError


def private_directory(path: Path, variable: str) -> Path:
    """``path`` as an existing directory owned by this user with owner-only permissions
    (created so, with its parents, when missing); refuses a link, a non-directory or another
    user's directory. ``variable``: the environment variable that moves it (for the
    refusal)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        status = os.lstat(path)
    except OSError as error:
        raise _refusal(path, f"unreadable ({error.strerror})", variable) from None
    if stat.S_ISLNK(status.st_mode):
        raise _refusal(path, "a symbolic link", variable)
    if not stat.S_ISDIR(status.st_mode):
        raise _refusal(path, "not a directory", variable)
    if status.st_uid != os.getuid():
        raise _refusal(path, f"owned by another user (uid {status.st_uid})", variable)
    if status.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours, but open to others: close it
    return path


def open_private_file(path: Path, variable: str, *, create: bool = True) -> int:
    """A read-write descriptor of the regular file ``path`` owned by this user (created with
    owner-only permissions when ``create``), opened without following a link and without
    truncating it; refuses anything else."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        descriptor = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == getattr(os, "ELOOP", 40) or os.path.islink(path):
            raise _refusal(path, "a symbolic link", variable) from None
        raise
    status = os.fstat(descriptor)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid():
        os.close(descriptor)
        what = ("not a regular file" if not stat.S_ISREG(status.st_mode)
                else f"owned by another user (uid {status.st_uid})")
        raise _refusal(path, what, variable)
    return descriptor


def read_private_text(path: Path, variable: str) -> str | None:
    """The text of ``path`` if it exists (None otherwise), refused unless it is a regular
    file owned by this user."""
    try:
        descriptor = open_private_file(path, variable, create=False)
    except FileNotFoundError:
        return None
    with os.fdopen(descriptor, "r", encoding="utf-8") as file:
        return file.read()


def write_private_text(path: Path, text: str, variable: str) -> None:
    """Replace ``path`` with ``text`` atomically: a new owner-only file beside it (refused if
    something is already there), then a rename over it."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    descriptor = os.open(temporary, flags, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)


def _refusal(path: Path, what: str, variable: str) -> RaysimError:
    return RaysimError(
        f"Cannot use {path}: it is {what}. raysim keeps per-user state there (CPU-slot locks, "
        "the warm cluster's record) and uses only a directory owned by you with owner-only "
        "permissions, holding regular files of yours, never links, so that another user of "
        f"this machine cannot redirect it. Remove it if it is yours, or set {variable} to a "
        "directory of your own.")


__all__ = ["open_private_file", "private_directory", "read_private_text", "write_private_text"]
