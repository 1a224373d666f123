"""The package type-checks clean under mypy with the pydantic plugin (configured in
pyproject.toml), so the typed contracts (``Algorithm[Params, State]``, the round loop's
``Workers`` and ``Sink`` protocols) are checked on every CI run. The check itself starts in the
background when the suite is collected (``background_mypy``)."""

from __future__ import annotations

import background_mypy
import pytest


def test_package_type_checks_clean():
    pytest.importorskip("mypy", reason="mypy is in the dev extra: pip install -e '.[dev]'")
    code, output = background_mypy.result()
    assert code == 0, output[-6000:]
