"""What ``--resume`` may continue, decided from the files of a run root before Ray starts.

A run root is ``<output>/<name>-<timestamp>/`` holding ``invocation.json`` and the runs
``[<variant>/]seed_<s>/manifest.json``. Resuming one continues exactly its runs: the same
config (only ``engine`` settings and the output directory may change), the same seeds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raysim.configuration.experiment import ExperimentConfig, validated_config
from raysim.errors import ConfigError
from raysim.results.load import load
from raysim.results.manifest import INVOCATION, MANIFEST, read_manifest
from raysim.rounds.checkpoint import (
    CHECKPOINT_FILE,
    CHECKPOINT_FORMAT,
    check_checkpoint,
    incompatible_checkpoint,
)

RESUME_MAY_CHANGE = ("engine", "output", "logging")
"""Config sections that may differ between a run and its resumption (how it runs, where its
results and live metrics go; not what it computes)."""

FINISHED = ("completed", "stopped")
"""Manifest statuses of runs that reached their end (``stopped``: by the privacy budget)."""


def run_directory(root: Path, label: str, seed: int) -> Path:
    """Where the run of ``seed`` of the experiment ``label`` ("": unlabelled) lives."""
    return root / label / f"seed_{seed}" if label else root / f"seed_{seed}"


def is_run_root(path: Path) -> bool:
    """Whether ``path`` holds a raysim invocation's runs: its ``invocation.json``, or runs
    ``seed_<s>/`` or ``<variant>/seed_<s>/`` of its own (a directory whose children are run
    roots, such as ``results/``, is a results parent, not a root)."""
    if (path / INVOCATION).is_file() or any(path.glob(f"seed_*/{MANIFEST}")):
        return True
    return any(not (manifest.parent.parent / INVOCATION).is_file()
               for manifest in path.glob(f"*/seed_*/{MANIFEST}"))


def check_run_root(root: str | Path) -> None:
    """Refuse to resume a directory that is not a raysim run root (empty, a results parent
    holding run roots, or any other directory): resuming it would start new runs there."""
    path = Path(root)
    if is_run_root(path):
        return
    inside = sorted((child for child in path.iterdir() if child.is_dir() and is_run_root(child)),
                    key=lambda child: (child.stat().st_mtime, child.name))
    if inside:
        named = ", ".join(str(child) for child in inside[-3:][::-1])
        raise ConfigError(
            f"Cannot resume {str(path)!r}: it holds run roots, not runs (did you mean "
            f"{str(inside[-1])!r}?). Pass one run root (the newest here: {named}), or --resume "
            "alone for the latest run of this config; nothing was written.")
    what = "it is empty" if not any(path.iterdir()) else "it holds no run manifest"
    raise ConfigError(
        f"Cannot resume {str(path)!r}: {what}, so it is not a raysim run root (one holds "
        f"{INVOCATION} and [<variant>/]seed_<s>/{MANIFEST}). Pass the results directory that "
        "`raysim run` printed (results/<name>-<timestamp>), or --resume alone for the latest "
        "run of this config; nothing was written.")


def stored_config_change(run_dir: Path, config: ExperimentConfig) -> list[str]:
    """The config sections (other than :data:`RESUME_MAY_CHANGE`) in which ``config`` differs
    from the one ``run_dir`` was run with."""
    stored = read_manifest(run_dir)["config"]
    with contextlib.suppress(ConfigError, ValueError):  # newer fields compare at defaults
        stored = validated_config(stored).model_dump(mode="json")  # imports nothing
    now = config.model_dump(mode="json")
    return sorted(key for key in now.keys() | stored.keys()
                  if key not in RESUME_MAY_CHANGE and stored.get(key) != now.get(key))


def check_same_config(run_dir: Path, config: ExperimentConfig) -> None:
    """Refuse to resume ``run_dir`` with a config that differs from the one it was run with
    (outside :data:`RESUME_MAY_CHANGE`; the seed list included)."""
    changed = stored_config_change(run_dir, config)
    if changed:
        raise ConfigError(
            f"Cannot resume {run_dir}: it was run with a different config (sections "
            f"{', '.join(changed)} differ). Resume with the same config, seeds and --set "
            "overrides as the original run (only the engine, output and logging sections may "
            "change), or start a new run without --resume; nothing was written.")


def unfinished_runs(experiments: Mapping[str, ExperimentConfig], root: str | Path
                    ) -> list[tuple[str, int]]:
    """The runs of ``experiments`` under ``root`` that have not reached their end (missing,
    interrupted or failed). Raises ConfigError, before anything starts, when a run there was
    made from a different config or seed list, or holds a checkpoint of another format."""
    check_stored_runs(experiments, Path(root))
    unfinished = []
    for label, config in experiments.items():
        for seed in config.seeds:
            run_dir = run_directory(Path(root), label, seed)
            if not (run_dir / MANIFEST).is_file():
                unfinished.append((label, seed))
                continue
            check_same_config(run_dir, config)
            manifest = read_manifest(run_dir)
            if manifest.get("status") not in FINISHED:
                if (run_dir / CHECKPOINT_FILE).is_file() and \
                        manifest.get("checkpoint_format") != CHECKPOINT_FORMAT:
                    raise incompatible_checkpoint(run_dir / CHECKPOINT_FILE)
                check_checkpoint(run_dir)
                unfinished.append((label, seed))
    return unfinished


def stored_runs(root: Path) -> dict[str, list[Path]]:
    """The run directories with a manifest under ``root``, by experiment label ("" for the
    layout without variants)."""
    found: dict[str, list[Path]] = {}
    for manifest in sorted(root.glob(f"seed_*/{MANIFEST}")):
        found.setdefault("", []).append(manifest.parent)
    for manifest in sorted(root.glob(f"*/seed_*/{MANIFEST}")):
        found.setdefault(manifest.parent.parent.name, []).append(manifest.parent)
    return found


def check_stored_runs(experiments: Mapping[str, ExperimentConfig], root: Path) -> None:
    """Refuse to resume ``root`` when any run already there, whatever its seed, was made from
    another config (or seed list), or belongs to an experiment the resumed config does not
    define: its results would be mixed with this config's as one experiment."""
    for label, run_dirs in stored_runs(root).items():
        if label not in experiments:
            defined = ", ".join(repr(name) for name in experiments if name) or "no variants"
            held = f"variant {label!r}" if label else "runs without variants"
            raise ConfigError(
                f"Cannot resume {root}: it holds {held} ({run_dirs[0]}), which the config "
                f"being resumed does not define (it defines {defined}). Resume with the "
                "config and --variant options of the original run, or start a new run without "
                "--resume; nothing was written.")
        for run_dir in run_dirs:
            check_same_config(run_dir, experiments[label])


def latest_run_root(config: ExperimentConfig, output: str | None) -> Path:
    """The most recent ``<output>/<name>-<timestamp>`` directory (for ``--resume``)."""
    parent = Path(output or config.output)
    roots = sorted((p for p in parent.glob(f"{config.name}-*") if p.is_dir()),
                   key=lambda p: p.stat().st_mtime)
    if not roots:
        raise ConfigError(
            f"Nothing to resume: no earlier run of experiment {config.name!r} under "
            f"{str(parent)!r}. Pass the run directory (`--resume results/<name>-<timestamp>`), "
            "the --output of the original run, or start without --resume."
        )
    return roots[-1]


def new_run_root(config: ExperimentConfig, output: str | None) -> Path:
    """A fresh directory ``<output>/<name>-<timestamp>`` (never overwrites earlier results)."""
    parent = Path(output or config.output)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = parent / f"{config.name}-{stamp}"
    suffix = 1
    while root.exists():
        root = parent / f"{config.name}-{stamp}-{suffix}"
        suffix += 1
    check_writable(parent)
    return root


def check_output(config: ExperimentConfig, output: str | None) -> None:
    """Refuse an output directory (``output`` or the config's) that cannot be written."""
    check_writable(Path(output or config.output))


def check_writable(parent: Path) -> None:
    """Refuse an output directory that cannot be created or written, before Ray starts."""
    import tempfile

    try:
        parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".raysim-write-check-"):
            pass
    except OSError as error:
        raise ConfigError(
            f"Invalid output directory {str(parent)!r}: it cannot be written "
            f"({error.strerror or error}). Results go to <output>/<name>-<timestamp>/; pass a "
            "writable directory with `--output DIR` (or set `output:` in the config)."
        ) from None


def completed_run(run_dir: Path, config: ExperimentConfig) -> dict[str, Any] | None:
    """For a run directory from an earlier invocation: its final rounds row if it reached its
    end, None if it must (re)start. Raises ConfigError if it was made from a different config."""
    if not (run_dir / MANIFEST).is_file():
        return None
    check_same_config(run_dir, config)
    if read_manifest(run_dir).get("status") not in FINISHED:
        return None
    rounds = load(run_dir, "rounds")
    return rounds.iloc[-1].to_dict() if not rounds.empty else {}


__all__ = ["FINISHED", "INVOCATION", "RESUME_MAY_CHANGE", "check_output", "check_run_root",
           "check_same_config", "check_stored_runs", "check_writable", "completed_run", "is_run_root",
           "latest_run_root", "new_run_root", "run_directory", "stored_config_change",
           "unfinished_runs"]
