"""Plug-ins: a researcher's own methods, models and datasets in their own modules.

A plug-in is an importable Python module that registers what it brings with
:func:`raysim.algorithms.base.register_algorithm`, :func:`raysim.models.registry.register_model`
or :func:`raysim.data.registry.register_dataset` when it is imported. A config names the modules
to import (``plugins: [my_lab.fedfoo]``), or the command line does (``--plugin my_lab.fedfoo``,
added to the config's list and recorded with the runs, so that a resume and ``raysim report``
import them again). They are imported before the config is validated, so the names they
register are valid config names everywhere a shipped name is.

A module is looked up on Python's import path, then in the current directory, then in the
directory of the config file naming it. Ray's worker processes on this machine see the same
path; on a cluster, the modules travel to every node with the job (see
:func:`plugin_sources`).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from raysim.errors import ConfigError

_LOADED: dict[str, ModuleType] = {}


def load_plugins(names: Sequence[str], near: Path | None = None) -> list[ModuleType]:
    """Import every named plug-in module once (its registrations run on import); ``near``:
    the config file's directory, searched after the import path and the current directory.
    Raises :class:`ConfigError` naming the module, the problem and the fix."""
    modules = []
    for name in names:
        if name not in _LOADED:
            _LOADED[name] = _import(name, near)
        modules.append(_LOADED[name])
    return modules


def _import(name: str, near: Path | None) -> ModuleType:
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ConfigError(
            f"Invalid config field `plugins` entry {name!r}: a plug-in is named by its dotted "
            "module name (e.g. `my_lab.fedfoo`), not a file path. Put the module on the "
            "import path, in the current directory or beside the config, and name it.")
    searched = [str(Path.cwd())] + ([str(near.resolve())] if near is not None else [])
    for extra in [None, *searched]:
        if extra is not None and extra not in sys.path:
            sys.path.append(extra)
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not name.startswith(error.name):
                raise _failed(name, error) from None  # the plug-in's own import is missing
        except Exception as error:  # the plug-in's own code failed while importing
            raise _failed(name, error) from None
    raise ConfigError(
        f"Cannot import the plug-in module {name!r} named by `plugins` (or `--plugin`): it is "
        f"on neither Python's import path nor in {' or '.join(searched)}. Install it, add its "
        "directory to PYTHONPATH, or put it beside the config file; `python -c \"import "
        f"{name}\"` shows whether Python finds it.")


def _failed(name: str, error: BaseException) -> ConfigError:
    return ConfigError(
        f"The plug-in module {name!r} failed while being imported: {type(error).__name__}: "
        f"{error}. Fix the module (`python -c \"import {name}\"` shows the traceback) or "
        "remove it from `plugins`.")


def plugin_sources(names: Sequence[str]) -> list[str]:
    """The directories (packages) or files (single modules) of the top-level modules of the
    named plug-ins, for Ray's ``runtime_env={"py_modules": ...}`` on a cluster whose nodes do
    not share this machine's files. Plug-ins that are installed packages of the environment
    are shipped the same way (Ray packs their source)."""
    sources: list[str] = []
    for name in names:
        source = _top_source(name)
        if source is not None and str(source) not in sources:
            sources.append(str(source))
    return sources


def plugin_directories(names: Sequence[str]) -> list[str]:
    """The directories to put on ``PYTHONPATH`` of Ray's worker processes on this machine so
    that they import the named plug-ins as this process did."""
    directories: list[str] = []
    for name in names:
        source = _top_source(name)
        if source is not None and str(source.parent) not in directories:
            directories.append(str(source.parent))
    return directories


def _top_source(name: str) -> Path | None:
    """The file (a module) or directory (a package) of a plug-in's top-level module."""
    top = name.split(".")[0]
    module = sys.modules.get(top) or importlib.import_module(top)
    path = getattr(module, "__file__", None)
    if path is None:
        return None  # a namespace package: nothing to pack
    return Path(path).parent if Path(path).name == "__init__.py" else Path(path)
