"""Compiled bytecode kept in raysim's cache, for Python environments that keep none.

Python compiles a module's source to bytecode when it imports it, and normally keeps the result
beside the source (``__pycache__``) for the next process. Some environments keep none: packages
installed without compiling them (``uv``'s default, ``pip install --no-compile``) into an image
that is read-only or has ``PYTHONDONTWRITEBYTECODE`` set (a common container setting). There
every process compiles every module it imports, every time: on a GPU machine with such an
image a fresh process took about 4 s to import torch and as long again for ``torch._dynamo``,
and with this cache filled a cold command reached its first round in about half the time.

When torch has no bytecode beside its source and Python would not write any there, raysim's
processes (the command's own, and its Ray's: worker processes, driver hosts, the warm
cluster's) keep their bytecode in raysim's cache instead (``PYTHONPYCACHEPREFIX`` =
``<cache>/bytecode``, with writing allowed for them alone): the first command compiles and
writes it, later commands read it. Nothing is written beside the packages' sources; nothing
changes where the bytecode is there already or the user chose a prefix. Python checks each
cached file against its source's size and modification time, so an upgraded package is
compiled again.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from raysim.cache import cache_root

PREFIX_VARIABLE = "PYTHONPYCACHEPREFIX"
NO_WRITE_VARIABLE = "PYTHONDONTWRITEBYTECODE"
PROBE_MODULE = "torch"
"""The import whose bytecode decides: the largest of every raysim process's imports."""


def bytecode_prefix() -> Path:
    """Where raysim's processes keep bytecode when the environment keeps none."""
    return cache_root() / "bytecode"


def keeps_no_bytecode(module: str = PROBE_MODULE) -> bool:
    """Whether importing ``module`` compiles its source in every process: no bytecode beside
    the source, and this interpreter would not write it there (``PYTHONDONTWRITEBYTECODE``,
    or a folder it cannot write). False where the user set a bytecode prefix of their own, or
    the module is not a Python source (not found, built in, a compiled-only install)."""
    if sys.pycache_prefix is not None:
        return False
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    if not origin or not origin.endswith(".py"):
        return False
    cached = Path(importlib.util.cache_from_source(origin))
    if cached.exists():
        return False
    folder = cached.parent if cached.parent.exists() else Path(origin).parent
    return sys.dont_write_bytecode or not os.access(folder, os.W_OK)


def bytecode_settings(module: str = PROBE_MODULE) -> dict[str, str]:
    """The environment raysim's processes run with: its cache as their bytecode prefix, with
    writing allowed, where the environment keeps no bytecode for ``module``
    (:func:`keeps_no_bytecode`), or this process already uses raysim's prefix; else nothing."""
    prefix = str(bytecode_prefix())
    if sys.pycache_prefix == prefix or keeps_no_bytecode(module):
        return {PREFIX_VARIABLE: prefix, NO_WRITE_VARIABLE: ""}
    return {}


def use_cached_bytecode(module: str = PROBE_MODULE) -> bool:
    """For a command's own process, before it imports torch: where the environment keeps no
    bytecode (for ``module``), keep this process's bytecode in raysim's cache and pass the
    setting on to every process it starts (Ray's among them). Returns whether it did."""
    settings = bytecode_settings(module)
    if not settings:
        return False
    os.environ.update(settings)
    sys.pycache_prefix = settings[PREFIX_VARIABLE]
    sys.dont_write_bytecode = False
    return True
