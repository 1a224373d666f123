"""Registries that load on first use (PEP 562), so that importing a package's torch-free
parts (e.g. config parameters) does not import the modules that fill its registry."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any


def lazy_exports(package: str, modules: Sequence[str], source: str,
                 exports: Sequence[str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: on first use of one of ``exports`` it imports
    ``modules`` (which register themselves), then binds every export from ``package.source``
    in the package's namespace (later uses no longer go through it)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        for module in modules:
            importlib.import_module(f"{package}.{module}")
        loaded = importlib.import_module(f"{package}.{source}")
        namespace = vars(sys.modules[package])
        for exported in exports:
            namespace[exported] = getattr(loaded, exported)
        return namespace[name]

    return __getattr__
