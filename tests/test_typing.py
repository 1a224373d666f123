"""The package type-checks clean under mypy with the pydantic plugin (configured in
pyproject.toml), so the typed contracts (``Algorithm[Params, State]``, the round loop's
``Workers`` and ``Sink`` protocols) are checked on every CI run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_package_type_checks_clean(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")
    result = subprocess.run(  # its cache in the test's directory, not in the checkout
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy_cache"), "raysim"],
        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
