"""raysim's bytecode cache for environments that keep no compiled bytecode
(:mod:`raysim.engine.launch.bytecode`)."""

from __future__ import annotations

import importlib.util
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

from raysim.engine.launch import bytecode
from raysim.engine.launch.warm_cluster import raylet_environment

REPOSITORY = Path(__file__).resolve().parents[1]


def _package(root: Path, name: str) -> Path:
    """A package ``name`` under ``root`` with no bytecode; returns its source."""
    source = root / name / "__init__.py"
    source.parent.mkdir(parents=True)
    source.write_text("VALUE = 42\n")
    return source


def test_an_environment_that_keeps_no_bytecode_is_recognised(tmp_path, monkeypatch):
    """No bytecode beside the source and Python told not to write it: recognised. Bytecode
    beside the source, a prefix of the user's, or a Python that writes it: not."""
    source = _package(tmp_path, "raysim_probe_a")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert bytecode.keeps_no_bytecode("raysim_probe_a")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "theirs"))
    assert not bytecode.keeps_no_bytecode("raysim_probe_a")
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # Python writes it itself
    assert not bytecode.keeps_no_bytecode("raysim_probe_a")
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert not bytecode.keeps_no_bytecode("raysim_probe_a")
    assert not bytecode.keeps_no_bytecode("raysim_no_such_module")


def test_raysims_processes_keep_bytecode_in_its_cache_where_the_environment_keeps_none(
        tmp_path):
    """A command in an environment that keeps no bytecode (PYTHONDONTWRITEBYTECODE, none
    beside the sources) writes the bytecode of what it imports into raysim's cache, never
    beside the sources; the processes it starts (Ray's) inherit the setting and read it
    there. Where bytecode is beside the sources, nothing changes."""
    packages = tmp_path / "site"
    source = _package(packages, "raysim_probe_b")
    cache = tmp_path / "cache"
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "RAYSIM_CACHE": str(cache),
                   "PYTHONPATH": os.pathsep.join([str(packages), str(REPOSITORY)])}
    environment.pop("PYTHONPYCACHEPREFIX", None)
    program = """if True:
        import json, subprocess, sys
        from raysim.engine.launch.bytecode import use_cached_bytecode
        used = use_cached_bytecode("raysim_probe_b")
        import raysim_probe_b
        child = subprocess.run([sys.executable, "-c", "import sys, raysim_probe_b; "
                                "print(sys.pycache_prefix, sys.dont_write_bytecode)"],
                               capture_output=True, text=True, check=True).stdout.split()
        print(json.dumps({"used": used, "cached": raysim_probe_b.__cached__,
                          "child": child}))
    """

    def command() -> dict:
        done = subprocess.run([sys.executable, "-c", program], env=environment,
                              capture_output=True, text=True, check=True)
        return json.loads(done.stdout.splitlines()[-1])

    first = command()
    prefix = cache / "bytecode"
    assert first["used"] and Path(first["cached"]).is_relative_to(prefix)
    assert Path(first["cached"]).is_file()  # written by the command's own import
    assert first["child"] == [str(prefix), "False"]
    assert not (source.parent / "__pycache__").exists()
    # bytecode beside the sources (as pip installs it): no prefix, nothing in the cache
    py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    for written in prefix.rglob("*.pyc"):
        written.unlink()
    second = command()
    assert not second["used"] and second["child"] == ["None", "True"]
    assert not list(prefix.rglob("*.pyc"))


def test_a_raysim_ray_gets_the_bytecode_cache_where_the_environment_keeps_none(
        tmp_path, monkeypatch):
    """The raylet (and so every worker process and driver host of a local Ray or the warm
    cluster) runs with raysim's bytecode prefix where torch has no bytecode, and without one
    where it has."""
    monkeypatch.setenv("RAYSIM_CACHE", str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(bytecode, "keeps_no_bytecode", lambda module="torch": True)
    settings = raylet_environment()
    assert settings["PYTHONPYCACHEPREFIX"] == str(tmp_path / "bytecode")
    assert settings["PYTHONDONTWRITEBYTECODE"] == ""
    monkeypatch.setattr(bytecode, "keeps_no_bytecode", lambda module="torch": False)
    assert "PYTHONPYCACHEPREFIX" not in raylet_environment()
