"""The repository speaks of raysim only: no development history (issue or session numbers, how
the work was organised, what hardware the work ran on) in tracked text or file names, and no
references to files outside the repository. History lives in git."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DIARY = re.compile(
    r"\bissues?\s*#?\d+"              # the word for a work item, then its number
    r"|#\d+'s\b"                      # #13's section
    r"|\bsessions?[\s-]+\d+"          # the word for a working session, then its number
    r"|\bthis task\b|\blent\b|\bborrowed machine"
    r"|\.\./shared\b",                # files beside the checkout, not in it
    re.IGNORECASE)
"""What a diary leaves behind. Legitimate text it does not match: a paper's "Table 3", a pytest
or process session ("test session", "its own session")."""

NAME = re.compile(r"session|issue", re.IGNORECASE)


def _tracked() -> list[Path]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in listed.decode().split("\0") if name]


def test_no_development_history_in_tracked_text():
    found = []
    for path in _tracked():
        if path.name == Path(__file__).name or path.suffix in (".png", ".parquet", ".npz"):
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            match = DIARY.search(line)
            if match:
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "development history in the repository:\n" + "\n".join(found[:30])


def test_no_development_history_in_file_names():
    named = [str(p.relative_to(ROOT)) for p in _tracked() if NAME.search(str(p.relative_to(ROOT)))]
    assert not named, f"file names that carry the development process: {named[:20]}"


def test_the_patterns_catch_a_diary_and_spare_ordinary_text():
    item, sitting = "is" + "sue", "ses" + "sion"  # (spelt apart: this file passes its own test)
    for diary in (f"measured in {sitting} 29", f"{item} #32's target", f"({item} 14, speed)",
                  f"the {sitting}-25 tree", "no GPU in this task", "../shared/data/medmnist"):
        assert DIARY.search(diary), diary
    for fine in ("the paper's Table 3", "the runs of a test session", "in its own session",
                 "start_new_session=True", "an issue with BatchNorm"):
        assert not DIARY.search(fine), fine
