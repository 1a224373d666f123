"""Editing a copy of an authors' code for the fidelity harness: every edit replaces one exact
text, which must occur exactly once, so that a changed upstream file is refused rather than
silently mis-edited."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


class EditFailed(RuntimeError):
    """The authors' file no longer holds a text an edit replaces."""


def apply_edits(work: Path, edits: Mapping[str, Sequence[tuple[str, str]]]) -> None:
    """Apply ``edits`` ({file relative to ``work``: [(old, new), ...]}) in place, each ``old``
    exactly once."""
    for name, pairs in edits.items():
        target = work / name
        text = target.read_text()
        for old, new in pairs:
            if text.count(old) != 1:
                raise EditFailed(f"{name}: expected the text {old.strip()!r} exactly once, "
                                 f"found it {text.count(old)} times; the authors' file changed")
            text = text.replace(old, new)
        target.write_text(text)
