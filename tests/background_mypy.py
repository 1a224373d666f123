"""The package's type check, started in the background as soon as the suite has collected
``tests/test_typing.py``: mypy's CPU-bound minute runs at the lowest priority beside the tests
that wait on Ray's processes, and the test only reads its result (it runs mypy itself when
nothing was started)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAIT_SECONDS = 900
"""The longest a test waits for the background check (mypy takes about 40 s on 2 CPUs)."""

_started: tuple[subprocess.Popen[bytes], Path] | None = None


def _lowest_priority() -> None:
    os.nice(19)


def start() -> None:
    """Start ``mypy raysim`` (its cache and output in a temporary directory) unless mypy is
    not installed or a check already runs."""
    global _started
    if _started is not None or importlib.util.find_spec("mypy") is None:
        return
    directory = Path(tempfile.mkdtemp(prefix="raysim-test-mypy-"))
    with (directory / "output.txt").open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "mypy", "--cache-dir", str(directory / "cache"), "raysim"],
            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, preexec_fn=_lowest_priority)
    _started = process, directory


def result() -> tuple[int, str]:
    """mypy's exit status and output: the background check's (waiting at most
    :data:`WAIT_SECONDS` for it), or a check run now when none was started."""
    if _started is None:
        start()
    assert _started is not None
    process, directory = _started
    try:
        code = process.wait(timeout=WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        stop()
        raise AssertionError(f"mypy did not finish within {WAIT_SECONDS} s") from None
    return code, (directory / "output.txt").read_text(errors="replace")


def stop() -> None:
    """End a check still running and remove its directory."""
    global _started
    if _started is None:
        return
    process, directory = _started
    if process.poll() is None:
        process.kill()
        process.wait(timeout=30)
    shutil.rmtree(directory, ignore_errors=True)
    _started = None
